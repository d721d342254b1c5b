// A small HTTP/1.1 server over Boost.Beast for the gateway: one acceptor thread and one
// thread per connection (synchronous reads and writes; a connection's handler may block
// waiting for tokens). Keep-alive for plain responses; an event stream (SSE) owns its
// connection until the handler returns, then the connection closes. Beast stays inside
// http_server.cpp; this header is light.
#pragma once

#include <atomic>
#include <cstdint>
#include <expected>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

namespace shoal::actors {

struct http_request {
  std::string method;                          // "GET", "POST", ...
  std::string target;                          // path and query as sent
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

// The response side of one request. Calls return false once the client has gone (the
// handler should then stop, e.g. cancel its generation).
class http_writer {
 public:
  virtual ~http_writer() = default;
  // A complete response with Content-Length.
  virtual bool respond(int status, std::string_view content_type, std::string_view body) = 0;
  // 200 with `content_type` and no length: the body is whatever send() writes until the
  // handler returns and the connection closes.
  virtual bool start_stream(std::string_view content_type) = 0;
  virtual bool send(std::string_view bytes) = 0;
};

using http_handler = std::function<void(const http_request&, http_writer&)>;

// The bound on requests a process serves at once, shared by everything that admits one (the
// HTTP connections, each on a thread of its own, and the gateway actor's submits): one count,
// one policy. A request over it is refused at once, never queued.
class admission_bound {
 public:
  explicit admission_bound(int limit) : limit_(limit) {}
  bool try_acquire() {
    int n = used_.load();
    while (n < limit_)
      if (used_.compare_exchange_weak(n, n + 1)) return true;
    return false;
  }
  void release() { used_.fetch_sub(1); }
  int limit() const { return limit_; }

 private:
  std::atomic<int> used_{0};
  const int limit_;
};

struct http_server_options {
  size_t max_body_bytes = 1 << 20;  // larger bodies: 413 before the body is read
  int max_connections = 256;        // more concurrent connections: 429 naming the limit, then closed
  // Shared with other admitters (the gateway's submits); null: a bound of max_connections.
  std::shared_ptr<admission_bound> admission;
  int idle_timeout_s = 60;          // a keep-alive connection silent this long is closed
  // Body (JSON) of the responses the server makes itself: 400 unparsable HTTP, 413, 429.
  std::function<std::string(int status, const std::string& message)> error_body;
};

class http_server {
 public:
  // Listens on host:port (port 0: any free port) and serves `handler` until stop().
  static std::expected<std::unique_ptr<http_server>, std::string> start(const std::string& host,
                                                                         uint16_t port,
                                                                         http_handler handler,
                                                                         http_server_options options);
  ~http_server();
  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;

  uint16_t port() const;
  // Stops accepting new connections (connections already open finish their request).
  void stop();

  struct impl;

 private:
  explicit http_server(std::shared_ptr<impl> p);
  std::shared_ptr<impl> impl_;  // shared with the connection threads, which may outlive stop()
};

}  // namespace shoal::actors
