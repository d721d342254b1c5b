// Block pool implementation: an intrusive doubly linked free list over block metadata (the
// eviction order), a key -> block map for prefix lookups, and the xxh3-128 chain hash that
// names full blocks. Every operation is O(1) per block; check_invariants() walks everything
// and is meant for tests and debug runs.
#include "runtime/core/block_pool.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <memory>

#include "kernels/assert.hpp"

namespace shoal::runtime {

block_pool::block_pool(int32_t num_blocks) : blocks_(static_cast<size_t>(std::max(num_blocks, 0))) {
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

std::vector<block_id> block_pool::free_list() const {
  std::vector<block_id> out;
  out.reserve(static_cast<size_t>(free_count_));
  for (int32_t b = head_; b >= 0; b = blocks_[static_cast<size_t>(b)].next) out.emplace_back(b);
  return out;
}

void block_pool::check_invariants() const {
  const int32_t n = num_blocks();
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
