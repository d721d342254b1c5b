// Requests the simulator (and `shoal bench cluster`) replays: Mooncake traces (real
// timestamps, lengths and the 512-token prefix-block hash ids that make prefix hits) and
// requests sampled from ServeGen's per-client model of DeepSeek-R1 traffic (arrival process and
// length distributions per client and window). Prompt tokens are made from the hash ids, so
// two requests share exactly the prefix blocks their trace rows share.
#pragma once

#include <cstdint>
#include <expected>
#include <string>
#include <vector>

namespace shoal::sim {

struct sim_request {
  int64_t id = 0;               // position in the workload (arrival order)
  double arrival_s = 0;
  int64_t input_len = 0, output_len = 0;
  std::vector<int64_t> hash_ids;  // one per hash block of the prompt (the last may be partial); none: a prompt of its own
  int64_t hash_block = 512;     // tokens per hash id
};

struct workload_options {
  double speed = 1.0;           // arrivals compressed by this factor (rate × speed)
  double length_scale = 1.0;    // input, output and hash-block lengths × this (≥ 1 token each)
  int64_t max_requests = 0;     // 0 = all
  double start_s = 0;           // ServeGen: the window of the day sampled
  double duration_s = 0;        // ServeGen: required; Mooncake: 0 = whole trace
  int64_t max_input = 0;        // > 0: longer prompts are cut to this (a model's context limit)
};

std::expected<std::vector<sim_request>, std::string> mooncake_workload(const std::string& path,
                                                                       const workload_options& o);
// Samples every client (chunk-N-trace.csv + chunk-N-dataset.json in `dir`): per 600-s window
// its Gamma or Weibull inter-arrival process (shape, scale), per request input and output
// lengths from that client's distributions for the window's 6-hour block. Deterministic in
// `seed`. Errors name the file and what is wrong.
std::expected<std::vector<sim_request>, std::string> servegen_workload(const std::string& dir,
                                                                       const workload_options& o, uint64_t seed);

// Prompt token ids of r: hash block h's tokens are a function of (h, position in the block)
// only, in [first_id, vocab); so are the output tokens of a request id.
std::vector<int32_t> prompt_tokens(const sim_request& r, int64_t vocab);
int32_t output_token(int64_t request_id, int64_t index, int64_t vocab);

}  // namespace shoal::sim
