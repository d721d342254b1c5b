// Which prefill engine computes a request's prompt (MISSION.md "Prefill balancer"). Plain
// state, fed by the caller: engines join and leave, each placement is recorded until its
// prefill is reported done, and the clock is the caller's (virtual time in the simulator,
// wall time in an actor).
//
// The tiered policy: requests are bucketed by prompt length into tiers (boundaries
// configurable, default < 16K, 16–64K, 64–256K, ≥ 256K tokens). Every `round_s` the engines
// are reassigned to tiers in proportion to each tier's share of the predicted compute of the
// requests placed in the round just ended (largest remainder; a tier that had demand keeps
// ≥ 1 engine while there are engines enough; engines go to tiers in engine-id order, tier by
// tier, so an assignment is a function of the demands alone). Until the first round ends,
// and whenever a tier has no engine, every engine serves it. Within its tier a request goes
// to the engine with the earliest predicted finish:
//     finish(e) = max(now, busy_until(e)) + t_e(n − h_e, h_e)
// where t_e is the engine's cost model t(n, p) = a + b·n + c·n·p + d·n², n the prompt length
// and h_e the leading prompt tokens already cached at e (the prefix index: the block keys of
// the prompts placed there, at most `index_blocks` per engine, least recently placed
// forgotten first). Prefix locality is thus worth exactly the compute it saves; no separate
// bonus weight. Ties: the longer cached prefix, then the fewest prompt tokens in flight in the
// engine's expert-parallel group (its lockstep steps are as long as its busiest rank's), then
// the lower engine id.
//
// Baselines behind the same class (`policy`), for comparisons in one run:
// - round_robin: engines in id order, cyclically;
// - least_requests: fewest prefills in flight (vLLM's data-parallel balancer), then lowest id;
// - cache_aware: SGLang's router — when the load is imbalanced (max − min in-flight >
//   balance_abs and max > balance_rel · min) the least loaded engine; else the engine with the
//   longest cached prefix when it covers > cache_threshold of the prompt, else the engine
//   with the fewest indexed blocks (defaults 0.3, 64, 1.5);
// - dynamo: Dynamo's KV router cost prefill_load_scale · max(active_prefill_tokens + prompt −
//   overlap, 0) + decode_blocks, lowest wins (decode_blocks: the blocks the engine holds for
//   its in-flight requests);
// - untiered: the earliest-predicted-finish rule over all engines (the tiered policy without
//   tiers).
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/core/block_pool.hpp"
#include "runtime/core/cost_model.hpp"
#include "runtime/base/ids.hpp"

namespace shoal::runtime {

enum class prefill_policy { tiered, untiered, round_robin, least_requests, cache_aware, dynamo };
const char* to_string(prefill_policy p);
std::optional<prefill_policy> prefill_policy_named(const std::string& name);

struct prefill_balancer_config {
  prefill_policy policy = prefill_policy::tiered;
  std::vector<int64_t> tier_bounds = {16 * 1024, 64 * 1024, 256 * 1024};  // ascending, tokens
  double round_s = 10.0;
  int64_t block_size = 64;       // tokens per prefix-index key
  int64_t index_blocks = 65536;  // per engine
  // cache_aware
  double cache_threshold = 0.3;
  int64_t balance_abs = 64;
  double balance_rel = 1.5;
  // dynamo
  double prefill_load_scale = 1.0;
};

struct prefill_request {
  request_id id;
  int64_t prompt_tokens = 0;
  std::vector<block_key> keys;  // chain keys of the prompt's full blocks
};

struct prefill_engine_view {
  engine_id engine;
  int32_t tier = -1;            // −1: serves every tier
  int64_t in_flight = 0;
  int64_t in_flight_tokens = 0; // prompt tokens of its prefills in flight
  double busy_until_s = 0;
  int64_t indexed_blocks = 0;
};

class prefill_balancer {
 public:
  explicit prefill_balancer(prefill_balancer_config config = {});

  // `group`: the expert-parallel group the engine steps in lockstep with (−1: its own). A
  // group's step lasts as long as its busiest rank's, so among engines that finish equally
  // early the one whose group has the fewest prompt tokens in flight is chosen.
  void add_engine(engine_id engine, cost_model cost, int64_t group = -1);
  // The engine's step-cost model from now on (one it fitted or loaded); false: no such engine.
  bool set_cost(engine_id engine, cost_model cost);
  // The engine is gone (down) or draining: it gets nothing more; returns the requests placed
  // there and not reported done, in placement order, for the caller to place again.
  std::vector<request_id> remove_engine(engine_id engine);
  // The engine for `r` at time `now_s`, never one of `exclude` (nullopt: no engine left);
  // recorded as in flight there (a request placed again leaves its old engine first).
  std::optional<engine_id> place(const prefill_request& r, double now_s, std::span<const engine_id> exclude = {});
  // r's prefill ended (handed off, finished or failed) at `now_s`.
  void done(request_id id, double now_s);

  // Tier of a prompt length: the number of bounds ≤ it.
  int32_t tier_of(int64_t prompt_tokens) const;
  int32_t tiers() const { return static_cast<int32_t>(config_.tier_bounds.size()) + 1; }
  // Engines per tier after a round whose predicted demand per tier (seconds) was `demand`,
  // among `engines` (ascending ids): the tiered policy's reassignment rule.
  static std::map<engine_id, int32_t> assign_tiers(std::span<const double> demand, std::span<const engine_id> engines);
  // Predicted seconds of r at `engine` (its cost model, its cached prefix).
  double predicted_s(const prefill_request& r, engine_id engine) const;
  int64_t cached_tokens(const prefill_request& r, engine_id engine) const;
  std::vector<prefill_engine_view> engines() const;
  const prefill_balancer_config& config() const { return config_; }

 private:
  struct engine_state {
    cost_model cost;
    int32_t tier = -1;
    int64_t group = -1;
    double busy_until_s = 0;
    int64_t in_flight_tokens = 0;
    int64_t in_flight = 0;
    std::list<block_key> lru;  // front = most recently placed
    std::unordered_map<block_key, std::list<block_key>::iterator, block_key_hash> index;
  };
  struct placed {
    engine_id engine;
    int64_t tokens;
    uint64_t order;
  };
  void maybe_end_round(double now_s);
  void remember(engine_state& e, const std::vector<block_key>& keys);
  std::optional<engine_id> choose(const prefill_request& r, double now_s, std::span<const engine_id> exclude);

  prefill_balancer_config config_;
  int64_t group_tokens(int64_t group, engine_id engine) const;
  std::map<engine_id, engine_state> engines_;  // by id: iteration in id order
  std::unordered_map<request_id, placed> in_flight_;  // → where
  std::vector<double> demand_;               // this round's predicted seconds per tier
  double round_start_s_ = -1;
  engine_id last_rr_;  // round robin: the engine chosen last
  uint64_t order_ = 0;
};

}  // namespace shoal::runtime
