// SWA cache of one machine: a bounded number of live slots (one per running shoal_flash
// sequence: the raw window entries of every encoder layer) and an LRU store of window
// snapshots keyed by the block key at a block boundary P, holding the encoder entries of
// positions [P − W, P). Snapshots are stored MXFP8 (e4m3 values + one UE8M0 scale per 32)
// as the mission describes, or fp32 for exact tests. A prefix hit at P restores the window
// from a snapshot; without one the engine replays (bounded replay).
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

#include "model/forward.hpp"
#include "runtime/block_pool.hpp"

namespace shoal::runtime {

enum class swa_storage { mxfp8, fp32 };

struct swa_stats {
  uint64_t saves = 0, hits = 0, misses = 0, evictions = 0;
};

class swa_pool {
 public:
  // streams: the encoder streams saved (0 … n_enc−1); entry_dim values per entry.
  swa_pool(int64_t max_slots, int64_t max_snapshots, int64_t streams, int64_t entry_dim,
           int64_t window, swa_storage storage);

  bool can_acquire() const { return live_ < max_slots_; }
  void acquire();
  void release();
  int64_t live_slots() const { return live_; }

  bool contains(const block_key& key) const { return index_.contains(key); }
  // Saves the window ending at P from the cache's rings (which must hold [P − W, P)).
  void save(const block_key& key, const model::sequence_cache& cache, int64_t p);
  // Restores the snapshot for key into the cache's rings; false when absent.
  bool restore(const block_key& key, model::sequence_cache& cache, int64_t p);

  // Bytes of one live slot / one snapshot as stored.
  size_t snapshot_bytes() const;
  const swa_stats& stats() const { return stats_; }

 private:
  struct snapshot {
    block_key key;
    int64_t p = 0;
    std::vector<uint8_t> bytes;  // (streams, tokens, entry) in the storage format
  };
  size_t entry_bytes() const;

  int64_t max_slots_, max_snapshots_, streams_, entry_dim_, window_;
  swa_storage storage_;
  int64_t live_ = 0;
  std::list<snapshot> lru_;  // front = most recently used
  std::unordered_map<block_key, std::list<snapshot>::iterator, block_key_hash> index_;
  swa_stats stats_;
};

}  // namespace shoal::runtime
