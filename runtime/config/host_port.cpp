// host:port syntax of the node config (host_port.hpp).
#include "runtime/config/host_port.hpp"

#include <algorithm>
#include <charconv>

namespace shoal::runtime {
namespace {

// Hostname labels of [A-Za-z0-9-] not starting or ending with '-'; a name of digits and dots
// only must be a dotted-quad IPv4 literal.
bool valid_host(std::string_view host) {
  if (host.empty() || host.size() > 253) return false;
  const bool numeric = std::ranges::all_of(host, [](char c) { return c == '.' || (c >= '0' && c <= '9'); });
  int labels = 0;
  for (size_t start = 0; start <= host.size(); ++labels) {
    const size_t end = std::min(host.find('.', start), host.size());
    const std::string_view label = host.substr(start, end - start);
    start = end + 1;
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') return false;
    if (!std::ranges::all_of(label, [](char c) { return is_ascii_alnum(c) || c == '-'; })) return false;
    if (numeric && (label.size() > 3 || std::stoi(std::string(label)) > 255)) return false;
  }
  return !numeric || labels == 4;
}

bool valid_ipv6(std::string_view host) {
  return !host.empty() && host.find(':') != std::string_view::npos &&
         std::ranges::all_of(host, [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') ||
                  c == ':' || c == '.';
         });
}

}  // namespace

std::expected<host_port, std::string> parse_host_port(std::string_view text, bool allow_port_zero) {
  const std::string quoted = "'" + std::string(text) + "'";
  std::string_view host;
  std::string_view port;
  if (text.starts_with('[')) {
    const size_t close = text.find(']');
    if (close == std::string_view::npos || text.substr(close + 1, 1) != ":")
      return std::unexpected("expected [ipv6]:port, got " + quoted);
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
    if (!valid_ipv6(host)) return std::unexpected("bad IPv6 address in " + quoted);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return std::unexpected("expected host:port, got " + quoted);
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string_view::npos)
      return std::unexpected("IPv6 hosts need brackets ([::1]:7100), got " + quoted);
    if (!valid_host(host)) return std::unexpected("bad host in " + quoted);
  }
  uint32_t number = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), number);
  if (port.empty() || port.size() > 5 || ec != std::errc() || end != port.data() + port.size())
    return std::unexpected("bad port in " + quoted + " (expected a number)");
  const uint32_t lowest = allow_port_zero ? 0 : 1;
  if (number < lowest || number > 65535)
    return std::unexpected("port out of range in " + quoted + " (" + std::to_string(lowest) + "..65535)");
  return host_port{std::string(host), static_cast<uint16_t>(number)};
}

std::string to_string(const host_port& a) {
  const bool bracket = a.host.find(':') != std::string::npos;
  return (bracket ? "[" + a.host + "]" : a.host) + ":" + std::to_string(a.port);
}

}  // namespace shoal::runtime
