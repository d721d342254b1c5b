// The simulated cluster's compute: engine pools and CPU sharing among their ranks.
#include "sim/cluster_run.hpp"

#include <algorithm>
#include <cmath>

namespace shoal::sim::detail {

// CPU sharing. Ranks on cores of their own pool (pool.cores) or of the host (host_cores) share
// them as a processor-sharing server of engine processes (a process's ranks share its one
// kernel thread pool, and a step model times one process using the cores): while k processes
// compute at once on c cores, each has min(1, c / k) of full speed, divided among the groups
// stepping in it. A lockstep group's step is work-conserving within the group (a rank that
// waits at an exchange leaves the cores to the others), so it needs the sum of its ranks'
// times at the capacity of its processes: Σ t / (its processes) of work at that rate (one
// rank a process, equal loads: t at min(1, c / k), as for ranks stepping alone). Every step in
// flight is re-timed when a step starts or ends. 0: this group's cores are its own.
int64_t cluster::shared_cores(const group_state& gs) const {
  const pool_profile& pp = gs.prefill ? prof_.prefill : prof_.decode;
  return pp.cores > 0 ? pp.cores : prof_.host_cores;
}

bool cluster::shares_with(const group_state& gs, const group_state& o) const {
  const pool_profile& pp = gs.prefill ? prof_.prefill : prof_.decode;
  return pp.cores == 0 || o.prefill == gs.prefill;
}

// A step's progress rate (see above): its processes' share of the cores, divided by the most
// groups stepping at once in one of them.
double cluster::share_rate(const group_state& gs) const {
  busy_groups_.assign(static_cast<size_t>(processes_), 0);
  for (const auto& o : groups_)
    if (o.stepping && shares_with(gs, o))
      for (int32_t p : o.processes) ++busy_groups_[static_cast<size_t>(p)];
  int64_t busy = 0, crowd = 1;
  for (int64_t n : busy_groups_) busy += n > 0;
  for (int32_t p : gs.processes) crowd = std::max(crowd, busy_groups_[static_cast<size_t>(p)]);
  return std::min(1.0, static_cast<double>(shared_cores(gs)) / static_cast<double>(std::max<int64_t>(1, busy))) /
         static_cast<double>(crowd);
}

// Before the set of computing ranks changes: charge each step in flight for the time since.
void cluster::advance_shared(const group_state& gs, double now) {
  if (shared_cores(gs) == 0) return;
  for (auto& o : groups_)
    if (o.stepping && shares_with(gs, o)) {
      const double from = std::max(o.since, o.compute_from);  // its exchanges' latency first
      if (now > from) o.work_left = std::max(0.0, o.work_left - (now - from) * share_rate(o));
      o.since = now;
    }
}

// After it changed: every step in flight on those cores ends when its work is done at the new rate.
void cluster::reschedule_shared(const group_state& gs, double now) {
  for (size_t i = 0; i < groups_.size(); ++i) {
    group_state& o = groups_[i];
    if (o.stepping && shares_with(gs, o))
      push(std::max(now, o.compute_from) + o.work_left / share_rate(o), ev::step_end, static_cast<int64_t>(i), ++o.epoch);
  }
}

void cluster::build_pool(bool prefill, int64_t n, int64_t ep) {
  const std::vector<int64_t>& sizes = prefill ? c_.prefill_processes : c_.decode_processes;
  std::vector<int32_t> process_of;  // rank index in the pool → process
  for (int64_t size : sizes) {
    for (int64_t k = 0; k < size; ++k) process_of.push_back(processes_);
    ++processes_;
  }
  while (static_cast<int64_t>(process_of.size()) < n) process_of.push_back(processes_++);
  for (int64_t g = 0; g < n / ep; ++g) {
    group_state gs;
    gs.prefill = prefill;
    gs.rng.seed(c_.seed * 6364136223846793005ull + groups_.size() * 1442695040888963407ull + 1);
    for (int64_t k = 0; k < ep; ++k) {
      rank_state r;
      r.prefill = prefill;
      r.group = static_cast<int32_t>(groups_.size());
      r.index = static_cast<int32_t>(g * ep + k);
      r.process = process_of[static_cast<size_t>(r.index)];
      if (std::ranges::find(gs.processes, r.process) == gs.processes.end()) gs.processes.push_back(r.process);
      fresh_engine(r);
      gs.ranks.push_back(static_cast<int32_t>(ranks_.size()));
      ranks_.push_back(std::move(r));
    }
    gs.members = gs.placed_on = gs.ranks;
    gs.placement = runtime::ep_placement::contiguous(1, sim_experts, static_cast<int32_t>(gs.members.size()));
    groups_.push_back(std::move(gs));
  }
}

// A rank's cache manager and scheduler as a (re)started engine has them: empty.
void cluster::fresh_engine(rank_state& r) {
  const pool_profile& pp = r.prefill ? prof_.prefill : prof_.decode;
  r.sched.reset();
  r.reqs.clear();
  r.imports.clear();
  r.leases = runtime::handoff_leases(planted_lease_bug());
  runtime::cache_config cc;
  cc.num_blocks = pp.kv_blocks;
  cc.payload = false;
  cc.swa_slots = pp.max_running + 8;
  cc.swa_snapshots = 128;
  cc.time = std::shared_ptr<const runtime::clock>(&clock_, [](const runtime::clock*) {});
  if (r.prefill && storage_) cc.remote = storage_, cc.remote_timeout_s = prof_.storage.timeout_s;
  // The old cache manager waits for its reads when it goes: a rank that crashed alone ends them.
  if (r.prefill && storage_ && r.caches) storage_->fail_rank(r.index);
  r.caches = std::make_unique<runtime::cache_manager>(prof_.model, cc);
  runtime::scheduler_config sc;
  sc.token_budget = pp.token_budget;
  sc.max_running = pp.max_running;
  sc.step_time_budget_s = pp.step_time_budget_s;
  sc.cost = pp.step;
  r.sched = std::make_unique<runtime::scheduler>(sc, *r.caches);
  r.plan = {};
  r.load = 0;
}

// DSpark on a speculating pool: each decode in the plan verifies up to `k` drafts (no more than
// its output has left), with the blocks they need when the pool has them, as the engine's
// add_drafts sizes them for a fixed verify length.
void cluster::add_drafts(rank_state& r, int64_t k) {
  for (auto& it : r.plan.items) {
    runtime::request& q = *it.req;
    if (it.n_tokens != 1 || q.computed() != q.num_tokens() - 1) continue;
    int64_t n = std::min<int64_t>(k, q.params.max_tokens - q.output_len() - 1);
    const int64_t held = static_cast<int64_t>(q.blocks.size() + it.new_blocks.size());
    auto extra = [&](int64_t d) { return std::max<int64_t>(0, r.caches->blocks_for(q.computed() + 1 + d) - held); };
    while (n > 0 && extra(n) > r.caches->pool().num_free()) --n;
    if (n <= 0) continue;
    auto more = r.caches->take_blocks(extra(n));
    it.new_blocks.insert(it.new_blocks.end(), more.begin(), more.end());
    it.drafts = n;
    it.n_tokens += n;
    r.plan.tokens += n;
  }
}

}  // namespace shoal::sim::detail
