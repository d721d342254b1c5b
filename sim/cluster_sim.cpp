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

#include "runtime/cache_manager.hpp"
#include "runtime/clock.hpp"
#include "runtime/ids.hpp"
#include "runtime/decode_placement.hpp"
#include "runtime/metrics.hpp"
#include "runtime/remote_blocks.hpp"
#include "runtime/scheduler.hpp"

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

class sim_clock final : public runtime::clock {
 public:
  double now_s() const override { return t_; }
  void set(double t) { t_ = t; }

 private:
  double t_ = 0;
};

enum class ev { arrive, step_end, fetch_done, handoff_done };

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
                                                     std::vector<std::span<float>>) override {
    const double now = clock_.now_s();
    size_t n = 0;
    while (n < keys.size()) {
      auto it = index_.find(keys[n]);
      if (it == index_.end() || it->second.ready_s > now) break;
      lru_.splice(lru_.begin(), lru_, it->second.pos);
      ++n;
    }
    ++lookups;
    hit_blocks += n;
    double t = m_.read_latency_s + static_cast<double>(n) * block_bytes_ * 8 / (m_.read_gbps * 1e9);
    if (m_.jitter > 0) t *= std::exp(m_.jitter * normal_(rng_));
    auto f = std::make_shared<runtime::remote_fetch>();
    const int64_t id = next_id_++;
    pending_.emplace(id, pending{f, n, current_group});
    schedule_(now + t, id);
    return f;
  }
  bool store_async(const runtime::block_key& key, std::span<const float>, runtime::traffic_class) override {
    if (m_.capacity_blocks <= 0) return true;
    auto it = index_.find(key);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.pos);
      return true;
    }
    lru_.push_front(key);
    index_.emplace(key, entry{lru_.begin(), clock_.now_s() + m_.write_delay_s});
    while (static_cast<int64_t>(index_.size()) > m_.capacity_blocks) {
      index_.erase(lru_.back());
      lru_.pop_back();
    }
    return true;
  }
  // Completes fetch `id`; returns the group of the rank that started it.
  size_t complete(int64_t id) {
    auto it = pending_.find(id);
    it->second.fetch->complete(it->second.blocks, it->second.blocks);
    const size_t g = it->second.group;
    pending_.erase(it);
    return g;
  }
  uint64_t lookups = 0, hit_blocks = 0;
  size_t current_group = 0;  // the group whose ranks plan now (set by the event loop)

 private:
  struct entry {
    std::list<runtime::block_key>::iterator pos;
    double ready_s;
  };
  struct pending {
    std::shared_ptr<runtime::remote_fetch> fetch;
    size_t blocks;
    size_t group;
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

struct rank_state {
  bool prefill = true;
  int32_t group = 0;
  int32_t index = 0;  // within its pool
  std::unique_ptr<runtime::cache_manager> caches;
  std::unique_ptr<runtime::scheduler> sched;
  runtime::step_plan plan;
  double load = 0;                       // this step's compute beyond the fixed part
  int64_t pending = 0, pending_kv = 0;   // handoffs on their way here
  int64_t placed = 0;
};

struct group_state {
  bool prefill = true;
  std::vector<int32_t> ranks;  // indices into the sim's ranks
  bool stepping = false;
  std::mt19937_64 rng;
  // The step in flight: when it began, whether it falls in the measured window, and, on shared
  // cores, the seconds of full-speed compute it still needs as of `since`.
  double step_start = 0, work_left = 0, since = 0;
  bool counted = false;
  uint64_t epoch = 0;  // bumped whenever the step's end is rescheduled
};

struct live {
  std::unique_ptr<runtime::request> req;
  int32_t rank = -1;            // where it runs now
  std::unique_ptr<runtime::request> moving;  // handoff: the decode rank's copy
  int32_t to_rank = -1;
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
    if (prof_.storage.capacity_blocks > 0)
      storage_ = std::make_shared<sim_storage>(prof_.storage, block_bytes, clock_, c.seed,
                                               [this](double t, int64_t id) { push(t, ev::fetch_done, id); });
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
          const size_t g = storage_->complete(e.a);  // the waiting request's group steps again
          if (!groups_[g].stepping) start_step(g);
          break;
        }
        case ev::handoff_done: handoff_done(e.a); break;
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
    const pool_profile& pp = prefill ? prof_.prefill : prof_.decode;
    for (int64_t g = 0; g < n / ep; ++g) {
      group_state gs;
      gs.prefill = prefill;
      gs.rng.seed(c_.seed * 6364136223846793005ull + groups_.size() * 1442695040888963407ull + 1);
      for (int64_t k = 0; k < ep; ++k) {
        rank_state r;
        r.prefill = prefill;
        r.group = static_cast<int32_t>(groups_.size());
        r.index = static_cast<int32_t>(g * ep + k);
        runtime::cache_config cc;
        cc.num_blocks = pp.kv_blocks;
        cc.payload = false;
        cc.swa_slots = pp.max_running + 8;
        cc.swa_snapshots = 128;
        cc.time = std::shared_ptr<const runtime::clock>(&clock_, [](const runtime::clock*) {});
        if (prefill && storage_) cc.remote = storage_, cc.remote_timeout_s = prof_.storage.timeout_s;
        r.caches = std::make_unique<runtime::cache_manager>(prof_.model, cc);
        runtime::scheduler_config sc;
        sc.token_budget = pp.token_budget;
        sc.max_running = pp.max_running;
        sc.step_time_budget_s = pp.step_time_budget_s;
        sc.cost = pp.step;
        r.sched = std::make_unique<runtime::scheduler>(sc, *r.caches);
        gs.ranks.push_back(static_cast<int32_t>(ranks_.size()));
        ranks_.push_back(std::move(r));
      }
      groups_.push_back(std::move(gs));
    }
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
    runtime::prefill_request pr{r->id, w.input_len, runtime::chain_keys(r->tokens, static_cast<int>(prof_.model.block_size))};
    auto e = balancer_->place(pr, clock_.now_s());
    records_[i].tier = balancer_->tier_of(w.input_len);
    if (!e) return;  // no prefill rank: cannot happen with ranks > 0
    rank_state& rk = prefill_rank(*e);
    records_[i].prefill_rank = static_cast<int32_t>(*e);
    rk.sched->add(r.get());
    live& l = live_[w.id];
    l.rank = static_cast<int32_t>(*e);
    l.req = std::move(r);
    if (!groups_[static_cast<size_t>(rk.group)].stepping) start_step(static_cast<size_t>(rk.group));
  }

  void start_step(size_t g) {
    group_state& gs = groups_[g];
    const pool_profile& pp = gs.prefill ? prof_.prefill : prof_.decode;
    const double now = clock_.now_s();
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
          if (r->output_len() == 1) {
            rec.first_token_s = now;
            rec.cached_tokens = r->cached_tokens;
          }
        }
        rk.caches->commit(*r);
        if (r->output_len() >= r->params.max_tokens) {
          rec.finish_s = now;
          rec.output = r->output_len();
          rec.preemptions += r->preemptions;
          rk.sched->finish(r);
          if (rk.prefill && !r->handed_off) balancer_->done(r->id, now);
          live_.erase(r->id.value);
        } else if (rk.prefill && sampled && r->output_len() == 1 && !r->handed_off) {
          hand_off(rk, *r);
        }
      }
      rk.plan = {};
    }
    start_step(g);
  }

  void hand_off(rank_state& from, runtime::request& r) {
    r.handed_off = true;
    balancer_->done(r.id, clock_.now_s());
    const int64_t context = r.num_tokens();
    runtime::decode_ask ask{context, r.params.max_tokens - r.output_len(), from.caches->blocks_for(context) + 1};
    std::vector<runtime::decode_candidate> cands;
    for (int64_t i = 0; i < c_.decode_ranks; ++i) {
      rank_state& d = decode_rank(i);
      int64_t kv = d.pending_kv;
      for (const runtime::request* q : d.sched->running_requests()) kv += q->computed();
      cands.push_back({i, static_cast<int64_t>(d.sched->running() + d.sched->waiting()) + d.pending, kv,
                       d.caches->pool().num_free(), false});
    }
    auto chosen = decode_policy_->choose(ask, cands, {});
    live& l = live_.at(r.id.value);
    if (chosen) {
      rank_state& d = decode_rank(*chosen);
      auto copy = std::make_unique<runtime::request>();
      copy->id = r.id;
      copy->tokens = r.tokens;
      copy->prompt_len = r.prompt_len;
      copy->params = r.params;
      copy->cached_tokens = r.cached_tokens;
      copy->handed_off = true;
      if (d.caches->adopt(*copy, r.computed())) {
        from.sched->detach(&r);
        ++d.pending;
        d.pending_kv += context;
        ++d.placed;
        l.moving = std::move(copy);
        l.to_rank = static_cast<int32_t>(*chosen);
        records_[static_cast<size_t>(r.id.value)].decode_rank = l.to_rank;
        const double bytes = static_cast<double>(r.computed()) * prof_.kv_bytes_per_token;
        push(clock_.now_s() + prof_.handoff_latency_s + bytes * 8 / (prof_.handoff_gbps * 1e9), ev::handoff_done,
             r.id.value);
        ++handoffs_;
        return;
      }
    }
    ++kept_;  // no decode rank has room: it decodes here
  }

  void handoff_done(int64_t id) {
    live& l = live_.at(id);
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
