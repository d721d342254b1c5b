// The key of one KV-cache block, the same on every machine and in every layer: the engine's
// prefix cache, the storage cluster's chunks (storage::chunk_key = block key + chunk index)
// and the messages between them. key_i = xxh3_128(key_{i-1} ‖ tokens of block i ‖ extra
// keys); its wire and file form is the two 64-bit halves, hi first.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>

namespace shoal::runtime {

struct block_key {
  uint64_t lo = 0;
  uint64_t hi = 0;
  bool operator==(const block_key&) const = default;
  // Ordered by (hi, lo): the order of the wire and file form.
  std::strong_ordering operator<=>(const block_key& o) const {
    if (auto c = hi <=> o.hi; c != 0) return c;
    return lo <=> o.lo;
  }
};

struct block_key_hash {
  size_t operator()(const block_key& k) const noexcept { return k.lo ^ (k.hi * 0x9e3779b97f4a7c15ULL); }
};

}  // namespace shoal::runtime
