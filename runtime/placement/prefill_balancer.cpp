// The prefill balancer: tier reassignment by demand share, earliest predicted finish with the
// prefix index, and the baselines (prefill_balancer.hpp).
#include "runtime/placement/prefill_balancer.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/assert.hpp"

namespace shoal::runtime {

const char* to_string(prefill_policy p) {
  switch (p) {
    case prefill_policy::tiered: return "tiered";
    case prefill_policy::untiered: return "untiered";
    case prefill_policy::round_robin: return "round_robin";
    case prefill_policy::least_requests: return "least_requests";
    case prefill_policy::cache_aware: return "cache_aware";
    case prefill_policy::dynamo: return "dynamo";
  }
  return "?";
}

std::optional<prefill_policy> prefill_policy_named(const std::string& name) {
  for (auto p : {prefill_policy::tiered, prefill_policy::untiered, prefill_policy::round_robin,
                 prefill_policy::least_requests, prefill_policy::cache_aware, prefill_policy::dynamo})
    if (name == to_string(p)) return p;
  return std::nullopt;
}

prefill_balancer::prefill_balancer(prefill_balancer_config config) : config_(std::move(config)) {
  SHOAL_ASSERT(std::is_sorted(config_.tier_bounds.begin(), config_.tier_bounds.end()));
  SHOAL_ASSERT(config_.block_size > 0);
  demand_.assign(static_cast<size_t>(tiers()), 0.0);
}

int32_t prefill_balancer::tier_of(int64_t prompt_tokens) const {
  return static_cast<int32_t>(std::upper_bound(config_.tier_bounds.begin(), config_.tier_bounds.end(), prompt_tokens) -
                              config_.tier_bounds.begin());
}

std::map<engine_id, int32_t> prefill_balancer::assign_tiers(std::span<const double> demand,
                                                            std::span<const engine_id> engines) {
  std::map<engine_id, int32_t> out;
  const double total = std::accumulate(demand.begin(), demand.end(), 0.0);
  const auto wanted = static_cast<size_t>(std::count_if(demand.begin(), demand.end(), [](double d) { return d > 0; }));
  const auto n = static_cast<int64_t>(engines.size());
  if (total <= 0 || static_cast<size_t>(n) < wanted) {  // nothing to go by, or too few engines: all serve all
    for (engine_id e : engines) out[e] = -1;
    return out;
  }
  std::vector<double> quota(demand.size());
  std::vector<int64_t> seats(demand.size(), 0);
  for (size_t t = 0; t < demand.size(); ++t) {
    quota[t] = demand[t] / total * static_cast<double>(n);
    if (demand[t] > 0) seats[t] = std::max<int64_t>(1, static_cast<int64_t>(std::floor(quota[t])));
  }
  auto sum = [&] { return std::accumulate(seats.begin(), seats.end(), int64_t{0}); };
  while (sum() > n) {  // the floors of 1 overshot: take from the most over-seated tier
    size_t worst = demand.size();
    for (size_t t = 0; t < demand.size(); ++t)
      if (seats[t] > 1 && (worst == demand.size() || quota[t] - seats[t] <= quota[worst] - seats[worst])) worst = t;
    --seats[worst];
  }
  while (sum() < n) {  // largest remainder, ties to the lower tier
    size_t best = 0;
    for (size_t t = 1; t < demand.size(); ++t)
      if (quota[t] - seats[t] > quota[best] - seats[best]) best = t;
    ++seats[best];
  }
  size_t e = 0;
  for (size_t t = 0; t < demand.size(); ++t)
    for (int64_t k = 0; k < seats[t]; ++k) out[engines[e++]] = static_cast<int32_t>(t);
  return out;
}

void prefill_balancer::add_engine(engine_id engine, cost_model cost, int64_t group) {
  engine_state s;
  s.cost = cost;
  s.group = group;
  engines_[engine] = std::move(s);
}

bool prefill_balancer::set_cost(engine_id engine, cost_model cost) {
  auto it = engines_.find(engine);
  if (it == engines_.end()) return false;
  it->second.cost = cost;
  return true;
}

std::vector<request_id> prefill_balancer::remove_engine(engine_id engine) {
  std::vector<std::pair<uint64_t, request_id>> lost;
  for (const auto& [id, p] : in_flight_)
    if (p.engine == engine) lost.emplace_back(p.order, id);
  std::sort(lost.begin(), lost.end());
  std::vector<request_id> out;
  for (const auto& [order, id] : lost) {
    in_flight_.erase(id);
    out.push_back(id);
  }
  engines_.erase(engine);
  return out;
}

int64_t prefill_balancer::group_tokens(int64_t group, engine_id engine) const {
  if (group < 0) return engines_.at(engine).in_flight_tokens;
  int64_t sum = 0;
  for (const auto& [id, e] : engines_)
    if (e.group == group) sum += e.in_flight_tokens;
  return sum;
}

int64_t prefill_balancer::cached_tokens(const prefill_request& r, engine_id engine) const {
  auto it = engines_.find(engine);
  if (it == engines_.end()) return 0;
  int64_t hit = 0;
  while (hit < static_cast<int64_t>(r.keys.size()) && it->second.index.contains(r.keys[static_cast<size_t>(hit)])) ++hit;
  return std::min(hit * config_.block_size, std::max<int64_t>(0, r.prompt_tokens - 1));  // ≥ 1 token computed
}

double prefill_balancer::predicted_s(const prefill_request& r, engine_id engine) const {
  const int64_t h = cached_tokens(r, engine);
  return engines_.at(engine).cost.predict(r.prompt_tokens - h, h);
}

void prefill_balancer::remember(engine_state& e, const std::vector<block_key>& keys) {
  for (const auto& k : keys) {
    if (auto it = e.index.find(k); it != e.index.end()) {
      e.lru.splice(e.lru.begin(), e.lru, it->second);
      continue;
    }
    e.lru.push_front(k);
    e.index[k] = e.lru.begin();
  }
  while (static_cast<int64_t>(e.lru.size()) > config_.index_blocks) {
    e.index.erase(e.lru.back());
    e.lru.pop_back();
  }
}

void prefill_balancer::maybe_end_round(double now_s) {
  if (round_start_s_ < 0) round_start_s_ = now_s;
  if (now_s - round_start_s_ < config_.round_s) return;
  if (config_.policy == prefill_policy::tiered) {
    std::vector<engine_id> ids;
    for (const auto& [id, e] : engines_) ids.push_back(id);
    for (const auto& [id, tier] : assign_tiers(demand_, ids)) engines_.at(id).tier = tier;
  }
  std::fill(demand_.begin(), demand_.end(), 0.0);
  round_start_s_ = now_s;
}

std::optional<engine_id> prefill_balancer::choose(const prefill_request& r, double now_s,
                                                  std::span<const engine_id> exclude) {
  std::vector<std::pair<engine_id, const engine_state*>> cand;  // id order
  for (const auto& [id, e] : engines_)
    if (std::find(exclude.begin(), exclude.end(), id) == exclude.end()) cand.emplace_back(id, &e);
  if (cand.empty()) return std::nullopt;
  const int64_t n = r.prompt_tokens;
  switch (config_.policy) {
    case prefill_policy::round_robin: {
      // The next engine in id order after the last one chosen (cyclically).
      auto it = std::upper_bound(cand.begin(), cand.end(), last_rr_, [](engine_id v, const auto& c) { return v < c.first; });
      if (it == cand.end()) it = cand.begin();
      last_rr_ = it->first;
      return it->first;
    }
    case prefill_policy::least_requests: {
      auto best = std::min_element(cand.begin(), cand.end(), [](const auto& a, const auto& b) {
        return a.second->in_flight < b.second->in_flight;  // first of equals: the lowest id
      });
      return best->first;
    }
    case prefill_policy::cache_aware: {
      int64_t lo = INT64_MAX, hi = 0;
      for (const auto& [id, e] : cand) lo = std::min(lo, e->in_flight), hi = std::max(hi, e->in_flight);
      if (hi - lo > config_.balance_abs && static_cast<double>(hi) > config_.balance_rel * static_cast<double>(lo)) {
        for (const auto& [id, e] : cand)
          if (e->in_flight == lo) return id;
      }
      engine_id best;
      int64_t best_hit = -1, best_load = 0;
      for (const auto& [id, e] : cand) {
        const int64_t h = cached_tokens(r, id);
        if (h > best_hit || (h == best_hit && e->in_flight < best_load)) best = id, best_hit = h, best_load = e->in_flight;
      }
      if (n > 0 && static_cast<double>(best_hit) / static_cast<double>(n) > config_.cache_threshold) return best;
      auto smallest = std::min_element(cand.begin(), cand.end(), [](const auto& a, const auto& b) {
        return a.second->lru.size() < b.second->lru.size();
      });
      return smallest->first;
    }
    case prefill_policy::dynamo: {
      engine_id best;
      double best_cost = 0;
      for (const auto& [id, e] : cand) {
        const double overlap = static_cast<double>(cached_tokens(r, id));
        const double blocks = std::ceil(static_cast<double>(e->in_flight_tokens) / static_cast<double>(config_.block_size));
        const double cost = config_.prefill_load_scale *
                              std::max(static_cast<double>(e->in_flight_tokens + n) - overlap, 0.0) + blocks;
        if (!best.valid() || cost < best_cost) best = id, best_cost = cost;
      }
      return best;
    }
    case prefill_policy::tiered:
    case prefill_policy::untiered: {
      const int32_t tier = config_.policy == prefill_policy::tiered ? tier_of(n) : -1;
      bool any = false;
      for (const auto& [id, e] : cand) any = any || tier < 0 || e->tier < 0 || e->tier == tier;
      engine_id best;
      int64_t best_hit = 0, best_group = 0;
      double best_finish = 0;
      for (const auto& [id, e] : cand) {
        if (any && tier >= 0 && e->tier >= 0 && e->tier != tier) continue;
        const int64_t h = cached_tokens(r, id);
        const double finish = std::max(now_s, e->busy_until_s) + e->cost.predict(n - h, h);
        if (best.valid() && (finish > best_finish || (finish == best_finish && h < best_hit))) continue;
        const int64_t g = group_tokens(e->group, id);
        if (best.valid() && finish == best_finish && h == best_hit && g >= best_group) continue;  // then the quieter group
        best = id, best_finish = finish, best_hit = h, best_group = g;
      }
      return best;
    }
  }
  return std::nullopt;
}

std::optional<engine_id> prefill_balancer::place(const prefill_request& r, double now_s,
                                                 std::span<const engine_id> exclude) {
  maybe_end_round(now_s);
  done(r.id, now_s);  // placed again (its engine failed it): the old placement ends
  auto chosen = choose(r, now_s, exclude);
  if (!chosen) return std::nullopt;
  engine_state& e = engines_.at(*chosen);
  const double t = predicted_s(r, *chosen);
  e.busy_until_s = std::max(now_s, e.busy_until_s) + t;
  e.in_flight_tokens += r.prompt_tokens;
  ++e.in_flight;
  demand_[static_cast<size_t>(tier_of(r.prompt_tokens))] += t;
  remember(e, r.keys);
  in_flight_[r.id] = {*chosen, r.prompt_tokens, order_++};
  return chosen;
}

void prefill_balancer::done(request_id id, double now_s) {
  auto it = in_flight_.find(id);
  if (it == in_flight_.end()) return;
  auto e = engines_.find(it->second.engine);
  if (e != engines_.end()) {
    e->second.in_flight_tokens -= it->second.tokens;
    if (--e->second.in_flight == 0) e->second.busy_until_s = std::min(e->second.busy_until_s, now_s);  // idle now
  }
  in_flight_.erase(it);
}

std::vector<prefill_engine_view> prefill_balancer::engines() const {
  std::vector<prefill_engine_view> out;
  for (const auto& [id, e] : engines_)
    out.push_back({id, e.tier, e.in_flight, e.in_flight_tokens, e.busy_until_s, static_cast<int64_t>(e.lru.size())});
  return out;
}

}  // namespace shoal::runtime
