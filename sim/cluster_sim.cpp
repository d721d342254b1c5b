// The cluster simulator's event loop (cluster_sim.hpp); the class a run is: cluster_run.hpp.
#include "sim/cluster_sim.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <queue>
#include <random>
#include <tuple>
#include <unordered_map>

#include <xxhash.h>

#include "runtime/core/cache_manager.hpp"
#include "runtime/base/clock.hpp"
#include "runtime/base/ids.hpp"
#include "runtime/placement/decode_placement.hpp"
#include "runtime/base/metrics.hpp"
#include "runtime/core/remote_blocks.hpp"
#include "runtime/core/scheduler.hpp"
#include "sim/cluster_run.hpp"

namespace shoal::sim {

std::vector<policy_pair> standard_policies() {
  using runtime::prefill_policy;
  return {{"shoal", prefill_policy::tiered, "decode_balancer"},
          {"untiered", prefill_policy::untiered, "decode_balancer"},
          {"round_robin", prefill_policy::round_robin, "round_robin"},
          {"least_requests", prefill_policy::least_requests, "least_loaded"},
          {"cache_aware", prefill_policy::cache_aware, "least_loaded"},
          {"dynamo", prefill_policy::dynamo, "least_kv"}};
}

std::expected<policy_pair, std::string> policy_named(const std::string& name) {
  for (auto& p : standard_policies())
    if (p.name == name) return p;
  // "<prefill policy>+<decode placement>"
  if (auto plus = name.find('+'); plus != std::string::npos) {
    auto pre = runtime::prefill_policy_named(name.substr(0, plus));
    std::string dec = name.substr(plus + 1);
    if (pre && runtime::make_decode_placement(dec)) return policy_pair{name, *pre, dec};
  }
  return std::unexpected("unknown policy '" + name +
                         "' (shoal, untiered, round_robin, least_requests, cache_aware, dynamo, or PREFILL+DECODE "
                         "such as tiered+least_kv)");
}

namespace detail {

cluster::cluster(const sim_config& c, const std::vector<sim_request>& work, const policy_pair& p)
    : c_(c), prof_(c.prof), work_(work), policy_(p),
      // A decode item is n = 1 on p cached tokens: b + d per request, c per KV token.
      decode_policy_(runtime::make_decode_placement(p.decode, c.prof.decode.step.b() + c.prof.decode.step.d(),
                                                    c.prof.decode.step.c())) {
  auto bcfg = c.prefill_balancer;
  bcfg.policy = p.prefill;
  bcfg.block_size = prof_.model.block_size;
  balancer_ = std::make_unique<runtime::prefill_balancer>(bcfg);
  const double block_bytes = prof_.kv_bytes_per_token * static_cast<double>(prof_.model.block_size);
  if (c.faults.enabled) {
    runtime::fault_plan plan = c.faults.messages;
    plan.seed = c.seed;
    inject_ = std::make_unique<runtime::fault_injector>(plan);
  }
  if (prof_.storage.capacity_blocks > 0) {
    storage_ = std::make_shared<sim_storage>(prof_.storage, block_bytes, clock_, c.seed,
                                             [this](double t, int64_t id) { push(t, ev::fetch_done, id); });
    storage_->faults = inject_.get();
    storage_->skip_checksum = c.faults.planted == planted_bug::skip_checksum;
  }
  build_pool(true, c.prefill_ranks, c.prefill_ep);
  build_pool(false, c.decode_ranks, c.decode_ep);
  for (const rank_state& r : ranks_)
    if (r.prefill) balancer_->add_engine(engine_id{r.index}, prof_.prefill.step, r.group);
}

sim_result cluster::run() {
  const auto w0 = std::chrono::steady_clock::now();
  records_.resize(work_.size());
  for (const auto& w : work_) last_arrival_ = std::max(last_arrival_, w.arrival_s);
  for (size_t i = 0; i < work_.size(); ++i) {
    records_[i].id = work_[i].id;
    records_[i].arrival_s = work_[i].arrival_s;
    records_[i].input = work_[i].input_len;
    push(work_[i].arrival_s, ev::arrive, static_cast<int64_t>(i));
  }
  if (c_.faults.enabled) {
    const double span = work_.empty() ? 0 : last_arrival_ - work_.front().arrival_s;
    std::vector<int32_t> sizes;
    for (const auto& g : groups_) sizes.push_back(static_cast<int32_t>(g.ranks.size()));
    fo_.schedule = make_fault_schedule(c_.seed, c_.faults.node_faults, span, sizes, c_.faults.rank_faults);
    for (size_t i = 0; i < fo_.schedule.size(); ++i)
      push((work_.empty() ? 0 : work_.front().arrival_s) + fo_.schedule[i].start_s, ev::fault_start,
           static_cast<int64_t>(i));
  }
  while (!events_.empty()) {
    event e = events_.top();
    events_.pop();
    clock_.set(e.t);
    switch (e.kind) {
      case ev::arrive: arrive(static_cast<size_t>(e.a)); break;
      case ev::step_end:
        if (e.epoch == groups_[static_cast<size_t>(e.a)].epoch) end_step(static_cast<size_t>(e.a));
        break;
      case ev::fetch_done: {
        auto g = storage_->complete(e.a);  // the waiting request's group steps again
        if (g && !groups_[*g].stepping) start_step(*g);
        break;
      }
      case ev::call: {
        auto it = calls_.find(static_cast<uint64_t>(e.a));
        std::function<void()> f = std::move(it->second);
        calls_.erase(it);
        f();
        break;
      }
      case ev::fault_start: fault_start(static_cast<size_t>(e.a)); break;
      case ev::fault_end: fault_end(static_cast<size_t>(e.a)); break;
      case ev::declare_down: declare_down(static_cast<size_t>(e.a)); break;
      case ev::wake:
        if (!groups_[static_cast<size_t>(e.a)].stepping) start_step(static_cast<size_t>(e.a));
        break;
    }
  }
  sim_result out;
  out.policy = policy_.name;
  out.requests = records_;
  out.prefill = prefill_acc_.summary();
  out.decode = decode_acc_.summary();
  double first = work_.empty() ? 0 : work_.front().arrival_s, last = first;
  for (const auto& r : records_) last = std::max(last, r.finish_s);
  out.span_s = last - first;
  out.handoffs = handoffs_;
  out.kept = kept_;
  out.spec_verified = spec_verified_, out.spec_accepted = spec_accepted_;
  if (storage_) out.storage_lookups = storage_->lookups, out.storage_hit_blocks = storage_->hit_blocks;
  for (const rank_state& r : ranks_) {
    if (!r.prefill) out.decode_per_rank.push_back(r.placed);
    if (r.prefill) {
      out.prompt_tokens += r.caches->stats().prompt_tokens;
      out.hit_tokens += r.caches->stats().hit_tokens;
      out.preemptions += r.caches->stats().preemptions;
    } else {
      out.preemptions += r.caches->stats().preemptions;
    }
  }
  out.prefill_per_tier.assign(static_cast<size_t>(balancer_->tiers()), 0);
  for (const auto& r : records_)
    if (r.tier >= 0) ++out.prefill_per_tier[static_cast<size_t>(r.tier)];
  for (const auto& [bucket, acc] : timeline_)
    out.decode_timeline.emplace_back(static_cast<double>(bucket) * c_.timeline_s, acc.first / acc.second);
  if (c_.faults.enabled) out.faults = check_faults();
  out.state_hash = hash(out);
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  return out;
}

cluster::~cluster() = default;

// A request arrives at the gateway: its relay starts (and, with faults on, its request timeout).
void cluster::arrive(size_t i) {
  const sim_request& w = work_[i];
  records_[i].tier = balancer_->tier_of(w.input_len);
  runtime::relay_limits limits;
  limits.max_attempts = c_.faults.max_attempts;
  limits.wait_for_engine_s = c_.faults.request_timeout_s;
  const runtime::relay_bug bug =
    c_.faults.planted == planted_bug::repeat_tokens ? runtime::relay_bug::repeat_tokens : runtime::relay_bug::none;
  live_.emplace(w.id, std::make_unique<relay_client>(*this, w.id, limits, bug));
  if (c_.faults.enabled)
    later(c_.faults.request_timeout_s, [this, id = w.id] {
      feed(id, [this](runtime::relay& r) {
        r.timed_out("no answer within the request timeout of " +
                    std::to_string(static_cast<int64_t>(c_.faults.request_timeout_s)) + " s");
      });
    });
  feed(w.id, [](runtime::relay& r) { r.start(false); });
}

// A rank's plan for the step (its drafts added, its blocks attached) and the step's predicted
// time on it; sets its load; `drafting` becomes true when it drafts.
double cluster::plan_rank(rank_state& r, const pool_profile& pp, int64_t drafts, bool& drafting) {
  r.plan = r.sched->plan({});
  if (drafts > 0) add_drafts(r, drafts);
  items_.clear();
  decodes_.clear();
  for (auto& it : r.plan.items) {
    r.caches->attach(*it.req, it.new_blocks);
    it.base = it.req->computed();
    items_.emplace_back(it.n_tokens, it.base);
    if (drafts > 0 && it.n_tokens - it.drafts == 1) decodes_.emplace_back(1, it.base);
  }
  double t = items_.empty() ? 0 : prof_.step_seconds(pp, items_);
  // The next step's drafts: `drafts` MTP passes over this step's decodes.
  if (!decodes_.empty())
    t += static_cast<double>(drafts) * prof_.speculation.draft_factor * prof_.step_seconds(pp, decodes_);
  drafting = drafting || !decodes_.empty();
  r.load = items_.empty() ? 0 : std::max(0.0, t - pp.step.a());
  return t;
}

void cluster::start_step(size_t g) {
  group_state& gs = groups_[g];
  const pool_profile& pp = gs.prefill ? prof_.prefill : prof_.decode;
  const double now = clock_.now_s();
  if (gs.down) return;
  if (now < std::max(gs.hung_until, gs.reformed_at)) {  // hung, or re-forming: it steps again after
    push(std::max(gs.hung_until, gs.reformed_at), ev::wake, static_cast<int64_t>(g));
    return;
  }
  const bool shared = shared_cores(gs) > 0;
  if (shared) advance_shared(gs, now);
  bool any = false;
  double longest = 0, total = 0;
  bool drafting = false;  // some rank drafts: the group runs the draft passes in lockstep
  loads_.clear();
  if (storage_) storage_->current_group = g;
  const int64_t drafts = gs.prefill ? c_.prefill_drafts : c_.decode_drafts;
  for (int32_t ri : gs.members) {
    rank_state& r = ranks_[static_cast<size_t>(ri)];
    if (storage_) storage_->current_rank = r.index;
    const double t = plan_rank(r, pp, drafts, drafting);
    loads_.push_back(r.load);
    any = any || !r.plan.items.empty();
    longest = std::max(longest, t);
    total += t;
  }
  if (!any) {
    gs.stepping = false;
    if (shared) reschedule_shared(gs, now);  // the others have the cores to themselves sooner
    return;
  }
  // Cores of its own: as long as its slowest rank. Shared: the work of all its ranks over its
  // processes (cluster_compute.cpp).
  double dt = shared ? total / static_cast<double>(gs.processes.size()) : longest;
  if (prof_.step_noise > 0) dt *= std::max(0.5, 1.0 + prof_.step_noise * normal_(gs.rng));
  dt *= gs.slow;
  // An expert-parallel group's passes (the main one, and the draft passes when some rank
  // drafts) each wait on their exchanges: latency beyond the compute, on no core.
  const double exchanges = gs.members.size() > 1 ? prof_.ep_pass_s * static_cast<double>(1 + (drafting ? drafts : 0)) : 0;
  // The step routes each token to the rank of its expert in the group's placement: every rank
  // the placement names must be in the group.
  for (int32_t ri : gs.placed_on)
    if (std::ranges::find(gs.members, ri) == gs.members.end()) {
      ++fo_.routed_to_lost;
      break;
    }
  gs.stepping = true;
  gs.step_start = now;
  gs.counted = now >= c_.warmup_s && now < last_arrival_;
  if (gs.counted) {
    // % of perfect: within the lockstep group; balance ratio: over the whole pool (every
    // rank's load in its group's current step, 0 when idle), the same thing for one group.
    pool_loads_.clear();
    for (const rank_state& r : ranks_)
      if (r.prefill == gs.prefill) pool_loads_.push_back(groups_[static_cast<size_t>(r.group)].stepping ? r.load : 0.0);
    (gs.prefill ? prefill_acc_ : decode_acc_).add(pp.step.a(), loads_, pool_loads_);
    if (!gs.prefill && c_.timeline_s > 0) {
      auto& b = timeline_[static_cast<int64_t>(now / c_.timeline_s)];
      b.first += runtime::balance_ratio(pool_loads_);
      b.second += 1;
    }
  }
  if (shared) {
    gs.work_left = dt, gs.since = now, gs.compute_from = now + exchanges;
    reschedule_shared(gs, now);
  } else {
    gs.step_end_s = now + exchanges + dt;
    push(gs.step_end_s, ev::step_end, static_cast<int64_t>(g), ++gs.epoch);
  }
}

void cluster::end_step(size_t g) {
  group_state& gs = groups_[g];
  const double now = clock_.now_s();
  if (shared_cores(gs) > 0) advance_shared(gs, now);
  pool_acc& acc = gs.prefill ? prefill_acc_ : decode_acc_;
  if (gs.counted) acc.busy += now - gs.step_start;
  ++acc.all_steps, acc.all_busy += now - gs.step_start;
  for (int32_t ri : gs.ranks) {
    rank_state& rk = ranks_[static_cast<size_t>(ri)];
    runtime::step_plan plan = std::move(rk.plan);
    rk.plan = {};
    for (auto& it : plan.items) {
      runtime::request* r = it.req;
      const int64_t done = it.base + it.n_tokens - it.drafts;  // without the drafts it verified
      const bool sampled_now = done == r->num_tokens();
      const int64_t accepted = it.drafts > 0 ? accepted_drafts(gs, it.drafts) : 0;
      spec_verified_ += static_cast<uint64_t>(it.drafts), spec_accepted_ += static_cast<uint64_t>(accepted);
      const int64_t emitted = sampled_now ? 1 + accepted : 0;
      const int64_t prefilled = r->prompt_len + r->resumed;  // a re-routed request prefills what the client has
      prefill_acc_.tokens += static_cast<double>(std::max<int64_t>(0, std::min(done, prefilled) - it.base));
      if (emitted > 0) decode_acc_.tokens += static_cast<double>(emitted - (r->output_len() == r->resumed ? 1 : 0));  // after the first
      for (int64_t j = 0; j < emitted; ++j) r->tokens.push_back(output_token(r->id.value, r->output_len(), prof_.model.vocab_size));
      r->cache.computed = done + accepted;
      rk.caches->commit(*r);
      if (sampled_now) sampled(ri, *r, now, emitted);  // may free r
    }
  }
  start_step(g);
}

// Engine rank `gi` sampled a token of `r`: the token event goes to the request's relay (none
// left: its sink is gone, the engine stops the request); finished, the engine forgets it;
// a prefill rank offers the request for a handoff after its first token.
void cluster::sampled(int32_t gi, runtime::request& r, double now, int64_t emitted) {
  rank_state& rk = ranks_[static_cast<size_t>(gi)];
  const int64_t id = r.id.value;
  if (!live_.contains(id)) return drop_request(rk, id);
  const bool finished = r.output_len() >= r.params.max_tokens;
  for (int64_t j = emitted; j > 0; --j)  // one event per token, oldest first
    feed(id, [&](runtime::relay& m) {
      const runtime::relay_verdict v = m.token(ref(gi), true, finished && j == 1, false);
      if (v.forward) client_token(id, r.tokens[r.tokens.size() - static_cast<size_t>(j)], r.cached_tokens, now);
      if (v.final) client_final(id, r, now);
    });
  if (finished) return drop_request(rk, id);
  // Colocated (no decode pool): the rank decodes what it prefilled.
  if (rk.prefill && c_.decode_ranks > 0 && r.output_len() == r.resumed + 1 && live_.contains(id)) offer_handoff(gi, r);
}

// The accepted drafts of a verify of `k`: each with the profile's probability, given the ones before.
int64_t cluster::accepted_drafts(group_state& gs, int64_t k) {
  int64_t a = 0;
  while (a < k && uniform_(gs.rng) < prof_.speculation.accept) ++a;
  return a;
}

}  // namespace detail

std::expected<sim_result, std::string> run_cluster(const sim_config& c, const std::vector<sim_request>& work,
                                                   const policy_pair& policy) {
  if (c.prefill_ranks < 1 || c.prefill_ep < 1 || c.prefill_ranks % c.prefill_ep != 0)
    return std::unexpected("prefill ranks must be a positive multiple of the prefill EP size");
  if (c.decode_ranks < 0 || c.decode_ep < 1 || c.decode_ranks % c.decode_ep != 0)
    return std::unexpected("decode ranks must be a multiple of the decode EP size (0: colocated)");
  for (auto [sizes, n, pool] : {std::tuple{&c.prefill_processes, c.prefill_ranks, "prefill"},
                                 std::tuple{&c.decode_processes, c.decode_ranks, "decode"}}) {
    int64_t sum = 0;
    for (int64_t k : *sizes) sum += k;
    if (!sizes->empty() && (sum != n || std::ranges::any_of(*sizes, [](int64_t k) { return k < 1; })))
      return std::unexpected(std::string("the ") + pool + " processes' ranks (each ≥ 1) must add up to the " + pool + " ranks");
  }
  if ((c.prefill_drafts > 0 || c.decode_drafts > 0) && !c.prof.speculation.known)
    return std::unexpected("the cluster speculates but profile '" + c.prof.name +
                           "' has no \"speculation\" section (accept, draft_factor)");
  if (c.prof.prefill.fitted || c.prof.decode.fitted)
    return std::unexpected("profile '" + c.prof.name + "' takes its step model from a fitted cost model (--cost-model FILE)");
  if (!runtime::make_decode_placement(policy.decode)) return std::unexpected("unknown decode placement '" + policy.decode + "'");
  if (c.faults.enabled && (c.prof.host_cores > 0 || c.prof.prefill.cores > 0 || c.prof.decode.cores > 0))
    return std::unexpected("faults run on profiles whose ranks have cores of their own (profile '" + c.prof.name +
                           "' shares cores)");
  for (size_t i = 0; i < work.size(); ++i)
    if (work[i].id != static_cast<int64_t>(i))
      return std::unexpected("workload ids must be 0, 1, ... in order (request " + std::to_string(i) + " has id " +
                             std::to_string(work[i].id) + ")");
  const int64_t bs = c.prof.model.block_size;
  for (const auto& w : work) {
    const int64_t need = (w.input_len + w.output_len + bs) / bs + 1;
    if (need > c.prof.prefill.kv_blocks || (c.decode_ranks > 0 && need > c.prof.decode.kv_blocks))
      return std::unexpected("request " + std::to_string(w.id) + " (" + std::to_string(w.input_len) + " + " +
                             std::to_string(w.output_len) + " tokens) does not fit one rank's kv_blocks");
    if (c.prof.model.max_position_embeddings > 0 && w.input_len + w.output_len > c.prof.model.max_position_embeddings)
      return std::unexpected("request " + std::to_string(w.id) + " is longer than the model's context (" +
                             std::to_string(c.prof.model.max_position_embeddings) + "); use --max-input or --length-scale");
  }
  detail::cluster sim(c, work, policy);
  return sim.run();
}

}  // namespace shoal::sim
