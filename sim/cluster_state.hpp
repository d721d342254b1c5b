// The simulator's state types (the run of sim/cluster_run.hpp is their one user): the
// virtual clock, the event queue, the storage tier, and the state of ranks, groups, requests
// and pools. Internal to sim/.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <queue>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/core/cache_manager.hpp"
#include "runtime/core/handoff_leases.hpp"
#include "runtime/core/relay.hpp"
#include "runtime/base/clock.hpp"
#include "runtime/placement/decode_placement.hpp"
#include "runtime/placement/expert_placement.hpp"
#include "runtime/base/metrics.hpp"
#include "runtime/core/remote_blocks.hpp"
#include "runtime/core/scheduler.hpp"
#include "sim/cluster_sim.hpp"

namespace shoal::sim::detail {

class sim_clock final : public runtime::clock {
 public:
  double now_s() const override { return t_; }
  void set(double t) { t_ = t; }

 private:
  double t_ = 0;
};

enum class ev {
  arrive, step_end, fetch_done,
  // a message or timer of the protocol (runtime/core/relay.hpp, handoff_leases.hpp): a = its
  // key in the run's table of deferred calls
  call,
  // faults (sim/faults.hpp): a node fault begins / ends (a = its index in the schedule); a hang
  // outlasts the heartbeat timeout; a hung group may step again
  fault_start, fault_end, declare_down, wake
};

struct event {
  double t;
  uint64_t seq;
  ev kind;
  int64_t a;
  uint64_t epoch = 0;  // step_end: the group's epoch it was scheduled in (a later one supersedes it)
  bool operator>(const event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

using event_queue = std::priority_queue<event, std::vector<event>, std::greater<event>>;

// The storage tier: one LRU over the cluster's capacity; a fetch finds the leading run of
// keys it holds (written at least write_delay_s ago) and completes after latency + bytes /
// bandwidth, times a seeded log-normal jitter.
class sim_storage final : public runtime::remote_blocks {
 public:
  sim_storage(const storage_model& m, double block_bytes, const sim_clock& clock, uint64_t seed,
              std::function<void(double, int64_t)> schedule)
      : m_(m), block_bytes_(block_bytes), clock_(clock), rng_(seed ^ 0x5707a6e5ull), schedule_(std::move(schedule)) {}

  std::shared_ptr<runtime::remote_fetch> start_fetch(std::vector<runtime::block_key> keys,
                                                     std::vector<std::span<std::byte>>,
                                                     const model::kv_format&) override {
    const double now = clock_.now_s();
    size_t n = 0;
    while (n < keys.size()) {
      auto it = index_.find(keys[n]);
      if (it == index_.end() || it->second.ready_s > now) break;
      if (it->second.damaged) {
        if (!skip_checksum) {  // the checksum fails: a miss from here on, and the chunk is dropped
          ++damaged_caught;
          lru_.erase(it->second.pos);
          index_.erase(it);
          break;
        }
        ++wrong_blocks;  // planted bug: served as if intact
      }
      lru_.splice(lru_.begin(), lru_, it->second.pos);
      ++n;
    }
    ++lookups;
    hit_blocks += n;
    double t = m_.read_latency_s + static_cast<double>(n) * block_bytes_ * 8 / (m_.read_gbps * 1e9);
    if (m_.jitter > 0) t *= std::exp(m_.jitter * normal_(rng_));
    auto f = std::make_shared<runtime::remote_fetch>();
    const int64_t id = next_id_++;
    pending_.emplace(id, pending{f, n, current_group, current_rank});
    schedule_(now + t, id);
    return f;
  }
  bool store_async(const runtime::block_key& key, std::span<const std::byte>, const model::kv_format&,
                   runtime::traffic_class) override {
    if (m_.capacity_blocks <= 0) return true;
    if (faults && (clock_.now_s() < full_until || faults->fire(runtime::fault_point::disk_full))) {
      ++dropped_writes;  // no space: the write is dropped, the block stays computed where it is
      return false;
    }
    auto it = index_.find(key);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.pos);
      return true;
    }
    lru_.push_front(key);
    index_.emplace(key, entry{lru_.begin(), clock_.now_s() + m_.write_delay_s,
                              faults && faults->fire(runtime::fault_point::storage_corrupt)});
    while (static_cast<int64_t>(index_.size()) > m_.capacity_blocks) {
      index_.erase(lru_.back());
      lru_.pop_back();
    }
    return true;
  }
  // Completes fetch `id`; returns the group of the rank that started it (none: the fetch
  // was failed when its node went down).
  std::optional<size_t> complete(int64_t id) {
    auto it = pending_.find(id);
    if (it == pending_.end()) return std::nullopt;
    it->second.fetch->complete(it->second.blocks, it->second.blocks);
    const size_t g = it->second.group;
    pending_.erase(it);
    return g;
  }
  // The node of group g crashed: its reads end now, as failures (its cache manager goes).
  void fail_group(size_t g) {
    fail_if([g](const pending& p) { return p.group == g; });
  }
  // Prefill rank `index` crashed on its own (a rank fault in its group): the same for its reads.
  void fail_rank(int32_t index) {
    fail_if([index](const pending& p) { return p.rank == index; });
  }
  template <class Pred>
  void fail_if(Pred pred) {
    for (auto it = pending_.begin(); it != pending_.end();)
      if (pred(it->second)) {
        it->second.fetch->complete(it->second.blocks, 0, "reader crashed");
        it = pending_.erase(it);
      } else {
        ++it;
      }
  }
  // Damages about `n` stored chunks after their checksums were taken (a corrupt fault).
  void damage(int64_t n) {
    if (index_.empty() || !faults) return;
    const double p = std::min(1.0, static_cast<double>(n) / static_cast<double>(index_.size()));
    for (const auto& key : lru_)
      if (faults->uniform(runtime::fault_point::storage_corrupt) < p) index_.at(key).damaged = true;
  }
  uint64_t lookups = 0, hit_blocks = 0;
  size_t current_group = 0;  // the group whose ranks plan now (set by the event loop)
  int32_t current_rank = -1;  // and the prefill rank (its index in the pool) that plans now
  // Faults: the run's injector (null: none), a full disk until, the planted bug, counts.
  runtime::fault_injector* faults = nullptr;
  double full_until = -1;
  bool skip_checksum = false;
  int64_t wrong_blocks = 0, damaged_caught = 0, dropped_writes = 0;

 private:
  struct entry {
    std::list<runtime::block_key>::iterator pos;
    double ready_s;
    bool damaged = false;  // bytes changed after the checksum was taken
  };
  struct pending {
    std::shared_ptr<runtime::remote_fetch> fetch;
    size_t blocks;
    size_t group;
    int32_t rank;
  };
  storage_model m_;
  double block_bytes_;
  const sim_clock& clock_;
  std::mt19937_64 rng_;
  std::normal_distribution<double> normal_;
  std::function<void(double, int64_t)> schedule_;
  std::list<runtime::block_key> lru_;  // front = most recent
  std::unordered_map<runtime::block_key, entry, runtime::block_key_hash> index_;
  std::unordered_map<int64_t, pending> pending_;
  int64_t next_id_ = 0;
};

// A KV handoff a decode rank took and is reading (DISAGG.md): its reserved copy, the prefill
// rank that lends it (and that rank's incarnation and lease), and a number that makes the
// read's completion stale once the import ended otherwise.
struct import_state {
  std::unique_ptr<runtime::request> copy;
  int32_t lender = -1;             // global rank index
  uint64_t lender_incarnation = 0;
  uint64_t lease = 0;
  uint64_t epoch = 0;
  bool done = false;               // the read ended (a later delivery is a duplicate)
};

// One engine rank: its cache manager and scheduler, the requests it holds (running, waiting
// or lent under a lease), the prefill side's leases and the decode side's imports.
struct rank_state {
  bool prefill = true;
  int32_t group = 0;
  int32_t index = 0;  // within its pool
  int32_t process = 0;  // the engine process it runs in (its ranks share one kernel thread pool)
  uint64_t incarnation = 0;  // bumped when its process restarts (a new engine to the relays)
  int down = 0;  // its own process crashed or hung past the heartbeat timeout (a count: faults may overlap)
  // What it brings to its group's re-formation when it comes back (runtime/placement/regroup.hpp):
  // the placement it ran and the ranks that placement named (empty: a restarted process, which
  // brings nothing and holds nothing).
  runtime::ep_placement ran = runtime::ep_placement::contiguous(1, 1, 1);
  std::vector<int32_t> ran_on;
  std::unique_ptr<runtime::cache_manager> caches;
  std::unique_ptr<runtime::scheduler> sched;
  runtime::step_plan plan;
  double load = 0;                       // this step's compute beyond the fixed part
  std::unordered_map<int64_t, std::unique_ptr<runtime::request>> reqs;
  runtime::handoff_leases leases;
  std::unordered_map<int64_t, import_state> imports;
  int64_t placed = 0;
  int64_t importing_kv() const {
    int64_t kv = 0;
    for (const auto& [id, im] : imports) kv += im.copy->num_tokens();
    return kv;
  }
};

struct group_state {
  bool prefill = true;
  std::vector<int32_t> ranks;  // indices into the sim's ranks
  std::vector<int32_t> processes;  // the engine processes its ranks run in
  // Expert parallelism: the ranks in the group now (those not down on their own, in order) and
  // the placement the group routes by, over them (runtime/placement/expert_placement.hpp,
  // contiguous blocks); steps wait for a re-formation (experts read, all agree) until then.
  std::vector<int32_t> members;
  runtime::ep_placement placement = runtime::ep_placement::contiguous(1, 1, 1);
  std::vector<int32_t> placed_on;  // the ranks the placement's rank indices name
  double reformed_at = 0;
  bool stepping = false;
  std::mt19937_64 rng;
  // The step in flight: when it began, whether it falls in the measured window, and, on shared
  // cores, the seconds of full-speed compute it still needs as of `since`.
  double step_start = 0, work_left = 0, since = 0;
  double compute_from = 0;  // shared cores: its exchanges' latency ends (compute progresses from then)
  bool counted = false;
  uint64_t epoch = 0;  // bumped whenever the step's end is rescheduled
  // Faults: down (crashed, partitioned or declared dead; a count, as faults may overlap),
  // hung until, step-time multiplier, when the step in flight ends.
  int down = 0;
  double hung_until = 0, slow = 1, step_end_s = 0;
};

struct pool_acc {
  int64_t steps = 0;
  double busy = 0, sum_ratio = 0, ideal = 0, actual = 0, tokens = 0;
  int64_t all_steps = 0;  // every step of the run, and their wall time
  double all_busy = 0;
  std::vector<double> ratios;
  // `group`: the stepping group's ranks' loads; `pool`: every rank of the pool.
  void add(double a, std::span<const double> group, std::span<const double> pool) {
    ++steps;
    double sum = 0, mx = 0;
    for (double l : group) sum += l, mx = std::max(mx, l);
    const double mean = group.empty() ? 0 : sum / static_cast<double>(group.size());
    const double ratio = runtime::balance_ratio(pool);
    sum_ratio += ratio;
    ratios.push_back(ratio);
    ideal += a + mean;
    actual += a + mx;
  }
  pool_summary summary() {
    pool_summary s;
    s.steps = steps;
    s.busy_s = busy;
    s.tokens = tokens;
    s.all_steps = all_steps;
    s.all_busy_s = all_busy;
    if (steps > 0) {
      s.balance_mean = sum_ratio / static_cast<double>(steps);
      s.balance_p10 = runtime::percentile(ratios, 0.10);
      s.pct_of_perfect = actual > 0 ? 100.0 * ideal / actual : 100.0;
    }
    return s;
  }
};

}  // namespace shoal::sim::detail
