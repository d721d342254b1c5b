// Everything one engine does with its caches for a request: admission (longest cached
// prefix, SWA restore from a snapshot or bounded-replay set-up, block allocation for the
// first chunk), growth of the block table, registering full blocks and SWA snapshots after
// a step, and release. A plain state machine over block_pool and swa_pool.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <chrono>
#include <utility>

#include "runtime/base/clock.hpp"
#include "runtime/core/handoff.hpp"
#include "runtime/base/transport.hpp"
#include "model/config.hpp"
#include "model/kv_format.hpp"
#include "runtime/core/block_pool.hpp"
#include "runtime/core/remote_blocks.hpp"
#include "runtime/core/request.hpp"
#include "runtime/core/stats.hpp"
#include "runtime/core/swa_pool.hpp"

namespace shoal::runtime {

struct cache_config {
  int64_t num_blocks = 1024;
  bool prefix_caching = true;
  // false: blocks are counted, never written (no payload memory): the cluster simulator runs
  // the engine's state machines at DeepSeek scale without a forward pass.
  bool payload = true;
  // The stored form of the paged cache (engine.kv_dtype), and its memory: the compute
  // backend's (null: host memory made here in kv_dtype).
  model::kv_dtype kv_dtype = model::kv_dtype::bf16;
  std::shared_ptr<model::kv_pages> pages;
  bool exact_swa = false;             // swa_mode == exact
  int64_t swa_slots = 256;            // live SWA slots (running shoal_flash sequences)
  int64_t swa_snapshots = 1024;
  swa_storage snapshot_storage = swa_storage::mxfp8;
  // Second tier behind the pool (the KV-cache storage cluster); null = local blocks only.
  std::shared_ptr<remote_blocks> remote;
  double remote_timeout_s = 5.0;      // a request waits this long for the tier, then recomputes
  // shoal_flash: the machine's SWA slot store (shared by its engines; null = a private one of
  // swa_snapshots slots) and the other machines' stores (null = none).
  std::shared_ptr<swa_store> swa_machine_store;
  std::shared_ptr<remote_swa> swa_remote;
  double swa_timeout_s = 2.0;         // a request waits this long for a slot, then replays
  std::shared_ptr<const clock> time = default_clock();
};

// Positions of raw entries each sequence's rings hold: the window plus the retained backtrack
// (shoal_flash; exact_swa keeps a block more); 0 for deepseek_v3, whose entries all go to blocks.
int64_t ring_tokens_for(const model::model_config& model, const cache_config& config);
// Tokens a sequence can move back (rejected speculative drafts) with its window intact: what
// the ring holds beyond the window (and a compress run) the next token reads.
int64_t max_backtrack(const model::model_config& model, const cache_config& config);

class cache_manager {
 public:
  cache_manager(const model::model_config& model, const cache_config& config);
  // Waits (bounded by the tier's own timeouts) for fetches still writing into the pool.
  ~cache_manager();
  cache_manager(const cache_manager&) = delete;
  cache_manager& operator=(const cache_manager&) = delete;

  // Blocks needed so that positions [0, upto) are covered.
  int64_t blocks_for(int64_t upto) const { return (upto + bs_ - 1) / bs_; }
  bool can_admit(const request& r) const;
  // Sets up r's caches for computing its tokens: prefix hit (blocks touched, SWA restored or
  // replay planned), rings, decoder tail. Allocates no blocks for the new tokens.
  void admit(request& r);
  // Remote tier, admission step 1 (never blocks): when a tier is set, r was never looked up
  // there, and blocks past its local hit could be hit, pins the local hit, reserves free
  // blocks for the keys past it (keeping one block free) and starts the tier's read into
  // them. True when r must now wait (request_status::waiting_for_remote_kv); false with
  // nothing held otherwise (admit it as usual).
  // Then (shoal_flash, once per request) when no snapshot here covers the end of r's hit and
  // other machines' stores are set: asks them for the deepest slot of the hit; r waits the
  // same way (its hit pinned) and the arrived slot is stored here, so admit() restores it.
  bool try_start_remote(request& r);
  // Requests whose read finished, failed or passed its deadline since the last call, in the
  // order they started. Their blocks are back in the pool (the fetched ones cached), so
  // admit() takes them as a local hit; after a deadline the blocks stay reserved until the
  // tier lets go of them, and the request recomputes.
  std::vector<request*> poll_remote();
  // r stops waiting (aborted): its read is abandoned.
  void abandon_remote(request& r);
  // Handoff, decode side (never blocks): reserves pool blocks for [0, s.computed) (and an
  // SWA slot) and starts reading s's blocks and rings into them through `t`. False, nothing
  // held, when there is no room. `s` must have passed validate_handoff.
  bool start_import(request& r, const handoff_state& s, transport& t, std::chrono::milliseconds timeout);
  // Requests whose reads all ended since the last call, and whether every byte arrived
  // intact: then r holds the cache exactly as the prefill engine had it; else r holds nothing
  // and recomputes from its tokens.
  std::vector<std::pair<request*, bool>> poll_imports();
  // r stops waiting (aborted): the reads keep their own buffers until they end.
  void abandon_import(request& r);
  // A handoff whose bytes the caller already placed (the simulator, payload off): reserves
  // and attaches blocks for [0, computed) and sets r up as a completed import leaves it. False,
  // nothing held, when fewer than blocks_for(computed) + 1 blocks (or no SWA slot) are free.
  bool adopt(request& r, int64_t computed);
  size_t imports_out() const { return imports_.size(); }
  // Why a handoff cannot continue on this engine ("" when it can): shapes that differ from
  // this engine's model and cache layout, counts that do not add up. Its KV format must be
  // format() already (the engine refuses another one with a code and counter of its own).
  std::string validate_handoff(const handoff_state& s) const;
  // Remote reads not yet let go by the tier, also those no request waits on any more.
  size_t remote_reads_out() const { return waits_.size() + slot_waits_.size(); }
  // Seconds of the last (≤ 1024) slot fetches that arrived, oldest first.
  std::vector<double> swa_fetch_seconds() const;
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
  // The paged memory's format, the memory (null when payload is off) and block b's bytes in it.
  const model::kv_format& format() const { return format_; }
  const model::kv_pages* pages() const { return pages_.get(); }
  std::span<std::byte> block_bytes(block_id b);
  swa_pool& swa() { return swa_; }
  const swa_pool& swa() const { return swa_; }
  const cache_stats& stats() const { return stats_; }
  void count_preemption() { ++stats_.preemptions; }
  int64_t ring_tokens() const { return ring_tokens_; }
  int64_t decoder_tail() const { return tail_; }

 private:
  int64_t usable_hit(const request& r, int64_t hit_blocks) const;
  void fix_decoder_tail(request& r) const;
  int64_t local_hit(const std::vector<block_key>& keys) const;

  // A remote read of one request; `r` is null once the request stopped waiting (deadline,
  // abort) and only the reserved blocks wait for the tier to let go.
  struct remote_wait {
    request* r = nullptr;
    std::shared_ptr<remote_fetch> fetch;
    std::vector<block_key> keys;      // of the reserved blocks
    std::vector<block_id> pinned;     // the local hit the read extends
    std::vector<block_id> reserved;   // keys[i] is read into reserved[i]
    double deadline_s = 0;
  };
  void end_wait(remote_wait& w, bool use_blocks);
  bool start_block_read(request& r);
  bool start_slot_read(request& r);
  void poll_slots(std::vector<request*>& ready);

  struct slot_wait {
    request* r = nullptr;
    std::shared_ptr<slot_fetch> fetch;
    std::vector<block_key> keys;   // asked for, prefix order: keys[i] ends at (base + i + 1) blocks
    int64_t base = 0;
    std::vector<block_id> pinned;  // the hit the slot would restore
    double deadline_s = 0;
  };
  std::vector<slot_wait> slot_waits_;
  std::vector<double> fetch_s_;    // ring of slot fetch times
  size_t fetch_next_ = 0;

  struct import_wait {
    request* r = nullptr;  // null once aborted
    std::vector<block_id> reserved;
    std::vector<std::vector<uint8_t>> rings;  // (streams) read here, moved into r's cache
    std::vector<std::shared_ptr<transfer>> reads;
    handoff_state state;  // scalars and floors (its descriptors are not used again)
    std::chrono::steady_clock::time_point started;
    uint64_t bytes = 0;
  };
  std::vector<import_wait> imports_;

  const model::model_config& model_;
  cache_config config_;
  int64_t bs_;
  int64_t ring_tokens_;
  int64_t tail_;
  block_pool pool_;
  model::kv_format format_;
  std::shared_ptr<model::kv_pages> pages_;
  swa_pool swa_;
  cache_stats stats_;
  std::vector<remote_wait> waits_;  // start order
};

}  // namespace shoal::runtime
