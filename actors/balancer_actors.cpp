// The balancer actors over prefill_routing and decode_routing (balancer_actors.hpp).
#include "actors/balancer_actors.hpp"

#include <algorithm>
#include <chrono>

#include <caf/actor_system.hpp>
#include <caf/result.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <fmt/format.h>

#include "runtime/core/block_pool.hpp"
#include "runtime/base/fault_points.hpp"

namespace shoal::actors {

namespace {

bool has_engine_role(const node_info& n) {
  return std::find(n.roles.begin(), n.roles.end(), "engine") != n.roles.end();
}

bool contains(const std::vector<caf::actor>& v, const caf::actor& a) { return std::find(v.begin(), v.end(), a) != v.end(); }

}  // namespace

engine_id engine_ids::of(const caf::actor& engine) {
  auto [it, fresh] = ids_.try_emplace(engine.address(), engine_id{next_});
  if (fresh) ++next_;
  return it->second;
}

std::optional<engine_id> engine_ids::find(const caf::actor& engine) const {
  auto it = ids_.find(engine.address());
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

// -- prefill ------------------------------------------------------------------------------

prefill_routing::prefill_routing(runtime::prefill_balancer_config config, runtime::cost_model cost, bool explicit_cost)
    : balancer_(std::move(config)), cost_(cost), explicit_cost_(explicit_cost),
      tier_placements_(static_cast<size_t>(balancer_.tiers()), 0) {}

void prefill_routing::observe_cost(const caf::actor& a, const runtime::cost_stats& s) {
  auto id = ids_.find(a);
  if (explicit_cost_ || s.coef.size() != 4 || !id || !entry_.contains(*id)) return;
  if (auto have = own_.find(*id); have != own_.end() && have->second == s.coef) return;
  if (balancer_.set_cost(*id, runtime::cost_model(s.coef[0], s.coef[1], s.coef[2], s.coef[3]))) own_[*id] = s.coef;
}

std::vector<caf::actor> prefill_routing::entry_engines() const {
  std::vector<caf::actor> out;
  for (const auto& [id, ref] : entry_) out.push_back(ref.actor);
  return out;
}

std::pair<size_t, size_t> prefill_routing::own_models() const {
  size_t n = 0;
  for (const auto& [id, ref] : entry_) n += own_.contains(id);
  return {n, entry_.size()};
}

void prefill_routing::update(const membership& m) {
  std::map<engine_id, engine_ref> entry;
  fallback_.clear();
  for (const node_info& n : m.nodes) {
    if (n.draining || !has_engine_role(n)) continue;
    for (const rank_info& r : n.ranks) {
      if (!r.engine) continue;
      engine_ref ref{r.engine, ids_.of(r.engine), n.name + "/" + std::to_string(r.index), 0};
      if (n.engine_role == "decode") {
        fallback_.push_back(std::move(ref));
        continue;
      }
      if (auto old = entry_.find(ref.id); old != entry_.end()) ref.placed = old->second.placed;
      else balancer_.add_engine(ref.id, cost_);
      entry.emplace(ref.id, std::move(ref));
    }
  }
  for (const auto& [id, ref] : entry_)
    if (!entry.contains(id)) balancer_.remove_engine(id), own_.erase(id);  // its relays place their requests again
  entry_ = std::move(entry);
}

std::optional<caf::actor> prefill_routing::route(request_id id, const std::vector<int32_t>& prompt,
                                                 const std::vector<caf::actor>& exclude, double now_s) {
  std::vector<engine_id> excluded;
  for (const auto& [eid, ref] : entry_)
    if (contains(exclude, ref.actor)) excluded.push_back(eid);
  runtime::prefill_request r{id, static_cast<int64_t>(prompt.size()),
                             runtime::chain_keys(prompt, static_cast<int>(balancer_.config().block_size))};
  if (auto e = balancer_.place(r, now_s, excluded)) {
    engine_ref& ref = entry_.at(*e);
    ++ref.placed;
    ++tier_placements_[static_cast<size_t>(balancer_.tier_of(r.prompt_tokens))];
    return ref.actor;
  }
  for (size_t k = 0; k < fallback_.size(); ++k) {  // no entry engine: decode engines in turn
    engine_ref& ref = fallback_[(next_fallback_ + k) % fallback_.size()];
    if (contains(exclude, ref.actor)) continue;
    next_fallback_ = (next_fallback_ + k + 1) % fallback_.size();
    ++ref.placed;
    return ref.actor;
  }
  return std::nullopt;
}

void prefill_routing::done(request_id id, double now_s) { balancer_.done(id, now_s); }

balancer_report prefill_routing::report(double now_s) const {
  balancer_report out;
  out.kind = "prefill";
  out.policy = runtime::to_string(balancer_.config().policy);
  out.tier_bounds = balancer_.config().tier_bounds;
  out.tier_placements = tier_placements_;
  const auto [own, all] = own_models();
  out.cost = explicit_cost_ ? "gateway.balancer_cost_model"
                            : fmt::format("the engines' own: {} of {} (the others: the default until they report one)", own, all);
  for (const auto& v : balancer_.engines()) {
    const engine_ref& ref = entry_.at(v.engine);
    out.engines.push_back({ref.name, v.tier, v.in_flight, v.in_flight_tokens, std::max(0.0, v.busy_until_s - now_s), ref.placed});
  }
  for (const auto& ref : fallback_) out.engines.push_back({ref.name + " (decode)", -1, 0, 0, 0, ref.placed});
  return out;
}

// -- decode -------------------------------------------------------------------------------

decode_routing::decode_routing(const std::string& policy, const runtime::cost_model& step, bool explicit_step)
    : placement_(runtime::make_decode_placement(policy, step.b() + step.d(), step.c())), policy_(policy),
      explicit_step_(explicit_step) {
  if (!placement_) placement_ = runtime::make_decode_placement(policy_ = "decode_balancer");
  if (explicit_step_) weights_ = "gateway.balancer_cost_model";
  if (policy_ != "decode_balancer") weights_ = "none (" + policy_ + " weighs nothing)";
}

void decode_routing::observe_cost(const caf::actor& engine, const runtime::cost_stats& decode_cost) {
  auto id = ids_.find(engine);
  if (explicit_step_ || !id || decode_cost.coef.size() != 4) return;
  auto& have = own_[*id];
  if (have == decode_cost.coef) return;
  have = decode_cost.coef;
  reweigh();
}

// Once every decode engine has its own decode model: a request weighs their mean b + d (a
// decode item, n = 1), a KV token their mean c; weights that are not both positive leave each
// dimension relative to its mean, as before any model.
void decode_routing::reweigh() {
  if (policy_ != "decode_balancer") return;  // the others weigh nothing
  size_t own = 0;
  double per_request = 0, per_kv = 0;
  for (const engine_ref& e : engines_)
    if (auto m = own_.find(e.id); m != own_.end()) ++own, per_request += m->second[1] + m->second[3], per_kv += m->second[2];
  if (own == 0 || own < engines_.size()) return;
  per_request /= static_cast<double>(own), per_kv /= static_cast<double>(own);
  if (!(per_request > 0 && per_kv > 0)) {
    weights_ = fmt::format("none: the engines' decode fits ({} of {}) give no positive weights", own, engines_.size());
    return;
  }
  placement_ = runtime::make_decode_placement(policy_, per_request, per_kv);
  weights_ = fmt::format("the engines' decode fits ({} of {}): {:.3g} ms per request, {:.3g} us per KV token", own,
                         engines_.size(), per_request * 1e3, per_kv * 1e6);
}

void decode_routing::update(const membership& m) {
  std::vector<engine_ref> engines;
  for (const node_info& n : m.nodes) {
    if (n.draining || !has_engine_role(n) || n.engine_role != "decode") continue;
    for (const rank_info& r : n.ranks) {
      if (!r.engine) continue;
      engine_ref ref{r.engine, ids_.of(r.engine), n.name + "/" + std::to_string(r.index), 0};
      for (const auto& old : engines_)
        if (old.id == ref.id) ref.placed = old.placed;
      engines.push_back(std::move(ref));
    }
  }
  engines_ = std::move(engines);
}

std::optional<caf::actor> decode_routing::route(request_id id, const runtime::decode_ask& ask,
                                                const std::vector<caf::actor>& refused) {
  done(id);  // asked again (refused): the last placement ended
  std::vector<runtime::decode_candidate> candidates;
  std::vector<engine_id> refused_ids;
  for (const engine_ref& e : engines_) {
    auto free = blocks_free_.find(e.id);
    candidates.push_back({e.id, in_flight_[e.id], kv_tokens_[e.id],
                          free == blocks_free_.end() ? ask.blocks_needed : free->second, false});
    if (contains(refused, e.actor)) refused_ids.push_back(e.id);
  }
  auto chosen = placement_->choose(ask, candidates, refused_ids);
  if (!chosen) return std::nullopt;
  auto e = std::find_if(engines_.begin(), engines_.end(), [&](const engine_ref& r) { return r.id == *chosen; });
  ++in_flight_[e->id];
  kv_tokens_[e->id] += runtime::decode_balancer::cache_tokens(ask);  // until the next poll says
  ++e->placed;
  placed_[id] = e->id;
  return e->actor;
}

void decode_routing::done(request_id id) {
  auto it = placed_.find(id);
  if (it == placed_.end()) return;
  auto f = in_flight_.find(it->second);
  if (f != in_flight_.end() && f->second > 0) --f->second;
  placed_.erase(it);
}

void decode_routing::observe(const caf::actor& engine, int64_t blocks_free, int64_t kv_tokens) {
  auto id = ids_.find(engine);
  if (!id) return;  // not (or no longer) a decode engine of this balancer
  blocks_free_[*id] = blocks_free;
  kv_tokens_[*id] = kv_tokens;
}

double decode_routing::balance_now() const {
  // Each engine's load: its requests and its KV tokens, each relative to the mean (the two
  // dimensions the decode balancer evens out); mean / max of those loads.
  if (engines_.empty()) return 1.0;
  double sr = 0, sk = 0;
  std::vector<std::pair<double, double>> rk;
  for (const auto& e : engines_) {
    auto r = in_flight_.find(e.id);
    auto k = kv_tokens_.find(e.id);
    rk.emplace_back(r == in_flight_.end() ? 0.0 : static_cast<double>(r->second),
                    k == kv_tokens_.end() ? 0.0 : static_cast<double>(k->second));
    sr += rk.back().first, sk += rk.back().second;
  }
  const double n = static_cast<double>(rk.size()), mr = sr / n, mk = sk / n;
  std::vector<double> loads;
  for (auto [r, k] : rk) loads.push_back((mr > 0 ? r / mr : 0) + (mk > 0 ? k / mk : 0));
  return runtime::balance_ratio(loads);
}

void decode_routing::sample() {
  window_.push_back(balance_now());
  while (window_.size() > 300) window_.pop_front();
}

balancer_report decode_routing::report() const {
  balancer_report out;
  out.kind = "decode";
  out.policy = policy_;
  out.cost = weights_;
  for (const auto& e : engines_) {
    auto r = in_flight_.find(e.id);
    auto k = kv_tokens_.find(e.id);
    out.engines.push_back({e.name, -1, r == in_flight_.end() ? 0 : r->second, k == kv_tokens_.end() ? 0 : k->second, 0,
                           e.placed});
  }
  out.balance_now = balance_now();
  double sum = 0;
  for (double v : window_) sum += v;
  out.balance_window = window_.empty() ? out.balance_now : sum / static_cast<double>(window_.size());
  return out;
}

// -- actors -------------------------------------------------------------------------------

namespace {

double wall_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct prefill_state {
  static inline const char* name = "prefill_balancer";
  std::unique_ptr<prefill_routing> routing;
  bool polling = false;
};

// How often the prefill balancer asks its engines for their step-cost models (they change when
// an engine fits one, once, seconds after it starts).
constexpr auto cost_poll_interval = std::chrono::seconds(2);

using prefill_impl = prefill_balancer_actor::extend<caf::reacts_to<tick_atom>>;
using prefill_pointer = prefill_impl::stateful_pointer<prefill_state>;

void poll_costs(prefill_pointer self) {
  auto& st = self->state;
  const std::vector<caf::actor> engines = st.routing->entry_engines();
  const auto [own, all] = st.routing->own_models();
  st.polling = !engines.empty() && own < all;
  if (!st.polling) return;
  for (const caf::actor& a : engines)
    self->request(caf::actor_cast<engine_actor>(a), cost_poll_interval, stats_atom_v)
      .then([self, a](const engine_stats_snapshot& s) { self->state.routing->observe_cost(a, s.engine.cost); },
            [](const caf::error&) {});  // gone: the next membership drops it
  self->delayed_send(self, cost_poll_interval, tick_atom_v);
}

prefill_impl::behavior_type prefill_behavior(prefill_pointer self, balancer_options options) {
  self->state.routing = std::make_unique<prefill_routing>(options.prefill, options.cost, options.cost_fitted);
  return {
    [self](route_atom, request_id id, const std::vector<int32_t>& prompt,
           const std::vector<caf::actor>& exclude) -> caf::result<caf::actor> {
      if (auto e = self->state.routing->route(id, prompt, exclude, wall_s())) return *e;
      return make_error(errc::no_engine, self->state.routing->engines() == 0 ? "no engine is up in the cluster"
                                                                             : "every engine failed this request already");
    },
    [self](done_atom, request_id id) { self->state.routing->done(id, wall_s()); },
    [self](stats_atom) { return self->state.routing->report(wall_s()); },
    [self](const membership& m) {
      self->state.routing->update(m);
      if (!self->state.polling && !self->state.routing->explicit_cost()) poll_costs(self);
    },
    [self](tick_atom) { poll_costs(self); },
  };
}

struct decode_state {
  static inline const char* name = "decode_balancer";
  std::unique_ptr<decode_routing> routing;
  bool polling = false;
};

// How often the balancer asks each decode engine for its free blocks and KV tokens.
constexpr auto decode_poll_interval = std::chrono::milliseconds(200);

using decode_impl = decode_balancer_actor::extend<caf::reacts_to<tick_atom>>;
using decode_pointer = decode_impl::stateful_pointer<decode_state>;

void poll_decoders(decode_pointer self) {
  auto& st = self->state;
  st.polling = !st.routing->decode_engines().empty();
  if (!st.polling) return;
  st.routing->sample();
  for (const engine_ref& e : st.routing->decode_engines()) {
    caf::actor a = e.actor;
    self->request(caf::actor_cast<engine_actor>(a), decode_poll_interval * 5, stats_atom_v)
      .then([self, a](const engine_stats_snapshot& s) {
              // Fault point balancer_message: the report is lost; the last view of the engine stands.
              if (runtime::inject(runtime::fault_point::balancer_message)) return;
              self->state.routing->observe(a, s.engine.blocks_free, s.engine.kv_tokens);
              self->state.routing->observe_cost(a, s.engine.decode_cost);
            },
            [](const caf::error&) {});  // gone: the next membership drops it
  }
  self->delayed_send(self, decode_poll_interval, tick_atom_v);
}

decode_impl::behavior_type decode_behavior(decode_pointer self, balancer_options options) {
  self->state.routing = std::make_unique<decode_routing>(
    options.decode_policy, options.cost_fitted ? options.cost : runtime::cost_model{}, options.cost_fitted);
  return {
    [self](route_atom, decode_atom, request_id id, int64_t blocks, int64_t context, int64_t max_new,
           const std::vector<caf::actor>& refused) -> caf::result<caf::actor> {
      if (auto e = self->state.routing->route(id, {context, max_new, blocks}, refused)) return *e;
      return make_error(errc::no_engine, self->state.routing->decode_engines().empty()
                                             ? "no decode engine is up in the cluster"
                                             : "no decode engine has room for the handoff");
    },
    [self](done_atom, request_id id) { self->state.routing->done(id); },
    [self](stats_atom) { return self->state.routing->report(); },
    [self](const membership& m) {
      self->state.routing->update(m);
      if (!self->state.polling) poll_decoders(self);
    },
    [self](tick_atom) { poll_decoders(self); },
  };
}

}  // namespace

balancers spawn_balancers(caf::actor_system& sys, const balancer_options& options) {
  auto p = caf::actor_cast<prefill_balancer_actor>(sys.spawn(prefill_behavior, options));
  auto d = sys.spawn(decode_behavior, options);
  return {p, caf::actor_cast<decode_balancer_actor>(d)};
}

}  // namespace shoal::actors
