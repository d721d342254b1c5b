// Admission, growth, commit and release of a request's caches. The prefix hit is the
// longest run of cached full blocks, capped so at least one token is computed and, for
// shoal_flash, so that the decoder tail is made of new tokens (the decoder window is never
// persisted). The SWA window at the hit comes from a snapshot, or (compact mode) from
// bounded replay of the last replay_tokens of the hit prefix.
#include "runtime/cache_manager.hpp"

#include <algorithm>

#include "kernels/assert.hpp"

namespace shoal::runtime {

cache_manager::cache_manager(const model::model_config& model, const cache_config& config)
    : model_(model), config_(config), bs_(model.block_size),
      ring_tokens_(model.is_flash()
                       ? std::max({model::min_ring_tokens(model),
                                   config.exact_swa ? model.window() + model.block_size : model.retained_tokens,
                                   model.window()})
                       : model::min_ring_tokens(model)),
      tail_(model.is_flash() ? (config.exact_swa ? model::exact_decoder_tail(model) : model.replay_tokens) : 0),
      pool_(static_cast<int32_t>(config.num_blocks), model::block_floats(model)),
      swa_(config.swa_slots, config.swa_snapshots, model.encoder_layers(), model.entry_dim(),
           model.window(), config.snapshot_storage) {}

bool cache_manager::can_admit(const request& r) const {
  return !model_.is_flash() || swa_.can_acquire();
}

int64_t cache_manager::usable_hit(const request& r, int64_t hit_blocks) const {
  int64_t n = r.num_tokens();
  int64_t cap = n - 1;  // compute at least the last token
  // Exact mode: the decoder tail must be new tokens (its h_E is not cached). Compact mode
  // replays the window, which also recomputes h_E of the tail when the hit reaches into it.
  if (model_.is_flash() && config_.exact_swa) cap = std::min(cap, r.dec_from);
  return std::min(hit_blocks, cap / bs_);
}

void cache_manager::admit(request& r) {
  SHOAL_ASSERT(r.blocks.empty() && can_admit(r));
  r.cache.init(model_, ring_tokens_);
  r.keys = chain_keys(r.tokens, static_cast<int>(bs_));
  r.blocks_cached = 0;
  r.swa_approx = false;
  r.snapshot_at = -1;
  r.blocks_valid_until = 0;
  int64_t n = r.num_tokens();
  if (r.dec_from < 0) r.dec_from = model_.is_flash() ? std::max<int64_t>(0, n - tail_) : 0;
  if (model_.is_flash()) swa_.acquire();
  ++stats_.lookups;
  stats_.prompt_tokens += static_cast<uint64_t>(n);
  int64_t hit = 0;
  if (config_.prefix_caching)
    while (hit < static_cast<int64_t>(r.keys.size()) && pool_.lookup(r.keys[hit])) ++hit;
  if (config_.prefix_caching && config_.remote) hit = fetch_remote(r, hit);
  hit = usable_hit(r, hit);
  int64_t start = hit * bs_;  // first position to compute
  if (model_.is_flash() && hit > 0) {
    if (config_.exact_swa) {
      // Exact mode: the hit must end where a snapshot of the window exists.
      while (hit > 0 && !swa_.contains(r.keys[hit - 1])) --hit;
      start = hit * bs_;
      if (hit > 0) swa_.restore(r.keys[hit - 1], r.cache, start), ++stats_.swa_restores;
    } else if (start <= r.dec_from && swa_.restore(r.keys[hit - 1], r.cache, start)) {
      ++stats_.swa_restores;
    } else {
      // Bounded replay: recompute the window from the last replay_tokens of the hit prefix
      // with attention truncated there; the blocks of the prefix are reused untouched.
      int64_t replay_from = std::max<int64_t>(0, start - model_.replay_tokens);
      r.blocks_valid_until = start;
      for (int64_t s = 0; s < model_.encoder_layers() + 1; ++s) r.cache.ring_floor[s] = replay_from;
      r.swa_approx = replay_from > 0;
      start = replay_from;
      ++stats_.replays;
    }
  }
  std::vector<block_id> hits;
  for (int64_t i = 0; i < hit; ++i) hits.push_back(*pool_.lookup(r.keys[i]));
  pool_.touch(hits);
  attach(r, hits);
  r.blocks_cached = hit;
  r.cached_tokens = hit * bs_;
  stats_.hit_tokens += static_cast<uint64_t>(r.cached_tokens);
  r.cache.computed = start;
}

bool cache_manager::can_grow(const request& r, int64_t upto, int64_t pending_blocks) const {
  int64_t need = blocks_for(upto) - static_cast<int64_t>(r.blocks.size()) - pending_blocks;
  return need <= 0 || pool_.can_allocate(static_cast<int32_t>(need));
}

std::vector<block_id> cache_manager::take_blocks(int64_t n) {
  if (n <= 0) return {};
  return pool_.allocate(static_cast<int32_t>(n));
}

void cache_manager::give_back(const std::vector<block_id>& blocks) {
  std::vector<block_id> rev(blocks.rbegin(), blocks.rend());
  pool_.release(rev);
}

void cache_manager::attach(request& r, const std::vector<block_id>& blocks) {
  for (block_id b : blocks) {
    r.blocks.push_back(b);
    r.cache.blocks.push_back(pool_.data(b));
  }
}

void cache_manager::commit(request& r) {
  int64_t computed = r.computed();
  while (static_cast<int64_t>(r.keys.size() + 1) * bs_ <= r.num_tokens()) {
    block_key prev = r.keys.empty() ? block_key{} : r.keys.back();
    size_t off = r.keys.size() * static_cast<size_t>(bs_);
    r.keys.push_back(chain_key(prev, std::span<const int32_t>(r.tokens).subspan(off, bs_)));
  }
  if (r.computed() < r.blocks_valid_until) return;  // mid-replay: nothing new is exact yet
  int64_t full = std::min<int64_t>(computed / bs_, static_cast<int64_t>(r.keys.size()));
  // Entries computed after an approximate (replayed) window are not exact: keep them out of
  // the prefix cache so no later request reads approximate data as exact.
  if (config_.prefix_caching && !r.swa_approx)
    for (; r.blocks_cached < full; ++r.blocks_cached) {
      block_id b = r.blocks[r.blocks_cached];
      pool_.cache_block(b, r.keys[r.blocks_cached]);
      if (config_.remote) {
        bool queued = config_.remote->store_async(r.keys[r.blocks_cached], {pool_.data(b), pool_.block_floats()},
                                                   r.traffic_class);
        ++(queued ? stats_.remote_stored : stats_.remote_dropped);
      }
    }
  // Window snapshot at the last computed boundary, while the ring still holds it.
  int64_t p = full * bs_;
  if (model_.is_flash() && config_.prefix_caching && !r.swa_approx && full > 0 && p > r.snapshot_at &&
      computed - p <= ring_tokens_ - model_.window()) {
    swa_.save(r.keys[full - 1], r.cache, p);
    r.snapshot_at = p;
  }
}

int64_t cache_manager::fetch_remote(const request& r, int64_t hit) {
  auto keys = std::span<const block_key>(r.keys).subspan(static_cast<size_t>(hit));
  if (keys.empty()) return hit;
  // The blocks a request computes are its own; fetched ones are taken from the free list the
  // same way, and only while it keeps a block free for the request's own compute.
  int64_t wanted = static_cast<int64_t>(config_.remote->lookup(keys));
  if (wanted == 0) return hit;
  // The local hit's blocks are free cached blocks: pinned while blocks are taken for the
  // fetch, so that taking them cannot evict the prefix the fetch extends.
  std::vector<block_id> pinned;
  for (int64_t i = 0; i < hit; ++i) pinned.push_back(*pool_.lookup(r.keys[static_cast<size_t>(i)]));
  pool_.touch(pinned);
  const auto n = static_cast<int32_t>(std::min<int64_t>(wanted, pool_.num_free() - 1));  // one kept free
  std::vector<block_id> taken = n > 0 ? pool_.allocate(n) : std::vector<block_id>{};
  std::vector<std::span<float>> dsts;
  for (block_id b : taken) dsts.emplace_back(pool_.data(b), pool_.block_floats());
  auto fetched = static_cast<int64_t>(taken.empty() ? 0 : config_.remote->fetch_many(keys.first(taken.size()), dsts));
  if (fetched < static_cast<int64_t>(taken.size())) ++stats_.remote_fetch_failures;
  for (int64_t i = 0; i < fetched; ++i) pool_.cache_block(taken[static_cast<size_t>(i)], keys[static_cast<size_t>(i)]);
  give_back(taken);  // fetched ones are now cached free blocks: the lookup below takes them like any local hit
  give_back(pinned);
  int64_t extended = hit;
  while (extended < hit + fetched && pool_.lookup(r.keys[extended])) ++extended;
  stats_.remote_hit_tokens += static_cast<uint64_t>((extended - hit) * bs_);
  return extended;
}

void cache_manager::release(request& r) {
  give_back(r.blocks);
  r.blocks.clear();
  r.cache.blocks.clear();
  r.blocks_cached = 0;
  r.blocks_valid_until = 0;
  if (model_.is_flash()) swa_.release();
}

}  // namespace shoal::runtime
