// The cluster simulator: a deterministic discrete-event simulation in virtual time of a
// disaggregated cluster (prefill EP groups, one or more decode EP groups, a storage tier,
// the KV handoff links) running the real balancer policies (runtime/prefill_balancer,
// runtime/decode_placement) and, per rank, the real engine state machines: runtime::scheduler
// (continuous batching, cost-model chunking, preemption) over runtime::cache_manager (block
// pool with prefix cache, the storage tier as a request state with its timeout, bounded
// replay for shoal_flash), with payload off. Only the forward pass is replaced: a step of an
// EP group takes the longest of its ranks' predicted times (profile::step_seconds), times a
// seeded noise factor, times the host-core sharing factor when the profile has one.
//
// One request: arrives → prefill balancer picks a prefill rank → its scheduler computes the
// prompt (local hit, storage hit as a timed fetch, the rest computed) → first token at the end
// of that step (TTFT) → decode placement picks a decode rank among those with room (its
// blocks reserved at once) → the cache crosses the handoff link (bytes / handoff_gbps +
// latency) → the decode rank runs it to its output length (no room anywhere: it decodes on
// its prefill rank, as the real engine keeps it). Blocks the prefill ranks register are
// written to the storage tier (readable write_delay_s later; LRU over capacity_blocks).
//
// Balance (decode and prefill pools): a rank's load in a step is its predicted compute beyond
// the step's fixed part (Σ b·n + c·n·p + d·n² of its items); at each step of a group the
// balance ratio is mean / max over the pool's ranks (each at its group's current step, 0 when
// idle; TensorRT-LLM's definition; 1.0 when no rank has load). Perfectly balanced: a lockstep
// group's step with every rank at the group's mean load would take a + mean instead of
// a + max; "% of perfectly balanced" is Σ(a + mean) / Σ(a + max) over the pool's steps, the
// throughput ratio of the run to that placement of the same work (100 by definition for EP 1,
// where no rank waits for another).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/placement/prefill_balancer.hpp"
#include "sim/faults.hpp"
#include "sim/profile.hpp"
#include "sim/workload.hpp"

namespace shoal::sim {

struct policy_pair {
  std::string name;                  // the report's label
  runtime::prefill_policy prefill = runtime::prefill_policy::tiered;
  std::string decode = "decode_balancer";  // runtime::make_decode_placement
};
// shoal (tiered + decode_balancer), untiered (untiered + decode_balancer), round_robin,
// least_requests (+ least_loaded), cache_aware (SGLang + least_loaded), dynamo (+ least_kv).
std::vector<policy_pair> standard_policies();
std::expected<policy_pair, std::string> policy_named(const std::string& name);

struct sim_config {
  profile prof;
  int64_t prefill_ranks = 64, prefill_ep = 8;   // groups of prefill_ep ranks
  // 0 decode ranks: a colocated cluster, whose prefill ranks (role "both") decode every
  // request they prefilled; nothing is handed off.
  int64_t decode_ranks = 64, decode_ep = 64;
  // DSpark drafts per decode step on each pool's ranks (engine.spec_nextn of a speculating
  // config; 0: none), timed and accepted as the profile's "speculation" says.
  int64_t prefill_drafts = 0, decode_drafts = 0;
  // Ranks per engine process of each pool, in rank order (empty: one rank a process). A
  // process's ranks share its kernel thread pool, which runs their work one after another,
  // so on shared cores (profile host_cores or a pool's cores) the cores are split among the
  // busy processes, and a process's share among its busy ranks.
  std::vector<int64_t> prefill_processes, decode_processes;
  runtime::prefill_balancer_config prefill_balancer;  // policy set per run from policy_pair
  uint64_t seed = 1;
  double timeline_s = 0;   // > 0: balance-ratio timeline bucket (seconds of virtual time)
  // Steady state (MEASURE.md): the balance, % of perfect and SPS figures count the steps that
  // start in [warmup_s, the last arrival) — not the ramp-up, not the drain after the last
  // request arrived, when a few long requests are all that is left to balance.
  double warmup_s = 0;
  fault_options faults;    // off by default (sim/faults.hpp)
};

struct request_record {
  int64_t id = 0;
  double arrival_s = 0, first_token_s = -1, finish_s = -1;
  int64_t input = 0, output = 0, cached_tokens = 0;
  int32_t prefill_rank = -1, decode_rank = -1, tier = -1;  // decode −1: decoded on its prefill rank
  int64_t preemptions = 0;
  int32_t attempts = 0;    // placements on a prefill engine (1 without faults)
  std::string error;       // the clear error it got instead of completing (faults only)
};

struct pool_summary {
  int64_t steps = 0;
  double busy_s = 0;                  // Σ step times
  double balance_mean = 1;            // mean over steps of mean/max
  double balance_p10 = 1;
  double pct_of_perfect = 100;        // Σ(a + mean) / Σ(a + max) · 100
  double tokens = 0;                  // computed tokens (prefill: non-cached input; decode: outputs)
  int64_t all_steps = 0;              // every step of the run, window or not, and their wall time
  double all_busy_s = 0;
};

struct sim_result {
  std::string policy;
  std::vector<request_record> requests;
  pool_summary prefill, decode;
  double span_s = 0;                  // first arrival → last finish, virtual
  double wall_s = 0;                  // the run's own time
  uint64_t storage_hit_blocks = 0, storage_lookups = 0, handoffs = 0, kept = 0, preemptions = 0;
  uint64_t prompt_tokens = 0, hit_tokens = 0;
  uint64_t spec_verified = 0, spec_accepted = 0;  // DSpark drafts verified and accepted, every pool
  std::vector<std::pair<double, double>> decode_timeline;  // (bucket start, mean balance ratio)
  std::vector<int64_t> decode_per_rank;                    // requests placed per decode rank
  std::vector<int64_t> prefill_per_tier;                   // requests per tier
  fault_outcome faults;               // with sim_config::faults.enabled: what was injected, what held
  uint64_t state_hash = 0;            // xxh3 over every request's record, the pool sums and the fault outcome
};

// Runs `work` through a fresh cluster under `policy`. Errors: a configuration that cannot run
// (ranks not a multiple of the EP size, a fitted profile without its step model, ...).
std::expected<sim_result, std::string> run_cluster(const sim_config& config, const std::vector<sim_request>& work,
                                                   const policy_pair& policy);

}  // namespace shoal::sim
