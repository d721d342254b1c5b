// A minimal blocking HTTP/1.1 client over POSIX sockets (one request per connection,
// "Connection: close"), for the cluster tests, `shoal bench serve` and scripts: enough to
// call the gateway and time a server-sent event stream as it arrives.
#pragma once

#include <chrono>
#include <cstdint>
#include <expected>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace shoal::actors {

struct http_response {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

struct http_call_options {
  std::map<std::string, std::string> headers;             // extra request headers
  std::function<void(std::string_view)> on_body;           // body bytes as they arrive
  std::chrono::milliseconds timeout{60'000};               // whole exchange
  // When set, the connection is closed after this many body bytes (a client leaving).
  size_t close_after_body_bytes = 0;
};

std::expected<http_response, std::string> http_call(const std::string& host, uint16_t port,
                                                    const std::string& method, const std::string& target,
                                                    const std::string& body, const http_call_options& options = {});

// The `data:` payloads of a server-sent event stream, in order ("[DONE]" included).
std::vector<std::string> sse_data(std::string_view body);

}  // namespace shoal::actors
