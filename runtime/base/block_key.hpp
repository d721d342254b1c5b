// The key of one KV-cache block, the same on every machine and in every layer: the engine's
// prefix cache, the storage cluster's chunks (storage::chunk_key = block key + chunk index)
// and the messages between them. key_i = xxh3_128(key_{i-1} ‖ tokens of block i ‖ extra
// keys); its wire and file form is the two 64-bit halves, hi first.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "runtime/base/image_key.hpp"

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

// key_i = xxh3_128(prev key bytes ‖ token ids (int32 LE) ‖ extra bytes). The first block's
// prev key is the all-zero key.
block_key chain_key(const block_key& prev, std::span<const int32_t> tokens,
                    std::span<const uint8_t> extra = {});
// Keys of every full block of `tokens` (tokens.size() / block_size keys).
std::vector<block_key> chain_keys(std::span<const int32_t> tokens, int block_size,
                                  std::span<const uint8_t> extra = {});
// Keys of a prompt with images: a block's extra bytes are the content hashes (lo, hi, LE) of
// the images whose placeholder tokens it holds, in prompt order, so two different images
// behind the same placeholder tokens never share a block (nor, through the chain, any later one).
std::vector<block_key> chain_keys(std::span<const int32_t> tokens, int block_size,
                                  std::span<const image_key> images);

}  // namespace shoal::runtime
