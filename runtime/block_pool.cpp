// Block pool implementation: an intrusive doubly linked free list over block metadata (the
// eviction order), a key -> block map for prefix lookups, and the xxh3-128 chain hash that
// names full blocks. Every operation is O(1) per block; check_invariants() walks everything
// and is meant for tests and debug runs.
#include "runtime/block_pool.hpp"

#include <xxhash.h>

#include <algorithm>
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
                                  std::span<const prompt_image> images) {
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

block_pool::block_pool(int32_t num_blocks, size_t block_floats)
    : blocks_(static_cast<size_t>(std::max(num_blocks, 0))),
      storage_(static_cast<size_t>(std::max(num_blocks, 0)) * block_floats),
      block_floats_(block_floats) {
  SHOAL_ASSERT(num_blocks >= 0);
  for (int32_t b = 0; b < num_blocks; ++b) push_tail(b);
}

void block_pool::unlink(int32_t b) {
  block_meta& m = blocks_[static_cast<size_t>(b)];
  SHOAL_ASSERT(m.in_free);
  if (m.prev >= 0) blocks_[static_cast<size_t>(m.prev)].next = m.next; else head_ = m.next;
  if (m.next >= 0) blocks_[static_cast<size_t>(m.next)].prev = m.prev; else tail_ = m.prev;
  m.prev = m.next = -1;
  m.in_free = false;
  --free_count_;
}

void block_pool::push_tail(int32_t b) {
  block_meta& m = blocks_[static_cast<size_t>(b)];
  SHOAL_ASSERT(!m.in_free);
  m.prev = tail_;
  m.next = -1;
  if (tail_ >= 0) blocks_[static_cast<size_t>(tail_)].next = b; else head_ = b;
  tail_ = b;
  m.in_free = true;
  ++free_count_;
}

std::vector<block_id> block_pool::allocate(int32_t n) {
  SHOAL_ASSERT(n >= 0 && can_allocate(n));
  std::vector<block_id> out;
  out.reserve(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    const int32_t b = head_;
    unlink(b);
    block_meta& m = blocks_[static_cast<size_t>(b)];
    SHOAL_ASSERT(m.ref == 0);
    if (m.key) {
      // A keyed block is always the canonical one for its key (cache_block never gives a
      // second block the same key), so the map entry points here.
      cached_.erase(*m.key);
      m.key.reset();
      ++evictions_;
    }
    m.ref = 1;
    out.emplace_back(b);
  }
  return out;
}

std::optional<block_id> block_pool::lookup(const block_key& key) const {
  const auto it = cached_.find(key);
  if (it == cached_.end()) return std::nullopt;
  return block_id{it->second};
}

void block_pool::touch(std::span<const block_id> blocks) {
  for (const block_id id : blocks) {
    SHOAL_ASSERT(id.value >= 0 && id.value < num_blocks());
    block_meta& m = blocks_[static_cast<size_t>(id.value)];
    if (m.ref == 0) unlink(id.value);
    ++m.ref;
  }
}

void block_pool::release(std::span<const block_id> blocks) {
  for (const block_id id : blocks) {
    SHOAL_ASSERT(id.value >= 0 && id.value < num_blocks());
    block_meta& m = blocks_[static_cast<size_t>(id.value)];
    SHOAL_ASSERT(m.ref > 0);
    if (--m.ref == 0) push_tail(id.value);
  }
}

void block_pool::cache_block(block_id block, const block_key& key) {
  SHOAL_ASSERT(block.value >= 0 && block.value < num_blocks());
  block_meta& m = blocks_[static_cast<size_t>(block.value)];
  // Only a block someone holds can have been filled with content worth caching.
  SHOAL_ASSERT(m.ref > 0);
  if (cached_.contains(key)) return;  // the existing block stays canonical
  // A block holds at most one key for its lifetime (until evicted by allocate).
  SHOAL_ASSERT(!m.key);
  m.key = key;
  cached_.emplace(key, block.value);
}

int32_t block_pool::ref_count(block_id b) const {
  SHOAL_ASSERT(b.value >= 0 && b.value < num_blocks());
  return blocks_[static_cast<size_t>(b.value)].ref;
}

std::optional<block_key> block_pool::key_of(block_id b) const {
  SHOAL_ASSERT(b.value >= 0 && b.value < num_blocks());
  return blocks_[static_cast<size_t>(b.value)].key;
}

float* block_pool::data(block_id b) {
  SHOAL_ASSERT(b.value >= 0 && b.value < num_blocks());
  return storage_.data() + static_cast<size_t>(b.value) * block_floats_;
}

const float* block_pool::data(block_id b) const {
  SHOAL_ASSERT(b.value >= 0 && b.value < num_blocks());
  return storage_.data() + static_cast<size_t>(b.value) * block_floats_;
}

std::vector<block_id> block_pool::free_list() const {
  std::vector<block_id> out;
  out.reserve(static_cast<size_t>(free_count_));
  for (int32_t b = head_; b >= 0; b = blocks_[static_cast<size_t>(b)].next) out.emplace_back(b);
  return out;
}

void block_pool::check_invariants() const {
  const int32_t n = num_blocks();
  SHOAL_ASSERT(storage_.size() == static_cast<size_t>(n) * block_floats_);
  // Walk the free list forwards: links are symmetric, members are flagged, ref is 0.
  int32_t walked = 0;
  int32_t prev = -1;
  for (int32_t b = head_; b >= 0; b = blocks_[static_cast<size_t>(b)].next) {
    SHOAL_ASSERT(b < n);
    SHOAL_ASSERT(walked < n);  // no cycle
    const block_meta& m = blocks_[static_cast<size_t>(b)];
    SHOAL_ASSERT(m.in_free);
    SHOAL_ASSERT(m.ref == 0);
    SHOAL_ASSERT(m.prev == prev);
    prev = b;
    ++walked;
  }
  SHOAL_ASSERT(tail_ == prev);
  SHOAL_ASSERT(walked == free_count_);
  // Every block: ref 0 <=> in the free list; a held key maps back to this block.
  int32_t flagged = 0;
  size_t keyed = 0;
  for (int32_t b = 0; b < n; ++b) {
    const block_meta& m = blocks_[static_cast<size_t>(b)];
    SHOAL_ASSERT(m.ref >= 0);
    SHOAL_ASSERT((m.ref == 0) == m.in_free);
    if (m.in_free) ++flagged;
    else SHOAL_ASSERT(m.prev == -1 && m.next == -1);
    if (m.key) {
      ++keyed;
      const auto it = cached_.find(*m.key);
      SHOAL_ASSERT(it != cached_.end() && it->second == b);
    }
  }
  SHOAL_ASSERT(flagged == free_count_);
  // Every map entry names a valid block holding that key (with the loop above: a bijection).
  SHOAL_ASSERT(keyed == cached_.size());
  for (const auto& [key, b] : cached_) {
    SHOAL_ASSERT(b >= 0 && b < n);
    const block_meta& m = blocks_[static_cast<size_t>(b)];
    SHOAL_ASSERT(m.key && *m.key == key);
  }
}

}  // namespace shoal::runtime
