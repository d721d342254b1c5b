// The prefix hash chain that names full KV blocks: xxh3-128 over the previous key, the
// block's tokens and its extra keys (image hashes).
#include "runtime/base/block_key.hpp"

#include <xxhash.h>

#include <array>
#include <bit>
#include <memory>

#include "kernels/assert.hpp"

namespace shoal::runtime {

namespace {

struct xxh3_state_deleter {
  void operator()(XXH3_state_t* s) const noexcept { XXH3_freeState(s); }
};

// One streaming state per thread, reused by every chain_key call.
XXH3_state_t* hash_state() {
  thread_local std::unique_ptr<XXH3_state_t, xxh3_state_deleter> state{XXH3_createState()};
  SHOAL_ASSERT(state != nullptr);
  return state.get();
}

void put_le64(uint8_t* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}

void update_tokens_le(XXH3_state_t* st, std::span<const int32_t> tokens) {
  if (tokens.empty()) return;
  if constexpr (std::endian::native == std::endian::little) {
    XXH3_128bits_update(st, tokens.data(), tokens.size_bytes());
  } else {
    std::array<uint8_t, 256> buf;
    size_t fill = 0;
    for (int32_t t : tokens) {
      const auto u = static_cast<uint32_t>(t);
      for (int i = 0; i < 4; ++i) buf[fill++] = static_cast<uint8_t>(u >> (8 * i));
      if (fill == buf.size()) {
        XXH3_128bits_update(st, buf.data(), fill);
        fill = 0;
      }
    }
    if (fill) XXH3_128bits_update(st, buf.data(), fill);
  }
}

}  // namespace

block_key chain_key(const block_key& prev, std::span<const int32_t> tokens,
                    std::span<const uint8_t> extra) {
  XXH3_state_t* st = hash_state();
  SHOAL_ASSERT(XXH3_128bits_reset(st) == XXH_OK);
  std::array<uint8_t, 16> prev_bytes;
  put_le64(prev_bytes.data(), prev.lo);
  put_le64(prev_bytes.data() + 8, prev.hi);
  XXH3_128bits_update(st, prev_bytes.data(), prev_bytes.size());
  update_tokens_le(st, tokens);
  if (!extra.empty()) XXH3_128bits_update(st, extra.data(), extra.size());
  const XXH128_hash_t h = XXH3_128bits_digest(st);
  return block_key{h.low64, h.high64};
}

std::vector<block_key> chain_keys(std::span<const int32_t> tokens, int block_size,
                                  std::span<const uint8_t> extra) {
  SHOAL_ASSERT(block_size > 0);
  const size_t bs = static_cast<size_t>(block_size);
  const size_t full = tokens.size() / bs;
  std::vector<block_key> keys;
  keys.reserve(full);
  block_key prev{};
  for (size_t i = 0; i < full; ++i) {
    prev = chain_key(prev, tokens.subspan(i * bs, bs), extra);
    keys.push_back(prev);
  }
  return keys;
}

std::vector<block_key> chain_keys(std::span<const int32_t> tokens, int block_size,
                                  std::span<const image_key> images) {
  if (images.empty()) return chain_keys(tokens, block_size);
  SHOAL_ASSERT(block_size > 0);
  const int64_t bs = block_size, full = static_cast<int64_t>(tokens.size()) / bs;
  std::vector<block_key> keys;
  keys.reserve(static_cast<size_t>(full));
  block_key prev{};
  std::vector<uint8_t> extra;
  for (int64_t i = 0; i < full; ++i) {
    extra.clear();
    for (const auto& im : images)
      if (im.pos < (i + 1) * bs && im.pos + im.count > i * bs) {
        extra.resize(extra.size() + 16);
        put_le64(extra.data() + extra.size() - 16, im.hash[0]);
        put_le64(extra.data() + extra.size() - 8, im.hash[1]);
      }
    prev = chain_key(prev, tokens.subspan(static_cast<size_t>(i * bs), static_cast<size_t>(bs)), extra);
    keys.push_back(prev);
  }
  return keys;
}

}  // namespace shoal::runtime
