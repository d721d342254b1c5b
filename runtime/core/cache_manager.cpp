// Admission, growth, commit and release of a request's caches. The prefix hit is the
// longest run of cached full blocks, capped so at least one token is computed and, for
// shoal_flash, so that the decoder tail is made of new tokens (the decoder window is never
// persisted). The SWA window at the hit comes from a snapshot, or (compact mode) from
// bounded replay of the last replay_tokens of the hit prefix.
#include "runtime/core/cache_manager.hpp"

#include <algorithm>
#include <utility>

#include "kernels/assert.hpp"
#include "runtime/base/fault_points.hpp"

namespace shoal::runtime {

int64_t ring_tokens_for(const model::model_config& model, const cache_config& config) {
  return model.is_flash() ? std::max({model::min_ring_tokens(model),
                                      config.exact_swa ? model.window() + model.block_size : model.retained_tokens,
                                      model.window()})
                          : model::min_ring_tokens(model);
}

int64_t max_backtrack(const model::model_config& model, const cache_config& config) {
  if (!model.is_flash()) return int64_t{1} << 30;
  return ring_tokens_for(model, config) - std::max(model.window() - 1, model.ratio() - 1);
}

cache_manager::cache_manager(const model::model_config& model, const cache_config& config)
    : model_(model), config_(config), bs_(model.block_size),
      ring_tokens_(ring_tokens_for(model, config)),
      tail_(model.is_flash() ? (config.exact_swa ? model::exact_decoder_tail(model) : model.replay_tokens) : 0),
      pool_(static_cast<int32_t>(config.num_blocks)),
      format_(config.pages ? config.pages->format() : model::kv_format_of(model, config.kv_dtype)),
      pages_(!config.payload ? nullptr
             : config.pages  ? config.pages
                             : std::make_shared<model::kv_pages>(format_, static_cast<int32_t>(config.num_blocks))),
      swa_(config.swa_slots, config.swa_snapshots, model.encoder_layers(), model.entry_dim(),
           model.window(), config.snapshot_storage, config.swa_machine_store) {}

cache_manager::~cache_manager() {
  for (auto& w : slot_waits_) w.fetch->cancel();  // each owns its buffer: nothing to wait for
  for (auto& w : waits_) w.fetch->cancel();
  for (auto& w : waits_) w.fetch->wait();
  for (auto& w : imports_)
    for (auto& t : w.reads) t->wait();
}

std::span<std::byte> cache_manager::block_bytes(block_id b) {
  if (!pages_) return {};  // payload off: counted, never written
  return {reinterpret_cast<std::byte*>(pages_->block(b.value)), pages_->block_bytes()};
}

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

void cache_manager::fix_decoder_tail(request& r) const {
  // From the prompt: a request resumed with output tokens (re-routed) gets the tail its first
  // admission had.
  if (r.dec_from < 0) r.dec_from = model_.is_flash() ? std::max<int64_t>(0, r.prompt_len - tail_) : 0;
}

int64_t cache_manager::local_hit(const std::vector<block_key>& keys) const {
  int64_t hit = 0;
  if (config_.prefix_caching)
    while (hit < static_cast<int64_t>(keys.size()) && pool_.lookup(keys[static_cast<size_t>(hit)])) ++hit;
  return hit;
}

void cache_manager::admit(request& r) {
  SHOAL_ASSERT(r.blocks.empty() && can_admit(r));
  r.cache.init(model_, ring_tokens_, format_.dtype);
  r.cache.pages = pages_.get();
  r.keys = chain_keys(r.tokens, static_cast<int>(bs_), r.images);
  r.blocks_cached = 0;
  r.swa_approx = false;
  r.snapshot_at = -1;
  r.blocks_valid_until = 0;
  int64_t n = r.num_tokens();
  fix_decoder_tail(r);
  if (model_.is_flash()) swa_.acquire();
  ++stats_.lookups;
  stats_.prompt_tokens += static_cast<uint64_t>(n);
  int64_t hit = usable_hit(r, local_hit(r.keys));
  int64_t start = hit * bs_;  // first position to compute
  if (model_.is_flash() && hit > 0) {
    if (config_.exact_swa) {
      // Exact mode: the hit must end where a snapshot of the window exists.
      const int64_t found = hit;
      while (hit > 0 && !swa_.contains(r.keys[hit - 1])) --hit;
      if (hit < found) ++stats_.swa_cut;
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
    r.cache.blocks.push_back(b.value);
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
        bool queued = config_.remote->store_async(r.keys[r.blocks_cached], block_bytes(b), format_, r.cls);
        ++(queued ? stats_.remote_stored : stats_.remote_dropped);
      }
    }
  // Window snapshot at the last computed boundary, while the ring still holds it.
  int64_t p = full * bs_;
  if (model_.is_flash() && config_.prefix_caching && !r.swa_approx && full > 0 && p > r.snapshot_at &&
      std::max(computed, r.spec.ring_written) - p <= ring_tokens_ - model_.window()) {
    swa_.save(r.keys[full - 1], r.cache, p);
    r.snapshot_at = p;
  }
}

bool cache_manager::try_start_remote(request& r) { return start_block_read(r) || start_slot_read(r); }

bool cache_manager::start_slot_read(request& r) {
  if (!model_.is_flash() || !config_.swa_remote || !config_.prefix_caching || r.swa_checked) return false;
  r.swa_checked = true;
  fix_decoder_tail(r);
  std::vector<block_key> keys = chain_keys(r.tokens, static_cast<int>(bs_), r.images);
  const int64_t hit = usable_hit(r, local_hit(keys));
  if (hit == 0) return false;
  int64_t from = hit - 1;  // compact mode restores at the end of the hit only
  if (config_.exact_swa) {  // exact mode: any boundary deeper than the deepest snapshot here
    while (from >= 0 && !swa_.contains(keys[static_cast<size_t>(from)])) --from;
    ++from;
    if (from == hit) return false;
  } else if (swa_.contains(keys[static_cast<size_t>(hit - 1)]) || hit * bs_ > r.dec_from) {
    return false;
  }
  slot_wait w;
  w.r = &r;
  w.base = from;
  w.keys.assign(keys.begin() + from, keys.begin() + hit);
  for (int64_t i = 0; i < hit; ++i) w.pinned.push_back(*pool_.lookup(keys[static_cast<size_t>(i)]));
  pool_.touch(w.pinned);  // the hit stays while the slot is on its way
  w.deadline_s = config_.time->now_s() + config_.swa_timeout_s;
  w.fetch = config_.swa_remote->start_fetch(w.keys, swa_.snapshot_bytes());
  ++stats_.swa_lookups;
  slot_waits_.push_back(std::move(w));
  return true;
}

void cache_manager::poll_slots(std::vector<request*>& ready) {
  const double now = config_.time->now_s();
  for (auto& w : slot_waits_) {
    if (!w.fetch->done() && now < w.deadline_s) continue;
    ready.push_back(std::exchange(w.r, nullptr));
    give_back(w.pinned);
    w.pinned.clear();
    if (!w.fetch->done()) {
      w.fetch->cancel();
      ++stats_.swa_fetch_timeouts;
      continue;
    }
    const int64_t i = w.fetch->index();
    if (i < 0) {
      if (!w.fetch->error().empty()) ++stats_.swa_fetch_failures;
      continue;
    }
    if (inject(fault_point::swa_fetch)) {  // fault point: the slot is lost on its way (replay)
      ++stats_.swa_fetch_failures;
      continue;
    }
    const bool stored = i < static_cast<int64_t>(w.keys.size()) &&
                        swa_.put_encoded(w.keys[static_cast<size_t>(i)], (w.base + i + 1) * bs_, w.fetch->bytes());
    if (!stored) {  // a slot of another shape (another model or snapshot format): replay
      ++stats_.swa_fetch_failures;
      continue;
    }
    ++stats_.swa_fetches;
    if (fetch_s_.size() < 1024) fetch_s_.push_back(w.fetch->seconds());
    else fetch_s_[fetch_next_] = w.fetch->seconds();
    fetch_next_ = (fetch_next_ + 1) % 1024;
  }
  std::erase_if(slot_waits_, [](const slot_wait& w) { return !w.r; });
}

std::vector<double> cache_manager::swa_fetch_seconds() const {
  if (fetch_s_.size() < 1024) return fetch_s_;
  std::vector<double> out(fetch_s_.begin() + static_cast<std::ptrdiff_t>(fetch_next_), fetch_s_.end());
  out.insert(out.end(), fetch_s_.begin(), fetch_s_.begin() + static_cast<std::ptrdiff_t>(fetch_next_));
  return out;
}

bool cache_manager::start_block_read(request& r) {
  if (!config_.remote || !config_.prefix_caching || r.remote_checked) return false;
  r.remote_checked = true;  // asked once per request, whatever the answer
  fix_decoder_tail(r);
  std::vector<block_key> keys = chain_keys(r.tokens, static_cast<int>(bs_), r.images);
  const int64_t hit = local_hit(keys);
  const int64_t cap = usable_hit(r, static_cast<int64_t>(keys.size()));
  if (hit >= cap) return false;
  remote_wait w;
  for (int64_t i = 0; i < hit; ++i) w.pinned.push_back(*pool_.lookup(keys[static_cast<size_t>(i)]));
  pool_.touch(w.pinned);  // taking blocks below must not evict the prefix the read extends
  const auto n = static_cast<int32_t>(std::min<int64_t>(cap - hit, pool_.num_free() - 1));  // one kept free
  if (n <= 0) {
    give_back(w.pinned);
    return false;
  }
  ++stats_.remote_lookups;
  w.r = &r;
  w.reserved = pool_.allocate(n);
  w.keys.assign(keys.begin() + hit, keys.begin() + hit + n);
  std::vector<std::span<std::byte>> dsts;
  for (block_id b : w.reserved) dsts.push_back(block_bytes(b));
  w.deadline_s = config_.time->now_s() + config_.remote_timeout_s;
  w.fetch = config_.remote->start_fetch(w.keys, std::move(dsts), format_);
  waits_.push_back(std::move(w));
  return true;
}

// Gives a read's blocks back: the fetched ones (when `use_blocks`) as cached blocks, so the
// admission that follows takes them like any local hit.
void cache_manager::end_wait(remote_wait& w, bool use_blocks) {
  if (use_blocks) {
    const size_t got = std::min(w.fetch->blocks(), w.reserved.size());
    for (size_t i = 0; i < got; ++i) pool_.cache_block(w.reserved[i], w.keys[i]);
    stats_.remote_hit_tokens += static_cast<uint64_t>(got) * static_cast<uint64_t>(bs_);
    if (w.fetch->other_format()) {  // stored by an engine of another format: a miss, not a failure
      ++stats_.remote_format_misses;
    } else if (!w.fetch->error().empty() || w.fetch->blocks() < std::min(w.fetch->listed(), w.reserved.size())) {
      ++stats_.remote_fetch_failures;
      stats_.remote_last_error = w.fetch->error().empty() ? "fewer blocks than listed" : w.fetch->error();
    }
  }
  give_back(w.reserved);
  w.reserved.clear();
}

std::vector<request*> cache_manager::poll_remote() {
  std::vector<request*> ready;
  const double now = config_.time->now_s();
  for (auto& w : waits_) {
    if (w.r && !w.fetch->done() && now < w.deadline_s) continue;
    if (w.r) {
      ready.push_back(std::exchange(w.r, nullptr));
      give_back(w.pinned);
      w.pinned.clear();
      if (!w.fetch->done()) {  // deadline: recompute; the blocks wait for the tier to let go
        w.fetch->cancel();
        ++stats_.remote_timeouts;
        continue;
      }
      end_wait(w, true);
    } else if (w.fetch->done()) {
      end_wait(w, false);
    }
  }
  std::erase_if(waits_, [](const remote_wait& w) { return !w.r && w.reserved.empty(); });
  poll_slots(ready);
  return ready;
}

void cache_manager::abandon_remote(request& r) {
  for (auto& w : waits_)
    if (w.r == &r) {
      w.r = nullptr;
      w.fetch->cancel();
      give_back(w.pinned);
      w.pinned.clear();
      if (w.fetch->done()) end_wait(w, false);
    }
  std::erase_if(waits_, [](const remote_wait& w) { return !w.r && w.reserved.empty(); });
  for (auto& w : slot_waits_)
    if (w.r == &r) {
      w.r = nullptr;
      w.fetch->cancel();
      give_back(w.pinned);
      w.pinned.clear();
    }
  std::erase_if(slot_waits_, [](const slot_wait& w) { return !w.r; });
}

std::string cache_manager::validate_handoff(const handoff_state& s) const {
  const int64_t n = static_cast<int64_t>(s.tokens.size());
  if (s.prompt_len <= 0 || s.prompt_len >= n) return "prompt_len " + std::to_string(s.prompt_len) + " with " + std::to_string(n) + " tokens";
  if (s.computed != n - 1) return "computed " + std::to_string(s.computed) + ", expected tokens - 1 = " + std::to_string(n - 1);
  if (s.ring_tokens != ring_tokens_)
    return "ring of " + std::to_string(s.ring_tokens) + " tokens, this engine's is " + std::to_string(ring_tokens_);
  if (static_cast<int64_t>(s.blocks.size()) != blocks_for(s.computed))
    return std::to_string(s.blocks.size()) + " blocks for " + std::to_string(s.computed) + " positions, expected " +
           std::to_string(blocks_for(s.computed));
  const uint64_t bytes = format_.block_bytes();
  for (size_t i = 0; i < s.blocks.size(); ++i)
    if (s.blocks[i].length != bytes)
      return "block " + std::to_string(i) + " is " + std::to_string(s.blocks[i].length) + " bytes, this engine's are " +
             std::to_string(bytes);
  model::sequence_cache probe;
  probe.init(model_, ring_tokens_, format_.dtype);
  if (s.rings.size() != probe.rings.size() || s.ring_floor.size() != probe.rings.size())
    return std::to_string(s.rings.size()) + " rings and " + std::to_string(s.ring_floor.size()) + " floors, the model has " +
           std::to_string(probe.rings.size()) + " streams";
  for (size_t i = 0; i < s.rings.size(); ++i)
    if (s.rings[i].length != probe.rings[i].size())
      return "ring " + std::to_string(i) + " is " + std::to_string(s.rings[i].length) + " bytes, expected " +
             std::to_string(probe.rings[i].size());
  if (s.dec_from < 0 || s.dec_from > n) return "dec_from " + std::to_string(s.dec_from) + " outside [0, tokens]";
  return {};
}

bool cache_manager::start_import(request& r, const handoff_state& s, transport& t, std::chrono::milliseconds timeout) {
  const int64_t need = blocks_for(s.computed);
  if (model_.is_flash() && !swa_.can_acquire()) return false;
  if (!pool_.can_allocate(static_cast<int32_t>(need + 1))) return false;  // and one block to decode into
  import_wait w;
  w.r = &r;
  w.reserved = pool_.allocate(static_cast<int32_t>(need));
  if (model_.is_flash()) swa_.acquire();
  model::sequence_cache probe;
  probe.init(model_, ring_tokens_, format_.dtype);
  w.rings = std::move(probe.rings);
  std::vector<std::span<std::byte>> dsts;  // adjacent blocks on both sides may travel as one read
  for (block_id b : w.reserved)
    dsts.push_back(block_bytes(b));
  w.reads = t.read_all(s.blocks, dsts, timeout);
  for (size_t i = 0; i < w.rings.size(); ++i)
    if (!w.rings[i].empty()) w.reads.push_back(t.read(s.rings[i], std::as_writable_bytes(std::span(w.rings[i])), timeout));
  w.started = std::chrono::steady_clock::now();
  for (const auto& m : s.blocks) w.bytes += m.length;
  for (const auto& m : s.rings) w.bytes += m.length;
  w.state = s;
  w.state.blocks.clear();
  w.state.rings.clear();
  imports_.push_back(std::move(w));
  return true;
}

std::vector<std::pair<request*, bool>> cache_manager::poll_imports() {
  std::vector<std::pair<request*, bool>> out;
  for (auto& w : imports_) {
    if (!std::all_of(w.reads.begin(), w.reads.end(), [](const auto& t) { return t->done(); })) continue;
    // Fault point kv_handoff (off unless a plan is installed): the reads fail as a lost owner's would.
    const bool ok = std::all_of(w.reads.begin(), w.reads.end(), [](const auto& t) { return t->ok(); }) &&
                    !(w.r && inject(fault_point::kv_handoff));
    if (ok && w.r) {
      auto last = w.started;
      for (const auto& t : w.reads) last = std::max(last, t->finished_at());
      stats_.import_bytes += w.bytes;
      stats_.import_reads += w.reads.size();
      stats_.import_read_s += std::chrono::duration<double>(last - w.started).count();
    }
    auto failed_with = [reads = std::move(w.reads)](errc c) {  // why the reads failed, when they did
      return std::any_of(reads.begin(), reads.end(), [c](const auto& t) { return !t->ok() && t->code() == c; });
    };
    w.reads.clear();
    if (w.r && ok) {
      request& r = *w.r;
      r.cache.init(model_, ring_tokens_, format_.dtype);
      r.cache.pages = pages_.get();
  r.cache.pages = pages_.get();
      r.cache.rings = std::move(w.rings);
      r.cache.ring_floor = w.state.ring_floor;
      attach(r, w.reserved);
      r.cache.computed = w.state.computed;
      r.keys = chain_keys(r.tokens, static_cast<int>(bs_), r.images);
      r.blocks_cached = 0;  // the next commit registers its full blocks here too
      r.blocks_valid_until = 0;
      r.swa_approx = w.state.swa_approx;
      r.snapshot_at = w.state.snapshot_at;
      r.cached_tokens = w.state.cached_tokens;
      ++stats_.imports;
    } else {
      give_back(w.reserved);
      if (model_.is_flash()) swa_.release();
      if (w.r) {
        ++stats_.import_failures;
        if (failed_with(errc::timed_out)) ++stats_.import_timeouts;
        else if (failed_with(errc::corrupt)) ++stats_.import_corrupt;
      }
    }
    w.reserved.clear();
    if (w.r) out.emplace_back(std::exchange(w.r, nullptr), ok);
  }
  std::erase_if(imports_, [](const import_wait& w) { return !w.r && w.reads.empty(); });
  return out;
}

bool cache_manager::adopt(request& r, int64_t computed) {
  const int64_t n = blocks_for(computed);
  if (n + 1 > pool_.num_free() || (model_.is_flash() && !swa_.can_acquire())) return false;
  if (model_.is_flash()) swa_.acquire();
  fix_decoder_tail(r);
  r.cache.init(model_, ring_tokens_, format_.dtype);
  r.cache.pages = pages_.get();
  attach(r, pool_.allocate(static_cast<int32_t>(n)));
  r.cache.computed = computed;
  r.keys = chain_keys(r.tokens, static_cast<int>(bs_), r.images);
  r.blocks_cached = 0;
  r.blocks_valid_until = 0;
  ++stats_.imports;
  return true;
}

void cache_manager::abandon_import(request& r) {
  for (auto& w : imports_)
    if (w.r == &r) w.r = nullptr;  // its reads end into the wait's own blocks and rings
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
