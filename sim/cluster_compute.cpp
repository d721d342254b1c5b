// The simulated cluster's compute: engine pools and CPU sharing among their ranks.
#include "sim/cluster_run.hpp"

#include <algorithm>
#include <cmath>

namespace shoal::sim::detail {

// CPU sharing. Ranks on cores of their own pool (pool.cores) or of the host (host_cores) share
// them as a processor-sharing server: while k ranks compute at once on c cores, each step
// progresses at min(1, c / k) of full speed, and every step in flight is re-timed when a step
// starts or ends. 0: this group's cores are its own.
int64_t cluster::shared_cores(const group_state& gs) const {
  const pool_profile& pp = gs.prefill ? prof_.prefill : prof_.decode;
  return pp.cores > 0 ? pp.cores : prof_.host_cores;
}

bool cluster::shares_with(const group_state& gs, const group_state& o) const {
  const pool_profile& pp = gs.prefill ? prof_.prefill : prof_.decode;
  return pp.cores == 0 || o.prefill == gs.prefill;
}

double cluster::share_rate(const group_state& gs) const {
  int64_t busy = 0;
  for (const auto& o : groups_)
    if (o.stepping && shares_with(gs, o)) busy += static_cast<int64_t>(o.ranks.size());
  return std::min(1.0, static_cast<double>(shared_cores(gs)) / static_cast<double>(std::max<int64_t>(1, busy)));
}

// Before the set of computing ranks changes: charge each step in flight for the time since.
void cluster::advance_shared(const group_state& gs, double now) {
  if (shared_cores(gs) == 0) return;
  const double rate = share_rate(gs);
  for (auto& o : groups_)
    if (o.stepping && shares_with(gs, o)) o.work_left = std::max(0.0, o.work_left - (now - o.since) * rate), o.since = now;
}

// After it changed: every step in flight on those cores ends when its work is done at the new rate.
void cluster::reschedule_shared(const group_state& gs, double now) {
  const double rate = share_rate(gs);
  for (size_t i = 0; i < groups_.size(); ++i) {
    group_state& o = groups_[i];
    if (o.stepping && shares_with(gs, o)) push(now + o.work_left / rate, ev::step_end, static_cast<int64_t>(i), ++o.epoch);
  }
}

void cluster::build_pool(bool prefill, int64_t n, int64_t ep) {
  for (int64_t g = 0; g < n / ep; ++g) {
    group_state gs;
    gs.prefill = prefill;
    gs.rng.seed(c_.seed * 6364136223846793005ull + groups_.size() * 1442695040888963407ull + 1);
    for (int64_t k = 0; k < ep; ++k) {
      rank_state r;
      r.prefill = prefill;
      r.group = static_cast<int32_t>(groups_.size());
      r.index = static_cast<int32_t>(g * ep + k);
      fresh_engine(r);
      gs.ranks.push_back(static_cast<int32_t>(ranks_.size()));
      ranks_.push_back(std::move(r));
    }
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

}  // namespace shoal::sim::detail
