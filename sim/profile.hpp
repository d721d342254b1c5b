// What the simulator knows of the hardware: a step-time profile per pool (the quadratic cost
// model t(n, p) = a + b·n + c·n·p + d·n² of runtime/cost_model, summed over a step's items),
// KV capacity per rank, the KV handoff link, the storage tier's read model and the model
// whose cache layout the engines' state machines use. Loaded from a JSON file (config/sim/),
// each number with the source it comes from in the file's "sources".
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <expected>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.hpp"
#include "runtime/core/cost_model.hpp"

namespace shoal::sim {

struct pool_profile {
  runtime::cost_model step;       // per step: a once, b·n + c·n·p + d·n² per item
  bool fitted = false;            // the file says "fitted": the caller supplies `step`
  int64_t kv_blocks = 0;          // per rank
  int64_t token_budget = 32768;   // scheduler, per step
  int64_t max_running = 256;
  double step_time_budget_s = 0;  // 0: token budget only (cost-model chunking off)
  // The d term over the whole step, d·(Σn)², instead of per item (Σ d·n²): the decode pool's
  // form, whose fit (shoal bench fit-cost --decode) has n = the step's batch.
  bool batch_quadratic = false;
  // > 0: this pool's ranks share this many cores of their own (engines pinned by node.cpus):
  // processor sharing, so while k of its ranks compute at once each progresses at
  // min(1, cores / k) of full speed (a step's time depends on what overlaps it, start to end).
  int64_t cores = 0;
};

struct storage_model {
  int64_t capacity_blocks = 0;    // the cluster's LRU capacity in engine blocks; 0 = no storage tier
  double read_latency_s = 0;      // per fetch
  double read_gbps = 0;           // per reading rank, Gbit/s
  double write_delay_s = 0;       // a written block is readable this much later
  double jitter = 0;              // log-normal sigma of a read's time (seeded)
  double timeout_s = 5;           // the engine's remote_timeout_s
};

// Speculative decoding (DSpark: MTP drafts verified by the target model) as the simulator
// times it. A step of a pool whose ranks draft k tokens verifies each decode's pending token
// and its k drafts (an item of n = 1 + k in the pool's step model), then drafts the next k
// through the MTP module: k passes, each `draft_factor` × the main pass over the same decodes
// (items of n = 1). Each draft is accepted with probability `accept` given the ones before it
// were (a seeded draw), so a step emits 1 + the leading accepted drafts.
struct speculation_model {
  double accept = 0;
  double draft_factor = 0;
  bool known = false;  // the profile has a "speculation" section
};

struct profile {
  std::string name;
  std::vector<std::string> sources;
  std::string model_name;         // a preset (tiny, small, v3-tiny) or deepseek-v3-671b
  model::model_config model;
  pool_profile prefill, decode;
  double kv_bytes_per_token = 0;  // handoff and storage bytes
  double handoff_gbps = 0;        // per rank, Gbit/s
  double handoff_latency_s = 0;
  storage_model storage;
  speculation_model speculation;
  // Seconds each pass of an expert-parallel group (EP > 1) waits on its dispatch and combine
  // exchanges beyond its compute, on no core: a step takes one per pass (the main pass, and
  // each draft pass when a rank drafts). 0: exchanges cost nothing (the GPU profile's
  // overlapped all-to-all).
  double ep_pass_s = 0;
  double step_noise = 0;          // relative sigma of each step's time (seeded)
  int64_t host_cores = 0;         // > 0: all ranks share this many cores (a loopback cluster on one host)
  double ttft_slo_s = 0, tpot_slo_s = 0;

  double step_seconds(const pool_profile& pool, std::span<const std::pair<int64_t, int64_t>> items) const;
};

// Errors start with "<file>: " and name the field.
std::expected<profile, std::string> parse_profile(std::string_view json_text, const std::string& file);
std::expected<profile, std::string> load_profile(const std::string& path);

// Fills the pools whose step is "fitted": from `decode_file` (shoal bench fit-cost --decode)
// for the decode pool when given, else from `prefill_file` (shoal bench fit-cost); errors name
// the file, or the pool still without a model.
std::expected<void, std::string> apply_fitted(profile& p, const std::string& prefill_file, const std::string& decode_file);

// The published DeepSeek-V3 / R1 shape (HF config.json of deepseek-ai/DeepSeek-V3), enough for
// the cache layout: MLA latent 512 + rope 64, 61 layers, 64-token blocks.
model::model_config deepseek_v3_671b();

}  // namespace shoal::sim
