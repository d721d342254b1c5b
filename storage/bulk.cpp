// The bulk data path (see bulk.hpp): msgpack frames over TCP (runtime/base/msgpack_frame, the
// codec the expert-parallel frames use too), the server's threads, the client's connection
// pool and poll loop.
#include "storage/bulk.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "runtime/base/msgpack_frame.hpp"
#include "storage/gc.hpp"

namespace shoal::storage {

namespace {

constexpr std::string_view frame_magic = "shoal-kv";
constexpr uint64_t frame_version = 1;
constexpr uint32_t request_fields = 9, reply_fields = 4;
constexpr uint64_t max_reply_frame = 1ull << 30;

std::string errno_text(int e) { return std::strerror(e); }

void put_be32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}

uint32_t get_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Writes the 4-byte length, `head`, then `tail` (the bin body) from one gathered iovec, no
// copy; false on any error (errno set).
bool send_frame(int fd, std::span<const uint8_t> head, std::span<const uint8_t> tail) {
  uint8_t len[4];
  put_be32(len, static_cast<uint32_t>(head.size() + tail.size()));
  iovec iov[3] = {{len, 4}, {const_cast<uint8_t*>(head.data()), head.size()},
                  {const_cast<uint8_t*>(tail.data()), tail.size()}};
  int first = 0;
  while (first < 3) {
    msghdr msg{};
    msg.msg_iov = iov + first;
    msg.msg_iovlen = static_cast<size_t>(3 - first);
    ssize_t w = ::sendmsg(fd, &msg, MSG_NOSIGNAL);  // a peer gone is an error here, not a SIGPIPE
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return false;
    auto left = static_cast<size_t>(w);
    while (first < 3 && left >= iov[first].iov_len) left -= iov[first++].iov_len;
    if (first < 3) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  return true;
}

std::vector<uint8_t> encode_reply_head(const bulk_reply& r, size_t payload_bytes) {
  runtime::frame_sink s;
  runtime::frame_packer pk(s);
  pk.pack_array(reply_fields);
  pk.pack(r.id);
  pk.pack(static_cast<uint64_t>(r.status));
  pk.pack(r.message);
  pk.pack_bin(static_cast<uint32_t>(payload_bytes));
  return std::move(s.bytes);
}

}  // namespace

std::vector<uint8_t> encode_request_head(const bulk_request& r) {
  runtime::frame_sink s;
  runtime::frame_packer pk(s);
  pk.pack_array(request_fields);
  pk.pack(frame_magic);
  pk.pack(frame_version);
  pk.pack(std::string_view(r.op == bulk_op::put ? "put" : "get"));
  pk.pack(r.id);
  pk.pack(r.key.block.hi);
  pk.pack(r.key.block.lo);
  pk.pack(static_cast<uint64_t>(r.key.index));
  pk.pack(static_cast<uint64_t>(r.traffic_class));
  pk.pack_bin(static_cast<uint32_t>(r.payload.size()));
  return std::move(s.bytes);
}

std::vector<uint8_t> encode_reply(const bulk_reply& r) {
  auto out = encode_reply_head(r, r.payload.size());
  out.insert(out.end(), r.payload.begin(), r.payload.end());
  return out;
}

std::expected<parsed_request, std::string> parse_request(std::span<const uint8_t> body) {
  runtime::frame_fields f(body, request_fields, "request");
  auto magic = f.str(0, "magic");
  if (magic && *magic != frame_magic) f.fail("magic is not \"shoal-kv\"");
  auto version = f.uint(1, "version");
  if (version && *version != frame_version)
    f.fail("version " + std::to_string(*version) + " is not " + std::to_string(frame_version));
  auto op = f.str(2, "op");
  if (op && *op != "put" && *op != "get") f.fail("op \"" + std::string(*op) + "\" is not put or get");
  auto id = f.uint(3, "id");
  auto hi = f.uint(4, "key_hi");
  auto lo = f.uint(5, "key_lo");
  auto index = f.uint(6, "index");
  if (index && *index > 254) f.fail("chunk index " + std::to_string(*index) + " out of range [0, 254]");
  auto cls = f.uint(7, "traffic_class");
  if (cls && (*cls > 255 || !traffic_class_from_byte(static_cast<uint8_t>(*cls))))
    f.fail("traffic class " + std::to_string(*cls) + " is unknown");
  auto payload = f.bin(8, "payload");
  if (!f.ok()) return std::unexpected(f.error());
  bulk_op o = *op == "put" ? bulk_op::put : bulk_op::get;
  if (o == bulk_op::put && payload->empty()) return std::unexpected("request put carries an empty chunk");
  if (o == bulk_op::get && !payload->empty()) return std::unexpected("request get carries a payload");
  return parsed_request{o, *id, {runtime::block_key{.lo = *lo, .hi = *hi}, static_cast<uint8_t>(*index)}, static_cast<uint8_t>(*cls), *payload};
}

std::expected<bulk_reply, std::string> parse_reply(std::span<const uint8_t> body) {
  runtime::frame_fields f(body, reply_fields, "reply");
  auto id = f.uint(0, "id");
  auto status = f.uint(1, "status");
  auto message = f.str(2, "message");
  auto payload = f.bin(3, "payload");
  if (!f.ok()) return std::unexpected(f.error());
  if (*status > UINT32_MAX) return std::unexpected("reply status " + std::to_string(*status) + " out of range");
  return bulk_reply{*id, static_cast<uint32_t>(*status), std::string(*message), {payload->begin(), payload->end()}};
}

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

// -- client -----------------------------------------------------------------------------------

namespace {

std::string where(const bulk_endpoint& e) { return e.name + " (" + e.host + ":" + std::to_string(e.port) + ")"; }

std::expected<int, std::string> connect_to(const bulk_endpoint& e, std::chrono::milliseconds timeout) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  std::string port = std::to_string(e.port);
  if (int rc = ::getaddrinfo(e.host.c_str(), port.c_str(), &hints, &res); rc != 0)
    return std::unexpected(where(e) + ": cannot resolve: " + ::gai_strerror(rc));
  std::string why = "no address";
  int out = -1;
  for (addrinfo* a = res; a && out < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc < 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = ::poll(&p, 1, static_cast<int>(timeout.count()));
      int err = 0;
      socklen_t len = sizeof err;
      if (rc == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) rc = 0;
      else {
        errno = rc == 0 ? ETIMEDOUT : (err ? err : errno);
        rc = -1;
      }
    }
    if (rc == 0) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // blocking writes, polled reads
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      out = fd;
    } else {
      why = errno_text(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(res);
  if (out < 0) return std::unexpected(where(e) + ": cannot connect: " + why);
  return out;
}

}  // namespace

struct bulk_pool::impl {
  std::mutex mu;
  std::map<std::pair<std::string, uint16_t>, std::vector<bulk_connection>> idle;
};

bulk_pool::bulk_pool() : impl_(std::make_unique<impl>()) {}

bulk_pool::~bulk_pool() {
  for (auto& [k, cs] : impl_->idle)
    for (auto& c : cs) ::close(c.fd);
}

std::expected<bulk_connection, std::string> bulk_pool::take(const bulk_endpoint& e, std::chrono::milliseconds timeout) {
  {
    std::lock_guard lock(impl_->mu);
    auto& cs = impl_->idle[{e.host, e.port}];
    while (!cs.empty()) {
      bulk_connection c = std::move(cs.back());
      cs.pop_back();
      // An idle connection the server closed (restart, kill) polls as EOF or error: drop it.
      // One owing replies may poll readable; it is checked when read.
      pollfd p{c.fd, POLLIN, 0};
      if (::poll(&p, 1, 0) == 0 || (c.stale > 0 && !(p.revents & (POLLERR | POLLHUP)))) return c;
      ::close(c.fd);
    }
  }
  auto fd = connect_to(e, timeout);
  if (!fd) return std::unexpected(fd.error());
  bulk_connection c;
  c.fd = *fd;
  return c;
}

void bulk_pool::give(const bulk_endpoint& e, bulk_connection c) {
  std::lock_guard lock(impl_->mu);
  auto& cs = impl_->idle[{e.host, e.port}];
  if (cs.size() >= 16 || c.stale > 64) ::close(c.fd);
  else cs.push_back(std::move(c));
}

struct bulk_exchange::conn {
  bulk_endpoint e;
  bulk_connection c;
  std::string error;                   // set once the connection failed
  std::map<uint64_t, size_t> waiting;  // request id → call
};

namespace {
std::atomic<uint64_t> next_request_id{1};  // unique per process: a stale reply is never taken for a new one
}  // namespace

bulk_exchange::bulk_exchange(bulk_pool& pool, std::chrono::milliseconds connect_timeout,
                             std::chrono::milliseconds send_timeout)
    : pool_(pool), connect_timeout_(connect_timeout), send_timeout_(send_timeout) {}

bulk_exchange::~bulk_exchange() {
  for (auto& c : conns_) {
    if (c->c.fd < 0) continue;
    if (c->c.start != c->c.end) {  // in the middle of a frame: the stream cannot be handed on
      ::close(c->c.fd);
      continue;
    }
    c->c.stale += c->waiting.size();
    pool_.give(c->e, std::move(c->c));
  }
}

bulk_exchange::conn& bulk_exchange::conn_for(const bulk_endpoint& e) {
  for (auto& c : conns_)
    if (c->e.host == e.host && c->e.port == e.port) return *c;
  auto c = std::make_unique<conn>();
  c->e = e;
  if (auto taken = pool_.take(e, connect_timeout_)) {
    c->c = std::move(*taken);
    timeval tv{static_cast<time_t>(send_timeout_.count() / 1000), static_cast<suseconds_t>(send_timeout_.count() % 1000 * 1000)};
    ::setsockopt(c->c.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  } else {
    c->error = taken.error();
  }
  conns_.push_back(std::move(c));
  return *conns_.back();
}

void bulk_exchange::fail_conn(conn& c, const std::string& why) {
  if (c.error.empty()) c.error = why;
  for (auto& [id, call] : c.waiting) {
    results_[call].done = true;
    results_[call].ok = false;
    results_[call].error = c.error;
  }
  c.waiting.clear();
  if (c.c.fd >= 0) ::close(c.c.fd);
  c.c.fd = -1;
}

size_t bulk_exchange::add(const bulk_endpoint& e, bulk_request r) {
  size_t call = results_.size();
  results_.emplace_back();
  conn& c = conn_for(e);
  if (c.c.fd < 0) {
    results_[call].done = true;
    results_[call].error = c.error;
    return call;
  }
  r.id = next_request_id++;
  auto head = encode_request_head(r);
  c.waiting[r.id] = call;
  if (!send_frame(c.c.fd, head, r.payload))
    fail_conn(c, where(e) + (errno == EAGAIN || errno == EWOULDBLOCK
                               ? ": send timed out after " + std::to_string(send_timeout_.count()) + " ms"
                               : ": send failed: " + errno_text(errno)));
  return call;
}

bool bulk_exchange::read_some(conn& c, const std::function<void(size_t)>& on_reply) {
  auto& b = c.c;
  auto make_room = [&](size_t want) {  // at least `want` free bytes after end
    if (b.cap - b.end >= want) return;
    if (b.start > 0) {
      std::memmove(b.buf.get(), b.buf.get() + b.start, b.end - b.start);
      b.end -= b.start;
      b.start = 0;
    }
    if (b.cap - b.end >= want) return;
    size_t cap = std::max(b.cap * 2, b.end + want);
    std::unique_ptr<uint8_t[]> grown(new uint8_t[cap]);  // not zeroed: only [start, end) is read
    if (b.end) std::memcpy(grown.get(), b.buf.get(), b.end);
    b.buf = std::move(grown);
    b.cap = cap;
  };
  make_room(64 * 1024);
  ssize_t r = ::recv(b.fd, b.buf.get() + b.end, b.cap - b.end, MSG_DONTWAIT);
  if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return true;
  if (r <= 0) {
    fail_conn(c, where(c.e) + (r == 0 ? ": connection closed by the storage node" : ": receive failed: " + errno_text(errno)));
    return false;
  }
  b.end += static_cast<size_t>(r);
  while (b.end - b.start >= 4) {
    uint32_t n = get_be32(b.buf.get() + b.start);
    if (n > max_reply_frame) {
      fail_conn(c, where(c.e) + ": reply frame of " + std::to_string(n) + " bytes");
      return false;
    }
    if (b.end - b.start < 4 + size_t{n}) {
      make_room(4 + size_t{n} - (b.end - b.start));  // the whole frame fits once it is in
      break;
    }
    auto rep = parse_reply({b.buf.get() + b.start + 4, n});
    b.start += 4 + n;
    if (!rep) {
      fail_conn(c, where(c.e) + ": bad reply: " + rep.error());
      return false;
    }
    auto it = c.waiting.find(rep->id);
    if (it == c.waiting.end()) {
      if (rep->status == bulk_invalid_request) {
        fail_conn(c, where(c.e) + ": refused: " + rep->message);
        return false;
      }
      if (b.stale > 0) {  // the reply to a request an earlier exchange gave up on
        --b.stale;
        continue;
      }
      fail_conn(c, where(c.e) + ": reply to an unknown request");
      return false;
    }
    size_t call = it->second;
    c.waiting.erase(it);
    auto& res = results_[call];
    res.done = true;
    res.ok = rep->status == bulk_ok;
    if (res.ok) res.payload = std::move(rep->payload);
    else res.error = where(c.e) + ": " + rep->message;
    if (on_reply) on_reply(call);
  }
  if (b.start == b.end) b.start = b.end = 0;
  return true;
}

void bulk_exchange::run_until(std::chrono::steady_clock::time_point deadline, const std::function<bool()>& enough,
                              const std::function<void(size_t)>& on_reply) {
  std::vector<pollfd> fds;
  std::vector<conn*> owners;
  for (;;) {
    if (enough && enough()) return;
    fds.clear();
    owners.clear();
    for (auto& c : conns_)
      if (c->c.fd >= 0 && !c->waiting.empty()) {
        fds.push_back({c->c.fd, POLLIN, 0});
        owners.push_back(c.get());
      }
    if (fds.empty()) return;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    int rc = ::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(1, left.count())));
    if (rc < 0 && errno != EINTR) return;
    for (size_t i = 0; i < fds.size(); ++i)
      if (fds[i].revents & (POLLIN | POLLERR | POLLHUP)) read_some(*owners[i], on_reply);
  }
}

void bulk_exchange::finish(const std::string& why) {
  for (auto& c : conns_)
    if (!c->waiting.empty()) fail_conn(*c, where(c->e) + ": " + why);
}

}  // namespace shoal::storage
