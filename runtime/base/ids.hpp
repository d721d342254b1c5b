// Strong integer ids used across the runtime: never strings in hot maps.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <string>

namespace shoal {

template <class Tag, class Rep = int64_t>
struct strong_id {
  Rep value = -1;
  constexpr strong_id() = default;
  constexpr explicit strong_id(Rep v) : value(v) {}
  constexpr bool valid() const { return value >= 0; }
  constexpr auto operator<=>(const strong_id&) const = default;
};

using request_id = strong_id<struct request_tag>;
// An engine as the balancers know it: minted once by whoever adds it to a balancer (the
// gateway's balancer actors, the simulator) and stable while it stays.
using engine_id = strong_id<struct engine_tag>;
using block_id = strong_id<struct block_tag, int32_t>;

// A request's id as every layer prints it (shell, engine stats, logs, the API's response id
// "chatcmpl-<this>"): 16 hex digits.
inline std::string to_string(request_id id) {
  static constexpr char hex[] = "0123456789abcdef";
  const auto v = static_cast<uint64_t>(id.value);
  std::string out(16, '0');
  for (int i = 0; i < 16; ++i) out[static_cast<size_t>(i)] = hex[(v >> (60 - 4 * i)) & 0xF];
  return out;
}

}  // namespace shoal

template <class Tag, class Rep>
struct std::hash<shoal::strong_id<Tag, Rep>> {
  size_t operator()(const shoal::strong_id<Tag, Rep>& id) const noexcept {
    return std::hash<Rep>{}(id.value);
  }
};
