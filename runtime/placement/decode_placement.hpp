// Which decode engine continues a request a prefill engine has just handed off (DISAGG.md
// step 3). A policy sees the request's needs and a snapshot of every decode engine, and
// skips those that already refused it (no room) or drain; nullopt means none can take it and
// the prefill engine decodes it itself. Policies: the two-dimensional decode balancer
// (request count and KV length at once), least requests (vLLM's DP balancer) and round-robin
// as baselines, and the balance ratio they are judged by.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "runtime/base/ids.hpp"

namespace shoal::runtime {

struct decode_candidate {
  engine_id engine;           // as the caller knows it
  int64_t running = 0;        // requests it runs or is reading
  int64_t kv_tokens = 0;      // tokens in their caches
  int64_t blocks_free = 0;
  bool draining = false;
};

struct decode_ask {
  int64_t context_tokens = 0;  // tokens handed off (prompt + first token)
  int64_t max_new_tokens = 0;
  int64_t blocks_needed = 0;   // to take the handoff and decode one token
};

class decode_placement {
 public:
  virtual ~decode_placement() = default;
  virtual std::string name() const = 0;
  // The engine to ask next, never one of `refused`; nullopt when no engine fits.
  virtual std::optional<engine_id> choose(const decode_ask& ask, std::span<const decode_candidate> engines,
                                        std::span<const engine_id> refused) const = 0;
};

// Fewest running requests among the engines with room for the handoff; ties go to the most
// free blocks, then the lowest engine index (deterministic).
class least_loaded_placement final : public decode_placement {
 public:
  std::string name() const override { return "least_loaded"; }
  std::optional<engine_id> choose(const decode_ask& ask, std::span<const decode_candidate> engines,
                                std::span<const engine_id> refused) const override;
};

// The decode balancer: a decode step's time grows with its batch (request count) and with the
// KV it attends over (total cache tokens), so both must be even across engines. The request
// (L = its context + half its expected output: the cache it holds on average over its life)
// goes where it increases the sum of squared loads the least (lowest wins; ties: the lower
// engine id):
//     score(e) = w_r² ((r_e + 1)² − r_e²) + w_k² ((k_e + L)² − k_e²)
// Weights: with a decode step cost model t = a + b·requests + c·KV tokens (the profile's),
// w_r = b and w_k = c, so the load is the engine's predicted step time beyond a; without one,
// each dimension is normalised by the cluster's mean after the placement, w_r = 1 / R̄ with
// R̄ = (Σr + 1) / N and w_k = 1 / K̄ with K̄ = (Σk + L) / N. Either way a short request barely
// moves the KV term, so it goes to an engine with few requests even if their caches are long;
// a long one goes to an engine with a small cache.
class decode_balancer final : public decode_placement {
 public:
  decode_balancer() = default;
  // Step-time weights: seconds per request and per KV token of a decode step (both > 0).
  decode_balancer(double per_request_s, double per_kv_token_s) : w_r_(per_request_s), w_k_(per_kv_token_s) {}
  std::string name() const override { return "decode_balancer"; }
  std::optional<engine_id> choose(const decode_ask& ask, std::span<const decode_candidate> engines,
                                std::span<const engine_id> refused) const override;
  // The score above with weights w_r, w_k (exposed for tests and the shell).
  static double score(const decode_candidate& e, int64_t L, double w_r, double w_k);
  static int64_t cache_tokens(const decode_ask& ask) { return ask.context_tokens + ask.max_new_tokens / 2; }

 private:
  double w_r_ = 0, w_k_ = 0;  // 0: normalise by the means
};

// Fewest KV tokens among the engines with room (Dynamo's KV router counts an engine's decode
// blocks as its load); ties: fewer running, then the lower engine index.
class least_kv_placement final : public decode_placement {
 public:
  std::string name() const override { return "least_kv"; }
  std::optional<engine_id> choose(const decode_ask& ask, std::span<const decode_candidate> engines,
                                std::span<const engine_id> refused) const override;
};

// Engines in the order given, cyclically (skipping those without room).
class round_robin_placement final : public decode_placement {
 public:
  std::string name() const override { return "round_robin"; }
  std::optional<engine_id> choose(const decode_ask& ask, std::span<const decode_candidate> engines,
                                std::span<const engine_id> refused) const override;

 private:
  mutable size_t next_ = 0;
};

// mean / max of per-engine loads (1.0 = perfectly even; TensorRT-LLM's balance ratio); 1.0
// for no engines or all loads 0.
double balance_ratio(std::span<const double> loads);

// decode_balancer, least_loaded (alias least_requests), least_kv, round_robin; null otherwise.
// `step`: a decode step cost model (a, b per request, c per KV token) the decode balancer
// weighs its two dimensions with (b, c > 0), else it normalises them by their means.
std::unique_ptr<decode_placement> make_decode_placement(const std::string& name, double per_request_s = 0,
                                                        double per_kv_token_s = 0);

}  // namespace shoal::runtime
