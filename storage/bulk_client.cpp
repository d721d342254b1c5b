// The bulk data path's client (see bulk.hpp): the connection pool and the exchange's poll loop
// over many nodes at once.
#include "storage/bulk.hpp"
#include "storage/bulk_wire.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace shoal::storage {

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
