// The traffic class of a request, one type from the API to the chunk files: it sets how
// long the storage cluster keeps the blocks the request wrote back (storage/ttl.hpp). The
// wire and disk form is its byte value.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace shoal::runtime {

enum class traffic_class : uint8_t { agent = 0, chat = 1 };
inline constexpr int n_traffic_classes = 2;

constexpr const char* to_string(traffic_class c) { return c == traffic_class::agent ? "agent" : "chat"; }

// nullopt for unknown values (bytes from another process or a file).
constexpr std::optional<traffic_class> traffic_class_from_byte(uint8_t b) {
  if (b >= n_traffic_classes) return std::nullopt;
  return static_cast<traffic_class>(b);
}

constexpr std::optional<traffic_class> traffic_class_from_name(std::string_view s) {
  if (s == "agent") return traffic_class::agent;
  if (s == "chat") return traffic_class::chat;
  return std::nullopt;
}

}  // namespace shoal::runtime
