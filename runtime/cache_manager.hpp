// Everything one engine does with its caches for a request: admission (longest cached
// prefix, SWA restore from a snapshot or bounded-replay set-up, block allocation for the
// first chunk), growth of the block table, registering full blocks and SWA snapshots after
// a step, and release. A plain state machine over block_pool and swa_pool.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/config.hpp"
#include "runtime/block_pool.hpp"
#include "runtime/remote_blocks.hpp"
#include "runtime/request.hpp"
#include "runtime/swa_pool.hpp"

namespace shoal::runtime {

struct cache_config {
  int64_t num_blocks = 1024;
  bool prefix_caching = true;
  bool exact_swa = false;             // swa_mode == exact
  int64_t swa_slots = 256;            // live SWA slots (running shoal_flash sequences)
  int64_t swa_snapshots = 1024;
  swa_storage snapshot_storage = swa_storage::mxfp8;
  // Second tier behind the pool (the KV-cache storage cluster); null = local blocks only.
  std::shared_ptr<remote_blocks> remote;
};

struct cache_stats {
  uint64_t lookups = 0, hit_tokens = 0, prompt_tokens = 0;
  uint64_t remote_hit_tokens = 0;     // of hit_tokens: fetched from the remote tier
  uint64_t remote_fetch_failures = 0; // blocks the remote tier listed but could not deliver
  uint64_t remote_stored = 0, remote_dropped = 0;  // blocks offered for writing / dropped
  uint64_t replays = 0, swa_restores = 0;
  uint64_t preemptions = 0;
};

class cache_manager {
 public:
  cache_manager(const model::model_config& model, const cache_config& config);

  // Blocks needed so that positions [0, upto) are covered.
  int64_t blocks_for(int64_t upto) const { return (upto + bs_ - 1) / bs_; }
  bool can_admit(const request& r) const;
  // Sets up r's caches for computing its tokens: prefix hit (blocks touched, SWA restored or
  // replay planned), rings, decoder tail. Allocates no blocks for the new tokens.
  void admit(request& r);
  // Blocks to add so r covers [0, upto); empty when not enough are free (nothing taken).
  bool can_grow(const request& r, int64_t upto, int64_t pending_blocks) const;
  std::vector<block_id> take_blocks(int64_t n);
  void give_back(const std::vector<block_id>& blocks);
  // Appends allocated blocks to r's block table and its cache view.
  void attach(request& r, const std::vector<block_id>& blocks);
  // After a step: chain keys for new full blocks, register computed full blocks, save SWA
  // snapshots at the last computed boundary.
  void commit(request& r);
  // Releases r's blocks (tail first into the eviction order) and its SWA slot.
  void release(request& r);

  block_pool& pool() { return pool_; }
  const block_pool& pool() const { return pool_; }
  swa_pool& swa() { return swa_; }
  const swa_pool& swa() const { return swa_; }
  const cache_stats& stats() const { return stats_; }
  void count_preemption() { ++stats_.preemptions; }
  int64_t ring_tokens() const { return ring_tokens_; }
  int64_t decoder_tail() const { return tail_; }

 private:
  int64_t usable_hit(const request& r, int64_t hit_blocks) const;
  // Extends a local hit of `hit` blocks with blocks fetched from the remote tier; the new hit.
  int64_t fetch_remote(const request& r, int64_t hit);

  const model::model_config& model_;
  cache_config config_;
  int64_t bs_;
  int64_t ring_tokens_;
  int64_t tail_;
  block_pool pool_;
  swa_pool swa_;
  cache_stats stats_;
};

}  // namespace shoal::runtime
