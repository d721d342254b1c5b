// SWA cache of one machine: a bounded number of live slots (one per running shoal_flash
// sequence: the raw window entries of every encoder layer) and an LRU store of window
// snapshots keyed by the block key at a block boundary P, holding the encoder entries of
// positions [P − W, P). Snapshots are stored MXFP8 (e4m3 values + one UE8M0 scale per 32)
// as the mission describes, or fp32 for exact tests, in the machine's swa_store (shared by
// its engines; a private one when none is given). A prefix hit at P restores the window
// from a snapshot; without one the engine replays (bounded replay).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/forward.hpp"
#include "runtime/core/block_pool.hpp"
#include "runtime/core/stats.hpp"
#include "runtime/core/swa_store.hpp"

namespace shoal::runtime {

enum class swa_storage : uint8_t { mxfp8, fp32 };

// Every snapshot starts with a header naming its storage and shape (swa_pool.cpp).
inline constexpr size_t swa_header_bytes = 20;

// Bytes of one full window snapshot of model `c` in `storage` format (a store's slot size).
size_t swa_snapshot_bytes(const model::model_config& c, swa_storage storage);

class swa_pool {
 public:
  // streams: the encoder streams saved (0 … n_enc−1); entry_dim values per entry. Snapshots
  // go to `store` (its slots must hold snapshot_bytes()), else to a private store of
  // max_snapshots slots.
  swa_pool(int64_t max_slots, int64_t max_snapshots, int64_t streams, int64_t entry_dim,
           int64_t window, swa_storage storage, std::shared_ptr<swa_store> store = nullptr);

  bool can_acquire() const { return live_ < max_slots_; }
  void acquire();
  void release();
  int64_t live_slots() const { return live_; }

  bool contains(const block_key& key) const { return store_->contains(key); }
  // Saves the window ending at P from the cache's rings (which must hold [P − W, P)).
  void save(const block_key& key, const model::sequence_cache& cache, int64_t p);
  // Restores the snapshot for key into the cache's rings; false when absent.
  bool restore(const block_key& key, model::sequence_cache& cache, int64_t p);

  // Stores a snapshot read from another machine's store: false (nothing stored) unless its
  // header names this pool's storage and shape at p and its size matches (else counted in
  // stats().shape_misses).
  bool put_encoded(const block_key& key, int64_t p, std::span<const uint8_t> bytes);

  // Bytes of one full snapshot as stored (a snapshot at p < W is shorter: snapshot_bytes(p)).
  size_t snapshot_bytes() const;
  size_t snapshot_bytes(int64_t p) const;
  swa_stats stats() const;
  const std::shared_ptr<swa_store>& store() const { return store_; }

 private:
  size_t entry_bytes() const;
  void write_header(int64_t positions, uint8_t* out) const;
  bool header_fits(std::span<const uint8_t> bytes, int64_t p) const;

  int64_t max_slots_, streams_, entry_dim_, window_;
  swa_storage storage_;
  std::shared_ptr<swa_store> store_;
  int64_t live_ = 0;
  std::vector<uint8_t> scratch_;  // one snapshot being encoded
  swa_stats stats_;
};

}  // namespace shoal::runtime
