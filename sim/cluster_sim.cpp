// The cluster simulator's event loop (cluster_sim.hpp).
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
#include <unordered_map>

#include <xxhash.h>

#include "runtime/core/cache_manager.hpp"
#include "runtime/base/clock.hpp"
#include "runtime/base/ids.hpp"
#include "runtime/placement/decode_placement.hpp"
#include "runtime/base/metrics.hpp"
#include "runtime/core/remote_blocks.hpp"
#include "runtime/core/scheduler.hpp"
#include "sim/cluster_state.hpp"

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

namespace {

using namespace detail;  // sim/cluster_state.hpp

class cluster {
 public:
  cluster(const sim_config& c, const std::vector<sim_request>& work, const policy_pair& p)
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
      if (r.prefill) balancer_->add_engine(r.index, prof_.prefill.step, r.group);
  }

  sim_result run() {
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
      fo_.schedule = make_fault_schedule(c_.seed, c_.faults.node_faults, span, static_cast<int32_t>(groups_.size()));
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
        case ev::handoff_done: handoff_done(e.a, e.epoch); break;
        case ev::fault_start: fault_start(static_cast<size_t>(e.a)); break;
        case ev::fault_end: fault_end(static_cast<size_t>(e.a)); break;
        case ev::declare_down: take_down(static_cast<size_t>(fo_.schedule[static_cast<size_t>(e.a)].group), false); break;
        case ev::wake:
          if (!groups_[static_cast<size_t>(e.a)].stepping) start_step(static_cast<size_t>(e.a));
          break;
        case ev::handoff_timeout: handoff_timeout(e.a, e.epoch); break;
        case ev::park_deadline: park_deadline(e.a, e.epoch); break;
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

 private:
  void push(double t, ev kind, int64_t a, uint64_t epoch = 0) { events_.push({t, seq_++, kind, a, epoch}); }

  // CPU sharing. Ranks on cores of their own pool (pool.cores) or of the host (host_cores) share
  // them as a processor-sharing server: while k ranks compute at once on c cores, each step
  // progresses at min(1, c / k) of full speed, and every step in flight is re-timed when a step
  // starts or ends. 0: this group's cores are its own.
  int64_t shared_cores(const group_state& gs) const {
    const pool_profile& pp = gs.prefill ? prof_.prefill : prof_.decode;
    return pp.cores > 0 ? pp.cores : prof_.host_cores;
  }
  bool shares_with(const group_state& gs, const group_state& o) const {
    const pool_profile& pp = gs.prefill ? prof_.prefill : prof_.decode;
    return pp.cores == 0 || o.prefill == gs.prefill;
  }
  double share_rate(const group_state& gs) const {
    int64_t busy = 0;
    for (const auto& o : groups_)
      if (o.stepping && shares_with(gs, o)) busy += static_cast<int64_t>(o.ranks.size());
    return std::min(1.0, static_cast<double>(shared_cores(gs)) / static_cast<double>(std::max<int64_t>(1, busy)));
  }
  // Before the set of computing ranks changes: charge each step in flight for the time since.
  void advance_shared(const group_state& gs, double now) {
    if (shared_cores(gs) == 0) return;
    const double rate = share_rate(gs);
    for (auto& o : groups_)
      if (o.stepping && shares_with(gs, o)) o.work_left = std::max(0.0, o.work_left - (now - o.since) * rate), o.since = now;
  }
  // After it changed: every step in flight on those cores ends when its work is done at the new rate.
  void reschedule_shared(const group_state& gs, double now) {
    const double rate = share_rate(gs);
    for (size_t i = 0; i < groups_.size(); ++i) {
      group_state& o = groups_[i];
      if (o.stepping && shares_with(gs, o)) push(now + o.work_left / rate, ev::step_end, static_cast<int64_t>(i), ++o.epoch);
    }
  }

  void build_pool(bool prefill, int64_t n, int64_t ep) {
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
  void fresh_engine(rank_state& r) {
    const pool_profile& pp = r.prefill ? prof_.prefill : prof_.decode;
    r.sched.reset();
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

  rank_state& prefill_rank(int64_t index) { return ranks_[static_cast<size_t>(index)]; }
  rank_state& decode_rank(int64_t index) { return ranks_[static_cast<size_t>(c_.prefill_ranks + index)]; }

  void arrive(size_t i) {
    const sim_request& w = work_[i];
    auto r = std::make_unique<runtime::request>();
    r->id = request_id{w.id};
    r->tokens = prompt_tokens(w, prof_.model.vocab_size);
    r->prompt_len = w.input_len;
    r->params.max_tokens = static_cast<int32_t>(w.output_len);
    records_[i].tier = balancer_->tier_of(w.input_len);
    live& l = live_[w.id];
    l.req = std::move(r);
    route(w.id);
  }

  // The relay places request `id` (its tokens so far) on a prefill engine, or parks it until
  // one is up again.
  void route(int64_t id) {
    live& l = live_.at(id);
    runtime::request& r = *l.req;
    runtime::prefill_request pr{r.id, r.num_tokens(), runtime::chain_keys(r.tokens, static_cast<int>(prof_.model.block_size))};
    auto e = balancer_->place(pr, clock_.now_s());
    request_record& rec = records_[static_cast<size_t>(id)];
    if (!e) {  // every prefill engine is down
      l.rank = -1;
      parked_.push_back(id);
      push(clock_.now_s() + c_.faults.request_timeout_s, ev::park_deadline, id, ++l.park_epoch);
      return;
    }
    rank_state& rk = prefill_rank(*e);
    if (groups_[static_cast<size_t>(rk.group)].down) ++fo_.placed_on_dead;
    ++rec.attempts;
    rec.prefill_rank = static_cast<int32_t>(*e);
    l.rank = static_cast<int32_t>(*e);
    l.want_handoff = true;
    rk.sched->add(l.req.get());
    if (!groups_[static_cast<size_t>(rk.group)].stepping) start_step(static_cast<size_t>(rk.group));
  }

  void start_step(size_t g) {
    group_state& gs = groups_[g];
    const pool_profile& pp = gs.prefill ? prof_.prefill : prof_.decode;
    const double now = clock_.now_s();
    if (gs.down) return;
    if (now < gs.hung_until) {  // hung: it steps again when the hang ends
      push(gs.hung_until, ev::wake, static_cast<int64_t>(g));
      return;
    }
    const bool shared = shared_cores(gs) > 0;
    if (shared) advance_shared(gs, now);
    bool any = false;
    double longest = 0;
    loads_.clear();
    if (storage_) storage_->current_group = g;
    for (int32_t ri : gs.ranks) {
      rank_state& r = ranks_[static_cast<size_t>(ri)];
      r.plan = r.sched->plan({});
      items_.clear();
      for (auto& it : r.plan.items) {
        r.caches->attach(*it.req, it.new_blocks);
        it.base = it.req->computed();
        items_.emplace_back(it.n_tokens, it.base);
      }
      const double t = items_.empty() ? 0 : prof_.step_seconds(pp, items_);
      r.load = items_.empty() ? 0 : std::max(0.0, t - pp.step.a());
      loads_.push_back(r.load);
      any = any || !items_.empty();
      longest = std::max(longest, t);
    }
    if (!any) {
      gs.stepping = false;
      if (shared) reschedule_shared(gs, now);  // the others have the cores to themselves sooner
      return;
    }
    double dt = longest;
    if (prof_.step_noise > 0) dt *= std::max(0.5, 1.0 + prof_.step_noise * normal_(gs.rng));
    dt *= gs.slow;
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
      gs.work_left = dt, gs.since = now;
      reschedule_shared(gs, now);
    } else {
      gs.step_end_s = now + dt;
      push(now + dt, ev::step_end, static_cast<int64_t>(g), ++gs.epoch);
    }
  }

  void end_step(size_t g) {
    group_state& gs = groups_[g];
    const double now = clock_.now_s();
    if (shared_cores(gs) > 0) advance_shared(gs, now);
    pool_acc& acc = gs.prefill ? prefill_acc_ : decode_acc_;
    if (gs.counted) acc.busy += now - gs.step_start;
    ++acc.all_steps, acc.all_busy += now - gs.step_start;
    for (int32_t ri : gs.ranks) {
      rank_state& rk = ranks_[static_cast<size_t>(ri)];
      for (auto& it : rk.plan.items) {
        runtime::request* r = it.req;
        r->cache.computed = it.base + it.n_tokens;
        const bool sampled = r->cache.computed == r->num_tokens();
        prefill_acc_.tokens += static_cast<double>(std::max<int64_t>(0, std::min(it.base + it.n_tokens, r->prompt_len) - it.base));
        if (sampled && r->output_len() >= 1) decode_acc_.tokens += 1;  // a token after the first
        request_record& rec = records_[static_cast<size_t>(r->id.value)];
        if (sampled) {
          r->tokens.push_back(output_token(r->id.value, r->output_len(), prof_.model.vocab_size));
          if (r->output_len() == 1 && rec.first_token_s < 0) {
            rec.first_token_s = now;
            rec.cached_tokens = r->cached_tokens;
          }
        }
        rk.caches->commit(*r);
        if (r->output_len() >= r->params.max_tokens) {
          finished(rk, *r, now);
        } else if (rk.prefill && sampled && live_.at(r->id.value).want_handoff) {
          hand_off(rk, *r);
        }
      }
      rk.plan = {};
    }
    start_step(g);
  }

  void finished(rank_state& rk, runtime::request& r, double now) {
    request_record& rec = records_[static_cast<size_t>(r.id.value)];
    if (rec.finish_s >= 0) ++fo_.duplicates;  // finished once already
    rec.finish_s = now;
    rec.output = r.output_len();
    rec.preemptions += r.preemptions;
    // The output is the one token sequence expected: none lost or repeated across re-routes.
    for (int64_t j = 0; j < r.output_len(); ++j)
      if (r.tokens[static_cast<size_t>(r.prompt_len + j)] != output_token(r.id.value, j, prof_.model.vocab_size)) {
        ++fo_.wrong_outputs;
        break;
      }
    rk.sched->finish(&r);
    if (rk.prefill) balancer_->done(r.id, now);
    live_.erase(r.id.value);
  }

  void hand_off(rank_state& from, runtime::request& r) {
    r.handed_off = true;
    live_.at(r.id.value).want_handoff = false;
    balancer_->done(r.id, clock_.now_s());
    const int64_t context = r.num_tokens();
    runtime::decode_ask ask{context, r.params.max_tokens - r.output_len(), from.caches->blocks_for(context) + 1};
    std::vector<runtime::decode_candidate> cands;
    for (int64_t i = 0; i < c_.decode_ranks; ++i) {
      rank_state& d = decode_rank(i);
      int64_t kv = d.pending_kv;
      for (const runtime::request* q : d.sched->running_requests()) kv += q->computed();
      if (groups_[static_cast<size_t>(d.group)].down && c_.faults.planted != planted_bug::place_on_dead) continue;
      cands.push_back({i, static_cast<int64_t>(d.sched->running() + d.sched->waiting()) + d.pending, kv,
                       d.caches->pool().num_free(), false});
    }
    auto chosen = decode_policy_->choose(ask, cands, {});
    live& l = live_.at(r.id.value);
    if (chosen && groups_[static_cast<size_t>(decode_rank(*chosen).group)].down) {
      ++fo_.placed_on_dead;  // (planted bug only) nobody answers there: it decodes here
      ++kept_;
      return;
    }
    if (chosen) {
      rank_state& d = decode_rank(*chosen);
      auto copy = restarted(r);  // its caches come with the handoff (adopt)
      if (d.caches->adopt(*copy, r.computed())) {
        from.sched->detach(&r);
        ++d.pending;
        d.pending_kv += context;
        ++d.placed;
        l.moving = std::move(copy);
        l.to_rank = static_cast<int32_t>(*chosen);
        records_[static_cast<size_t>(r.id.value)].decode_rank = l.to_rank;
        const double bytes = static_cast<double>(r.computed()) * prof_.kv_bytes_per_token;
        double t = prof_.handoff_latency_s + bytes * 8 / (prof_.handoff_gbps * 1e9);
        const uint64_t epoch = ++l.handoff_epoch;
        bool failed = false;
        if (inject_) {
          failed = inject_->fire(runtime::fault_point::kv_handoff);
          if (!failed && inject_->fire(runtime::fault_point::kv_handoff_delay))
            t += 3 * c_.faults.handoff_timeout_s * inject_->uniform(runtime::fault_point::kv_handoff_delay);
          failed = failed || t > c_.faults.handoff_timeout_s;  // too late: given up at the deadline
        }
        const double now = clock_.now_s();
        if (failed) {
          push(now + c_.faults.handoff_timeout_s, ev::handoff_timeout, r.id.value, epoch);
        } else {
          push(now + t, ev::handoff_done, r.id.value, epoch);
          if (inject_ && inject_->fire(runtime::fault_point::message_dup))  // delivered twice
            push(now + t + 0.5 * inject_->uniform(runtime::fault_point::message_dup), ev::handoff_done, r.id.value, epoch);
        }
        ++handoffs_;
        return;
      }
    }
    ++kept_;  // no decode rank has room: it decodes here
  }

  void handoff_done(int64_t id, uint64_t epoch) {
    auto it = live_.find(id);
    if (it == live_.end() || it->second.handoff_epoch != epoch) return;  // stale: the request moved on
    live& l = it->second;
    if (!l.moving) {  // this handoff completed already: a duplicate delivery, ignored
      ++fo_.handoff_duplicates;
      return;
    }
    rank_state& from = prefill_rank(l.rank);
    from.sched->finish(l.req.get());
    rank_state& d = decode_rank(l.to_rank);
    --d.pending;
    d.pending_kv -= l.moving->num_tokens();
    d.sched->add_running(l.moving.get());
    l.req = std::move(l.moving);
    l.rank = static_cast<int32_t>(c_.prefill_ranks + l.to_rank);
    if (!groups_[static_cast<size_t>(d.group)].stepping) start_step(static_cast<size_t>(d.group));
  }

  // ---- faults (sim/faults.hpp) ----

  void fault_start(size_t i) {
    const fault_event& f = fo_.schedule[i];
    const double now = clock_.now_s();
    switch (f.kind) {
      case fault_kind::crash:
        take_down(static_cast<size_t>(f.group), true);
        push(now + f.duration_s, ev::fault_end, static_cast<int64_t>(i));
        break;
      case fault_kind::partition:
        take_down(static_cast<size_t>(f.group), false);
        push(now + f.duration_s, ev::fault_end, static_cast<int64_t>(i));
        break;
      case fault_kind::hang: {
        group_state& gs = groups_[static_cast<size_t>(f.group)];
        gs.hung_until = std::max(gs.hung_until, now + f.duration_s);
        if (gs.stepping) {  // the step in flight ends that much later
          gs.step_end_s += f.duration_s;
          push(gs.step_end_s, ev::step_end, f.group, ++gs.epoch);
        }
        if (f.duration_s > c_.faults.detect_s) {  // heartbeats stop: declared down, back when it wakes
          push(now + c_.faults.detect_s, ev::declare_down, static_cast<int64_t>(i));
          push(now + f.duration_s, ev::fault_end, static_cast<int64_t>(i));
        }
        break;
      }
      case fault_kind::slow:
        groups_[static_cast<size_t>(f.group)].slow *= f.factor;
        push(now + f.duration_s, ev::fault_end, static_cast<int64_t>(i));
        break;
      case fault_kind::disk_full:
        if (storage_) storage_->full_until = std::max(storage_->full_until, now + f.duration_s);
        break;
      case fault_kind::corrupt:
        if (storage_) storage_->damage(static_cast<int64_t>(f.factor));
        break;
    }
  }

  void fault_end(size_t i) {
    const fault_event& f = fo_.schedule[i];
    switch (f.kind) {
      case fault_kind::crash:  // restarted (its engines were emptied at the crash)
      case fault_kind::partition:
      case fault_kind::hang: bring_up(static_cast<size_t>(f.group)); break;
      case fault_kind::slow: groups_[static_cast<size_t>(f.group)].slow /= f.factor; break;
      default: break;
    }
  }

  // Group g goes down (crash: its engines lose everything; partition or a hang past the
  // heartbeat timeout: cut off from the cluster, caches kept). Its step in flight is lost; the
  // balancers stop placing there; its requests are re-routed by the relay, and handoffs that
  // touch it end as DISAGG.md says (the decode side dead: re-route; the prefill side dead
  // while the decode side reads: the decode side recomputes from the tokens it was given).
  void take_down(size_t g, bool crash) {
    group_state& gs = groups_[g];
    if (gs.down++ > 0) {
      if (crash) wipe(g);  // crashed while cut off: its caches go too
      return;
    }
    if (gs.stepping) gs.stepping = false, ++gs.epoch;
    for (int32_t ri : gs.ranks)
      if (ranks_[static_cast<size_t>(ri)].prefill) balancer_->remove_engine(ranks_[static_cast<size_t>(ri)].index);
    auto in_group = [&](int32_t global) { return global >= 0 && static_cast<size_t>(ranks_[static_cast<size_t>(global)].group) == g; };
    std::vector<int64_t> hit;
    for (const auto& [id, l] : live_)
      if (in_group(l.rank) || (l.moving && in_group(static_cast<int32_t>(c_.prefill_ranks + l.to_rank)))) hit.push_back(id);
    std::sort(hit.begin(), hit.end());  // the map's order is not the run's
    std::vector<size_t> wake;
    for (int64_t id : hit) {
      live& l = live_.at(id);
      if (c_.faults.planted == planted_bug::lose_on_crash && crash) {
        live_.erase(id);  // planted bug: dropped, neither finished nor failed
        continue;
      }
      if (l.moving) {
        rank_state& from = ranks_[static_cast<size_t>(l.rank)];
        rank_state& d = decode_rank(l.to_rank);
        ++l.handoff_epoch;  // its completion or timeout in flight is stale now
        --d.pending;
        d.pending_kv -= l.moving->num_tokens();
        from.sched->finish(l.req.get());  // the prefill side unpins
        d.caches->release(*l.moving);     // the decode side's reservation goes
        if (in_group(static_cast<int32_t>(c_.prefill_ranks + l.to_rank))) {
          l.moving.reset();
          reroute(id, "decode engine down during the handoff");
        } else {
          ++fo_.handoff_failures;
          recompute_on_decode(id);
          wake.push_back(static_cast<size_t>(d.group));
        }
      } else {
        ranks_[static_cast<size_t>(l.rank)].sched->finish(l.req.get());
        reroute(id, crash ? "engine crashed" : "engine unreachable");
      }
    }
    for (int32_t ri : gs.ranks) ranks_[static_cast<size_t>(ri)].plan = {}, ranks_[static_cast<size_t>(ri)].load = 0;
    if (crash) wipe(g);
    for (size_t w : wake)
      if (!groups_[w].stepping) start_step(w);
  }

  void wipe(size_t g) {
    if (storage_) storage_->fail_group(g);
    for (int32_t ri : groups_[g].ranks) fresh_engine(ranks_[static_cast<size_t>(ri)]);
  }

  // Group g is back (restarted, healed, awake): in the balancers' views again, and the
  // requests parked for want of any prefill engine go out.
  void bring_up(size_t g) {
    group_state& gs = groups_[g];
    if (gs.down == 0 || --gs.down > 0) return;
    for (int32_t ri : gs.ranks) {
      const rank_state& r = ranks_[static_cast<size_t>(ri)];
      if (r.prefill) balancer_->add_engine(r.index, prof_.prefill.step, r.group);
    }
    std::vector<int64_t> parked = std::exchange(parked_, {});
    for (int64_t id : parked)
      if (auto it = live_.find(id); it != live_.end() && it->second.rank < 0) route(id);
    if (!gs.stepping) start_step(g);
  }

  // The relay sends request `id` again (its tokens so far: those streamed are not repeated),
  // or fails it with a clear error after max_attempts placements.
  void reroute(int64_t id, const char* why) {
    live& l = live_.at(id);
    ++fo_.rerouted;
    const request_record& rec = records_[static_cast<size_t>(id)];
    balancer_->done(request_id{id}, clock_.now_s());
    if (rec.attempts >= c_.faults.max_attempts) {
      fail(id, "lost its engine " + std::to_string(rec.attempts) + " times (last: " + why + ")");
      return;
    }
    l.req = restarted(*l.req);
    l.to_rank = -1;
    route(id);
  }

  // A copy of r that computes again from its tokens (prompt and the outputs so far).
  static std::unique_ptr<runtime::request> restarted(const runtime::request& r) {
    auto c = std::make_unique<runtime::request>();
    c->id = r.id;
    c->tokens = r.tokens;
    c->prompt_len = r.prompt_len;
    c->params = r.params;
    c->cached_tokens = r.cached_tokens;
    c->handed_off = r.handed_off;
    return c;
  }

  // The decode side of a failed handoff recomputes from the tokens it was given.
  void recompute_on_decode(int64_t id) {
    live& l = live_.at(id);
    rank_state& d = decode_rank(l.to_rank);
    l.req = restarted(*l.moving);
    l.moving.reset();
    l.rank = static_cast<int32_t>(c_.prefill_ranks + l.to_rank);
    d.sched->add(l.req.get());
  }

  void handoff_timeout(int64_t id, uint64_t epoch) {
    auto it = live_.find(id);
    if (it == live_.end() || it->second.handoff_epoch != epoch || !it->second.moving) return;
    live& l = it->second;
    ++l.handoff_epoch;  // a completion arriving after the deadline is stale
    ++fo_.handoff_failures;
    rank_state& from = prefill_rank(l.rank);
    rank_state& d = decode_rank(l.to_rank);
    --d.pending;
    d.pending_kv -= l.moving->num_tokens();
    from.sched->finish(l.req.get());  // the prefill side's lease ends: unpinned
    d.caches->release(*l.moving);     // the reservation goes, and it recomputes there
    recompute_on_decode(id);
    if (!groups_[static_cast<size_t>(d.group)].stepping) start_step(static_cast<size_t>(d.group));
  }

  void park_deadline(int64_t id, uint64_t epoch) {
    auto it = live_.find(id);
    if (it == live_.end() || it->second.rank >= 0 || it->second.park_epoch != epoch) return;
    std::erase(parked_, id);
    fail(id, "no prefill engine up for " + std::to_string(static_cast<int64_t>(c_.faults.request_timeout_s)) + " s");
  }

  void fail(int64_t id, std::string why) {
    request_record& rec = records_[static_cast<size_t>(id)];
    rec.error = std::move(why);
    fo_.errors.push_back("request " + std::to_string(id) + ": " + rec.error);
    live_.erase(id);
  }

  // The invariants, once the run is over.
  fault_outcome check_faults() {
    fault_outcome o = std::move(fo_);
    if (storage_) o.wrong_blocks = storage_->wrong_blocks, o.damaged_caught = storage_->damaged_caught,
                  o.dropped_writes = storage_->dropped_writes;
    std::vector<int64_t> lost;
    for (const auto& r : records_) {
      if (r.finish_s >= 0 && r.output == work_[static_cast<size_t>(r.id)].output_len) ++o.completed;
      else if (r.finish_s >= 0) ++o.wrong_outputs;  // finished short or long
      else if (!r.error.empty()) ++o.errored;
      else lost.push_back(r.id);
    }
    o.lost = static_cast<int64_t>(lost.size());
    auto fail = [&](std::string v) { o.violations.push_back(std::move(v)); };
    if (!lost.empty()) {
      std::string ids;
      for (size_t i = 0; i < lost.size() && i < 8; ++i) ids += (i ? ", " : "") + std::to_string(lost[i]);
      fail(std::to_string(lost.size()) + " requests lost (neither completed nor failed): " + ids + (lost.size() > 8 ? ", ..." : ""));
    }
    if (o.wrong_blocks > 0) fail(std::to_string(o.wrong_blocks) + " damaged blocks served as good");
    if (o.placed_on_dead > 0) fail(std::to_string(o.placed_on_dead) + " placements on a node that was down");
    if (o.duplicates > 0) fail(std::to_string(o.duplicates) + " requests finished twice");
    if (o.wrong_outputs > 0) fail(std::to_string(o.wrong_outputs) + " outputs differ from the expected tokens");
    for (size_t g = 0; g < groups_.size(); ++g)
      if (groups_[g].down) fail("group " + std::to_string(g) + " still down at the end");
    for (const rank_state& r : ranks_) {
      o.leaked_blocks += r.caches->pool().num_blocks() - r.caches->pool().num_free();
      if (r.pending != 0 || r.pending_kv != 0) fail("a decode rank still expects handoffs at the end");
    }
    if (o.leaked_blocks > 0) fail(std::to_string(o.leaked_blocks) + " blocks still held at the end");
    const auto views = balancer_->engines();
    if (static_cast<int64_t>(views.size()) != c_.prefill_ranks)
      fail("the prefill balancer sees " + std::to_string(views.size()) + " of " + std::to_string(c_.prefill_ranks) + " engines");
    for (const auto& v : views)
      if (v.in_flight != 0) fail("the prefill balancer counts requests in flight on engine " + std::to_string(v.engine));
    if (!live_.empty()) fail(std::to_string(live_.size()) + " requests still live when the events ran out");
    return o;
  }

  uint64_t hash(const sim_result& out) const {
    XXH3_state_t* s = XXH3_createState();
    XXH3_64bits_reset(s);
    for (const auto& r : out.requests) {
      const double v[3] = {r.arrival_s, r.first_token_s, r.finish_s};
      const int64_t n[5] = {r.id, r.cached_tokens, r.prefill_rank, r.decode_rank, r.output};
      XXH3_64bits_update(s, v, sizeof v);
      XXH3_64bits_update(s, n, sizeof n);
    }
    const double sums[4] = {out.prefill.busy_s, out.decode.busy_s, out.prefill.tokens, out.decode.tokens};
    XXH3_64bits_update(s, sums, sizeof sums);
    if (c_.faults.enabled) {
      const fault_outcome& f = out.faults;
      const int64_t n[13] = {f.completed, f.errored, f.lost, f.wrong_blocks, f.placed_on_dead, f.duplicates,
                             f.wrong_outputs, f.leaked_blocks, f.rerouted, f.handoff_failures, f.handoff_duplicates,
                             f.dropped_writes, f.damaged_caught};
      XXH3_64bits_update(s, n, sizeof n);
      for (const auto& r : out.requests) {
        XXH3_64bits_update(s, &r.attempts, sizeof r.attempts);
        XXH3_64bits_update(s, r.error.data(), r.error.size());
      }
    }
    const uint64_t h = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return h;
  }

  const sim_config& c_;
  const profile& prof_;
  const std::vector<sim_request>& work_;
  policy_pair policy_;
  std::unique_ptr<runtime::decode_placement> decode_policy_;
  std::unique_ptr<runtime::prefill_balancer> balancer_;
  sim_clock clock_;
  std::shared_ptr<sim_storage> storage_;
  std::vector<rank_state> ranks_;
  std::vector<group_state> groups_;
  std::unordered_map<int64_t, live> live_;
  std::vector<request_record> records_;
  event_queue events_;
  uint64_t seq_ = 0;
  pool_acc prefill_acc_, decode_acc_;
  std::map<int64_t, std::pair<double, double>> timeline_;
  std::vector<double> loads_, pool_loads_;
  std::vector<std::pair<int64_t, int64_t>> items_;
  std::normal_distribution<double> normal_;
  uint64_t handoffs_ = 0, kept_ = 0;
  double last_arrival_ = 0;
  std::unique_ptr<runtime::fault_injector> inject_;  // faults on: the run's message faults
  fault_outcome fo_;
  std::vector<int64_t> parked_;                      // requests waiting for any prefill engine
};

}  // namespace

std::expected<sim_result, std::string> run_cluster(const sim_config& c, const std::vector<sim_request>& work,
                                                   const policy_pair& policy) {
  if (c.prefill_ranks < 1 || c.prefill_ep < 1 || c.prefill_ranks % c.prefill_ep != 0)
    return std::unexpected("prefill ranks must be a positive multiple of the prefill EP size");
  if (c.decode_ranks < 1 || c.decode_ep < 1 || c.decode_ranks % c.decode_ep != 0)
    return std::unexpected("decode ranks must be a positive multiple of the decode EP size");
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
    if (need > c.prof.prefill.kv_blocks || need > c.prof.decode.kv_blocks)
      return std::unexpected("request " + std::to_string(w.id) + " (" + std::to_string(w.input_len) + " + " +
                             std::to_string(w.output_len) + " tokens) does not fit one rank's kv_blocks");
    if (c.prof.model.max_position_embeddings > 0 && w.input_len + w.output_len > c.prof.model.max_position_embeddings)
      return std::unexpected("request " + std::to_string(w.id) + " is longer than the model's context (" +
                             std::to_string(c.prof.model.max_position_embeddings) + "); use --max-input or --length-scale");
  }
  cluster sim(c, work, policy);
  return sim.run();
}

}  // namespace shoal::sim
