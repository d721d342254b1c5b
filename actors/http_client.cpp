// http_call: connect, send, read until the server closes (or Content-Length is met), parse.
#include "actors/http_client.hpp"

#include <cerrno>
#include <cstring>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace shoal::actors {

namespace {

using clock_type = std::chrono::steady_clock;

struct fd_guard {
  int fd = -1;
  ~fd_guard() {
    if (fd >= 0) ::close(fd);
  }
};

std::expected<int, std::string> connect_to(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0)
    return std::unexpected("cannot resolve " + host + ": " + gai_strerror(rc));
  std::string last = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      freeaddrinfo(res);
      return fd;
    }
    last = std::strerror(errno);
    ::close(fd);
  }
  freeaddrinfo(res);
  return std::unexpected("cannot connect to " + host + ":" + std::to_string(port) + ": " + last);
}

bool send_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Parses the status line and headers of `head` (without the blank line) into `r`.
bool parse_head(const std::string& head, http_response& r) {
  size_t eol = head.find("\r\n");
  std::string status_line = head.substr(0, eol);
  if (status_line.rfind("HTTP/1.", 0) != 0 || status_line.size() < 12) return false;
  r.status = std::atoi(status_line.c_str() + 9);
  size_t pos = eol == std::string::npos ? head.size() : eol + 2;
  while (pos < head.size()) {
    size_t end = head.find("\r\n", pos);
    if (end == std::string::npos) end = head.size();
    std::string line = head.substr(pos, end - pos);
    if (auto colon = line.find(':'); colon != std::string::npos) {
      size_t v = line.find_first_not_of(' ', colon + 1);
      r.headers[lower(line.substr(0, colon))] = v == std::string::npos ? "" : line.substr(v);
    }
    pos = end + 2;
  }
  return true;
}

}  // namespace

std::expected<http_response, std::string> http_call(const std::string& host, uint16_t port,
                                                    const std::string& method, const std::string& target,
                                                    const std::string& body, const http_call_options& options) {
  auto fd = connect_to(host, port);
  if (!fd) return std::unexpected(fd.error());
  fd_guard guard{*fd};
  std::string req = method + " " + target + " HTTP/1.1\r\nHost: " + host + ":" + std::to_string(port) +
                    "\r\nConnection: close\r\n";
  if (!body.empty() || method == "POST")
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  for (const auto& [k, v] : options.headers) req += k + ": " + v + "\r\n";
  req += "\r\n" + body;
  if (!send_all(*fd, req)) return std::unexpected("send failed: " + std::string(std::strerror(errno)));

  auto deadline = clock_type::now() + options.timeout;
  http_response r;
  std::string buf;
  bool have_head = false;
  size_t body_seen = 0;
  char chunk[16384];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now()).count();
    if (left <= 0) return std::unexpected("timed out after " + std::to_string(options.timeout.count()) + " ms");
    pollfd p{*fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000))) <= 0) continue;
    ssize_t n = ::recv(*fd, chunk, sizeof chunk, 0);
    if (n < 0) return std::unexpected("receive failed: " + std::string(std::strerror(errno)));
    if (n == 0) break;
    std::string_view got(chunk, static_cast<size_t>(n));
    if (!have_head) {
      buf.append(got);
      size_t end = buf.find("\r\n\r\n");
      if (end == std::string::npos) continue;
      if (!parse_head(buf.substr(0, end), r)) return std::unexpected("malformed response head");
      have_head = true;
      got = std::string_view(buf).substr(end + 4);
    }
    r.body.append(got);
    body_seen += got.size();
    if (options.on_body && !got.empty()) options.on_body(got);
    if (options.close_after_body_bytes && body_seen >= options.close_after_body_bytes) return r;
    if (auto cl = r.headers.find("content-length"); cl != r.headers.end() &&
                                                     r.body.size() >= std::stoull(cl->second))
      break;
  }
  if (!have_head) return std::unexpected("connection closed before a response");
  return r;
}

std::vector<std::string> sse_data(std::string_view body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find('\n', pos);
    if (end == std::string_view::npos) end = body.size();
    std::string_view line = body.substr(pos, end - pos);
    if (line.rfind("data: ", 0) == 0) out.emplace_back(line.substr(6));
    pos = end + 1;
  }
  return out;
}

}  // namespace shoal::actors
