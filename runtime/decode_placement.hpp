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

namespace shoal::runtime {

struct decode_candidate {
  int64_t engine = -1;        // the caller's index of the engine
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
  virtual std::optional<int64_t> choose(const decode_ask& ask, std::span<const decode_candidate> engines,
                                        std::span<const int64_t> refused) const = 0;
};

// Fewest running requests among the engines with room for the handoff; ties go to the most
// free blocks, then the lowest engine index (deterministic).
class least_loaded_placement final : public decode_placement {
 public:
  std::string name() const override { return "least_loaded"; }
  std::optional<int64_t> choose(const decode_ask& ask, std::span<const decode_candidate> engines,
                                std::span<const int64_t> refused) const override;
};

// The decode balancer: a decode step's time grows with its batch (request count) and with the
// KV it attends over (total cache tokens), so both must be even across engines. Loads are
// normalised by the cluster's means after the placement (R̄ = (Σr + 1) / N requests,
// K̄ = (Σk + L) / N cache tokens, L = the request's context + half its expected output), and
// the request goes where it increases the sum of squared normalised loads the least:
//     score(e) = ((r_e + 1)² − r_e²) / R̄² + ((k_e + L)² − k_e²) / K̄²
// (lowest wins; ties: the lower engine id). Each dimension counts as much as this request adds
// to it: a short request barely moves the KV term, so it goes to an engine with few requests
// even if their caches are long; a long one goes to an engine with a small cache.
class decode_balancer final : public decode_placement {
 public:
  std::string name() const override { return "decode_balancer"; }
  std::optional<int64_t> choose(const decode_ask& ask, std::span<const decode_candidate> engines,
                                std::span<const int64_t> refused) const override;
  // The score above (exposed for tests and the shell).
  static double score(const decode_candidate& e, int64_t L, double mean_requests, double mean_kv);
  static int64_t cache_tokens(const decode_ask& ask) { return ask.context_tokens + ask.max_new_tokens / 2; }
};

// Engines in the order given, cyclically (skipping those without room).
class round_robin_placement final : public decode_placement {
 public:
  std::string name() const override { return "round_robin"; }
  std::optional<int64_t> choose(const decode_ask& ask, std::span<const decode_candidate> engines,
                                std::span<const int64_t> refused) const override;

 private:
  mutable size_t next_ = 0;
};

// mean / max of per-engine loads (1.0 = perfectly even; TensorRT-LLM's balance ratio); 1.0
// for no engines or all loads 0.
double balance_ratio(std::span<const double> loads);

std::unique_ptr<decode_placement> make_decode_placement(const std::string& name);  // null for an unknown name

}  // namespace shoal::runtime
