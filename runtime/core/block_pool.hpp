// Paged block pool with prefix caching: the accounting of the blocks of the compute backend's
// paged KV memory (model::kv_pages, which holds their bytes). A block holds the compressed
// cache entries of `block_size` tokens; a full block is keyed by the prefix hash chain
// key_i = H(key_{i-1}, tokens of block i, extra keys) and can be shared by every sequence
// with that prefix. Reference counted; blocks whose count drops to zero stay cached in a
// free list that IS the eviction order (head = evicted first), as in vLLM v1.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/base/block_key.hpp"
#include "runtime/base/ids.hpp"

namespace shoal::runtime {

class block_pool {
 public:
  explicit block_pool(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t num_free() const { return free_count_; }
  bool can_allocate(int32_t n) const { return n <= free_count_; }

  // Takes n blocks from the head of the free list (evicting their cached keys), ref = 1.
  // Precondition: can_allocate(n).
  std::vector<block_id> allocate(int32_t n);
  // Cached full block with this key, if any (does not change reference counts).
  std::optional<block_id> lookup(const block_key& key) const;
  // Takes a reference on cached blocks (removing them from the free list if ref was 0).
  void touch(std::span<const block_id> blocks);
  // Drops one reference per block. Blocks reaching 0 are appended to the free-list tail in
  // the order given: callers pass a sequence's blocks in reverse so its tail is evicted first.
  void release(std::span<const block_id> blocks);
  // Marks a full block as holding `key` (it becomes reusable by prefix lookups). If another
  // block already holds the key, the existing one stays the canonical copy.
  void cache_block(block_id block, const block_key& key);

  int32_t ref_count(block_id b) const;
  std::optional<block_key> key_of(block_id b) const;
  // Free list from head (next evicted) to tail, for tests.
  std::vector<block_id> free_list() const;
  uint64_t evictions() const { return evictions_; }

  // Aborts on a broken invariant: free count matches the list, ref 0 ⇔ in free list,
  // every cached key maps to a block that holds it.
  void check_invariants() const;

 private:
  struct block_meta {
    int32_t ref = 0;
    int32_t prev = -1;   // free-list links (-1 = none)
    int32_t next = -1;
    bool in_free = false;
    std::optional<block_key> key;
  };
  void unlink(int32_t b);
  void push_tail(int32_t b);

  std::vector<block_meta> blocks_;
  int32_t head_ = -1, tail_ = -1, free_count_ = 0;
  uint64_t evictions_ = 0;
  std::unordered_map<block_key, int32_t, block_key_hash> cached_;
};

}  // namespace shoal::runtime
