// Boost.Beast behind http_server.hpp. Synchronous: the acceptor thread hands each
// connection to a thread of its own, which parses requests with a body limit, calls the
// handler and writes what it answers. An event stream is written raw (status line, headers,
// then the events) and delimited by closing the connection.
#include "actors/http_server.hpp"

#include <atomic>
#include <thread>

#include <poll.h>
#include <sys/socket.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace shoal::actors {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct http_server::impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  http_handler handler;
  http_server_options options;
  std::shared_ptr<admission_bound> admission;  // one slot per open connection
  std::atomic<bool> stopping{false};
  std::thread accept_thread;
  uint16_t port = 0;
};

namespace {

class socket_writer final : public http_writer {
 public:
  socket_writer(tcp::socket& s, bool keep_alive) : socket_(s), keep_alive_(keep_alive) {}

  bool respond(int status, std::string_view content_type, std::string_view body) override {
    http::response<http::string_body> res{static_cast<http::status>(status), 11};
    res.set(http::field::server, "shoal");
    res.set(http::field::content_type, beast::string_view(content_type.data(), content_type.size()));
    res.keep_alive(keep_alive_);
    res.body() = std::string(body);
    res.prepare_payload();
    beast::error_code ec;
    http::write(socket_, res, ec);
    responded_ = true;
    return ok(ec);
  }

  bool start_stream(std::string_view content_type) override {
    std::string head = "HTTP/1.1 200 OK\r\nServer: shoal\r\nContent-Type: " + std::string(content_type) +
                       "\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n";
    streaming_ = responded_ = true;
    return send(head);
  }

  bool send(std::string_view bytes) override {
    if (gone_) return false;
    beast::error_code ec;
    asio::write(socket_, asio::buffer(bytes.data(), bytes.size()), ec);
    return ok(ec);
  }

  bool streaming() const { return streaming_; }
  bool responded() const { return responded_; }
  bool gone() const { return gone_; }

 private:
  bool ok(const beast::error_code& ec) {
    if (ec) gone_ = true;
    return !ec;
  }
  tcp::socket& socket_;
  bool keep_alive_;
  bool streaming_ = false, responded_ = false, gone_ = false;
};

void respond_error(http_server::impl& srv, tcp::socket& s, int status, const std::string& message) {
  socket_writer w(s, false);
  std::string body = srv.options.error_body ? srv.options.error_body(status, message) : message;
  w.respond(status, "application/json", body);
}

// Serves one connection until it closes, errs, streams, or stays idle too long.
void serve_connection(std::shared_ptr<http_server::impl> srv, tcp::socket s) {
  timeval tv{srv->options.idle_timeout_s, 0};
  setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  beast::flat_buffer buffer;
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(srv->options.max_body_bytes);
    parser.header_limit(64 * 1024);
    beast::error_code ec;
    http::read(s, buffer, parser, ec);
    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset)
      break;
    if (ec == http::error::body_limit) {
      respond_error(*srv, s, 413, "request body is larger than the limit of " +
                                      std::to_string(srv->options.max_body_bytes) + " bytes");
      break;
    }
    if (ec) {
      if (ec != asio::error::would_block && ec != asio::error::try_again && ec != asio::error::timed_out)
        respond_error(*srv, s, 400, "malformed HTTP request: " + ec.message());
      break;
    }
    auto& msg = parser.get();
    http_request req;
    req.method = std::string(msg.method_string());
    req.target = std::string(msg.target());
    for (const auto& f : msg) {
      std::string name(f.name_string());
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      req.headers[name] = std::string(f.value());
    }
    req.body = std::move(msg.body());
    bool keep_alive = msg.keep_alive();
    socket_writer w(s, keep_alive);
    srv->handler(req, w);
    if (!w.responded()) w.respond(500, "application/json",
                                  srv->options.error_body ? srv->options.error_body(500, "no response")
                                                          : "no response");
    if (w.streaming() || w.gone() || !keep_alive) break;
  }
  beast::error_code ignored;
  s.shutdown(tcp::socket::shutdown_both, ignored);
  s.close(ignored);
}

// Closes a connection answered before its request was read without resetting it: the request
// bytes that arrive within a short grace are read and dropped, so the client reads the answer
// instead of a reset (closing with unread bytes sends RST, which can discard it).
void close_after_response(tcp::socket& s) {
  beast::error_code ec;
  s.shutdown(tcp::socket::shutdown_send, ec);
  const int fd = s.native_handle();
  char sink[4096];
  for (int round = 0; round < 8; ++round) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) break;
    const ssize_t n = ::recv(fd, sink, sizeof sink, MSG_DONTWAIT);
    if (n <= 0) break;
  }
  s.close(ec);
}

void accept_loop(std::shared_ptr<http_server::impl> srv) {
  while (!srv->stopping) {
    beast::error_code ec;
    tcp::socket s{srv->io};
    srv->acceptor.accept(s, ec);
    if (ec) {
      if (srv->stopping || ec == asio::error::bad_descriptor) break;
      continue;
    }
    if (!srv->admission->try_acquire()) {
      respond_error(*srv, s, 429, "too many requests in flight (limit " + std::to_string(srv->admission->limit()) +
                                      "): try again later");
      close_after_response(s);
      continue;
    }
    std::thread([srv, s = std::move(s)]() mutable {
      serve_connection(srv, std::move(s));
      srv->admission->release();
    }).detach();
  }
}

}  // namespace

http_server::http_server(std::shared_ptr<impl> p) : impl_(std::move(p)) {}

std::expected<std::unique_ptr<http_server>, std::string> http_server::start(const std::string& host,
                                                                           uint16_t port,
                                                                           http_handler handler,
                                                                           http_server_options options) {
  auto p = std::make_shared<impl>();
  p->handler = std::move(handler);
  p->options = std::move(options);
  p->admission = p->options.admission ? p->options.admission : std::make_shared<admission_bound>(p->options.max_connections);
  beast::error_code ec;
  auto addr = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) return std::unexpected("bad HTTP listen address '" + host + "': " + ec.message());
  tcp::endpoint ep{addr, port};
  p->acceptor.open(ep.protocol(), ec);
  if (!ec) p->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) p->acceptor.bind(ep, ec);
  if (!ec) p->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return std::unexpected("cannot listen for HTTP on " + host + ":" + std::to_string(port) + ": " +
                                 ec.message());
  p->port = p->acceptor.local_endpoint().port();
  auto server = std::unique_ptr<http_server>(new http_server(p));
  p->accept_thread = std::thread(accept_loop, p);
  return server;
}

http_server::~http_server() { stop(); }

uint16_t http_server::port() const { return impl_->port; }

void http_server::stop() {
  if (!impl_ || impl_->stopping.exchange(true)) return;
  ::shutdown(impl_->acceptor.native_handle(), SHUT_RDWR);
  if (impl_->accept_thread.joinable()) impl_->accept_thread.join();
  beast::error_code ignored;
  impl_->acceptor.close(ignored);
}

}  // namespace shoal::actors
