// The "host:port" addresses of the node config: their type and their syntax (hostname, IPv4
// literal or bracketed IPv6 literal, then a port), parsed without toml++ so the address rules
// stand on their own.
#pragma once

#include <cstdint>
#include <expected>
#include <string>
#include <string_view>

namespace shoal::runtime {

// "host:port" as written in the file: host is a hostname, IPv4 literal or bracketed IPv6
// literal ("[::1]:7100", stored without brackets). Port 0 (listen addresses only) asks the
// OS for a free port.
struct host_port {
  std::string host;
  uint16_t port = 0;
  bool operator==(const host_port&) const = default;
};
std::string to_string(const host_port& a);  // brackets IPv6 hosts again

// [A-Za-z0-9], whatever the locale (hostnames and node names).
inline bool is_ascii_alnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

// "host:port" or "[ipv6]:port"; the error text says what is wrong.
std::expected<host_port, std::string> parse_host_port(std::string_view text, bool allow_port_zero);

}  // namespace shoal::runtime
