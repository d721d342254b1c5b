// The bulk data path's server (see bulk.hpp): the acceptor and a thread per connection, each
// answering frames from the node's chunk store.
#include "storage/bulk.hpp"
#include "storage/bulk_wire.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "storage/gc.hpp"

namespace shoal::storage {

// -- server -----------------------------------------------------------------------------------

struct bulk_server::impl : std::enable_shared_from_this<bulk_server::impl> {
  std::shared_ptr<chunk_store> store;
  bulk_server_options opts;
  uint64_t max_frame = 0;
  int listen_fd = -1;
  uint16_t port = 0;
  std::thread acceptor;
  std::mutex mu;
  std::condition_variable idle;
  std::set<int> conns;  // open connections, each served by its own thread
  bool stopping = false;

  // The reply, and for a get the chunk as the store read it (sent as the bin's body, no copy).
  bulk_reply handle(const parsed_request& r, std::vector<std::byte>& chunk) {
    bulk_reply out;
    out.id = r.id;
    auto fail = [&](const store_error& e) {
      out.status = static_cast<uint32_t>(e.code) + 1;
      out.message = to_string(e);
    };
    if (r.op == bulk_op::put) {
      auto p = put_collecting(*store, r.key, std::as_bytes(r.payload), *traffic_class_from_byte(r.traffic_class));
      if (!p) fail(p.error());
    } else {
      auto g = store->get(r.key);
      if (!g) fail(g.error());
      else chunk = std::move(*g);
    }
    return out;
  }

  void serve(int fd) {
    std::vector<uint8_t> body;
    std::vector<std::byte> chunk;
    for (;;) {
      uint8_t len[4];
      if (read_all(fd, std::as_writable_bytes(std::span(len))) != 0) break;
      uint32_t n = get_be32(len);
      std::expected<parsed_request, std::string> req = std::unexpected(std::string());
      if (n > max_frame) {
        req = std::unexpected("request frame of " + std::to_string(n) + " bytes is over the limit of " +
                              std::to_string(max_frame));
      } else {
        body.resize(n);
        if (read_all(fd, std::as_writable_bytes(std::span(body))) != 0) break;
        req = parse_request(body);
      }
      if (!req) {  // the stream cannot be trusted past a bad frame: say why, then close
        bulk_reply bad{0, bulk_invalid_request, req.error(), {}};
        auto head = encode_reply_head(bad, 0);
        send_frame(fd, head, {});
        break;
      }
      chunk.clear();
      bulk_reply rep = handle(*req, chunk);
      auto head = encode_reply_head(rep, chunk.size());
      if (!send_frame(fd, head, {reinterpret_cast<const uint8_t*>(chunk.data()), chunk.size()})) break;
    }
  }

  void accept_loop() {
    for (;;) {
      int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        std::lock_guard lock(mu);
        if (stopping) return;
        if (errno == EMFILE || errno == ENFILE) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          continue;
        }
        return;
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      {
        std::lock_guard lock(mu);
        if (stopping || static_cast<int>(conns.size()) >= opts.max_connections) {
          ::close(fd);
          continue;
        }
        conns.insert(fd);
      }
      std::thread([self = shared_from_this(), fd] {
        self->serve(fd);
        std::lock_guard lock(self->mu);
        self->conns.erase(fd);
        ::close(fd);
        self->idle.notify_all();
      }).detach();
    }
  }
};

bulk_server::bulk_server(std::shared_ptr<impl> p) : impl_(std::move(p)) {}

std::expected<std::unique_ptr<bulk_server>, std::string> bulk_server::start(std::shared_ptr<chunk_store> store,
                                                                             bulk_server_options o) {
  auto im = std::make_shared<impl>();
  im->store = std::move(store);
  im->opts = o;
  im->max_frame = o.max_frame_bytes ? o.max_frame_bytes : im->store->options().max_chunk_bytes + 1024;
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  std::string port = std::to_string(o.port);
  if (int rc = ::getaddrinfo(o.host.c_str(), port.c_str(), &hints, &res); rc != 0)
    return std::unexpected("bulk server: cannot resolve " + o.host + ": " + ::gai_strerror(rc));
  std::string why = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
      im->listen_fd = fd;
      sockaddr_storage bound{};
      socklen_t len = sizeof bound;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
      im->port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                   : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
      break;
    }
    why = errno_text(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (im->listen_fd < 0) return std::unexpected("bulk server: cannot listen on " + o.host + ":" + port + ": " + why);
  im->acceptor = std::thread([im] { im->accept_loop(); });
  return std::unique_ptr<bulk_server>(new bulk_server(std::move(im)));
}

bulk_server::~bulk_server() {
  auto& im = *impl_;
  {
    std::lock_guard lock(im.mu);
    im.stopping = true;
    for (int fd : im.conns) ::shutdown(fd, SHUT_RDWR);  // their threads see EOF and end
  }
  ::shutdown(im.listen_fd, SHUT_RDWR);  // wakes accept
  im.acceptor.join();
  ::close(im.listen_fd);
  std::unique_lock lock(im.mu);
  im.idle.wait_for(lock, std::chrono::seconds(10), [&] { return im.conns.empty(); });
}

uint16_t bulk_server::port() const { return impl_->port; }

}  // namespace shoal::storage
