// Strong integer ids used across the runtime: never strings in hot maps.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>

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
using block_id = strong_id<struct block_tag, int32_t>;

}  // namespace shoal

template <class Tag, class Rep>
struct std::hash<shoal::strong_id<Tag, Rep>> {
  size_t operator()(const shoal::strong_id<Tag, Rep>& id) const noexcept {
    return std::hash<Rep>{}(id.value);
  }
};
