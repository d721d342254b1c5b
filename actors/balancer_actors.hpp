// The gateway node's two balancers (MISSION.md "Prefill balancer", "Decode balancer"), each a
// thin actor over plain state that doctest reaches without an actor system:
// - prefill_routing: runtime::prefill_balancer over the entry engines (roles prefill and both)
//   of the membership; the clock is wall time; decode engines take requests only when no
//   entry engine is up (in turn).
// - decode_routing: a runtime::decode_placement (node config gateway.decode_policy) over the
//   decode engines, fed the KV tokens and free blocks each one reports when polled (200 ms);
//   the balance ratio of their (requests, KV) load is sampled at every poll.
// Engines that leave the membership (down, draining) are dropped; the relays of their requests
// see them down and ask again with them excluded, so those requests are placed anew.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "actors/interfaces.hpp"
#include "runtime/core/cost_model.hpp"
#include "runtime/placement/decode_placement.hpp"
#include "runtime/placement/prefill_balancer.hpp"

namespace shoal::actors {

// The id each engine actor gets once, from its address: stable across membership changes.
class engine_ids {
 public:
  engine_id of(const caf::actor& engine);
  std::optional<engine_id> find(const caf::actor& engine) const;

 private:
  std::map<caf::actor_addr, engine_id> ids_;
  int64_t next_ = 0;
};

// An engine a balancer places on; its name for reports: "node/rank".
struct engine_ref {
  caf::actor actor;
  engine_id id;
  std::string name;
  int64_t placed = 0;
};

class prefill_routing {
 public:
  // `explicit_cost`: `cost` came from gateway.balancer_cost_model and stays; else each engine's
  // own model replaces it once the engine reports one (observe_cost).
  prefill_routing(runtime::prefill_balancer_config config, runtime::cost_model cost, bool explicit_cost = false);
  void update(const membership& m);
  // Engine `a`'s step-cost model as its stats report it (fitted at start, or read from a file).
  void observe_cost(const caf::actor& a, const runtime::cost_stats& s);
  std::vector<caf::actor> entry_engines() const;
  bool explicit_cost() const { return explicit_cost_; }
  // Entry engines weighed by their own model / all entry engines.
  std::pair<size_t, size_t> own_models() const;
  std::optional<caf::actor> route(request_id id, const std::vector<int32_t>& prompt,
                                  const std::vector<caf::actor>& exclude, double now_s);
  void done(request_id id, double now_s);
  balancer_report report(double now_s) const;
  size_t engines() const { return entry_.size() + fallback_.size(); }

 private:
  runtime::prefill_balancer balancer_;
  runtime::cost_model cost_;
  bool explicit_cost_ = false;
  std::map<engine_id, engine_ref> entry_;
  std::map<engine_id, std::vector<double>> own_;  // engines weighed by their own model: its coefficients
  engine_ids ids_;
  std::vector<engine_ref> fallback_;  // decode engines
  size_t next_fallback_ = 0;
  std::vector<int64_t> tier_placements_;
};

class decode_routing {
 public:
  // A runtime::make_decode_placement name; `step`: the cost model whose decode items (n = 1
  // on p cached tokens: b + d per request, c per KV token) weigh the decode balancer's two
  // dimensions (all zero: normalised by their means).
  // `explicit_step`: `step` is gateway.balancer_cost_model, which keeps the weights; else the
  // engines' own decode fits weigh them once every decode engine reported one.
  explicit decode_routing(const std::string& policy, const runtime::cost_model& step = {}, bool explicit_step = false);
  void update(const membership& m);
  std::optional<caf::actor> route(request_id id, const runtime::decode_ask& ask, const std::vector<caf::actor>& refused);
  void done(request_id id);
  // An engine's free blocks and KV tokens as it reported them (until then it is assumed to
  // have room and an empty cache).
  void observe(const caf::actor& engine, int64_t blocks_free, int64_t kv_tokens);
  // An engine's fitted decode steps (runtime::engine_stats::decode_cost; coef empty: none yet).
  void observe_cost(const caf::actor& engine, const runtime::cost_stats& decode_cost);
  // Samples the balance ratio now (after a round of polls).
  void sample();
  balancer_report report() const;
  const std::vector<engine_ref>& decode_engines() const { return engines_; }

 private:
  double balance_now() const;
  void reweigh();
  std::unique_ptr<runtime::decode_placement> placement_;
  std::string policy_;
  bool explicit_step_ = false;
  std::map<engine_id, std::vector<double>> own_;  // decode engines' fitted decode models (a, b, c, d)
  std::string weights_ = "none (each dimension relative to its mean)";
  engine_ids ids_;
  std::vector<engine_ref> engines_;  // in membership order
  std::map<engine_id, int64_t> in_flight_, blocks_free_, kv_tokens_;
  std::map<request_id, engine_id> placed_;
  std::deque<double> window_;                  // the last 300 samples (1 minute at 200 ms)
};

struct balancer_options {
  runtime::prefill_balancer_config prefill;
  runtime::cost_model cost{0, 1, 0, 0};  // the prefill balancer's engine cost model
  bool cost_fitted = false;               // `cost` is a fitted model: it weighs the decode balancer too
  std::string decode_policy = "decode_balancer";
};

balancers spawn_balancers(caf::actor_system& sys, const balancer_options& options);

}  // namespace shoal::actors
