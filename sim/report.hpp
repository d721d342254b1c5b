// What a run is judged by (MEASURE.md accounting), for the simulator and for `shoal bench
// cluster` alike: TTFT / TPOT percentiles, SLO goodput, prefill tokens/s per rank (non-cached
// input), decode avg_SPS and per-user tokens/s, balance ratios and % of perfectly balanced,
// prefix hit ratio in tokens. Printed as a table, written as JSON Lines, drawn as SVG.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/cluster_sim.hpp"

namespace shoal::sim {

struct serving_metrics {
  std::string policy;
  int64_t requests = 0, finished = 0;
  double ttft_p50 = 0, ttft_p90 = 0, ttft_p99 = 0;  // seconds
  double tpot_p50 = 0, tpot_p90 = 0, tpot_p99 = 0;  // seconds per output token after the first
  double goodput_rps = 0;       // requests meeting both SLOs per second of span
  double slo_attainment = 0;    // their share of all requests
  double span_s = 0;
  double prefill_tps_per_rank = 0;  // non-cached input tokens / (prefill ranks · span)
  double decode_avg_sps = 0;        // decode steps per busy second
  double per_user_tps = 0;          // tokens per step (1, no MTP) × avg_SPS
  double decode_balance = 1, decode_balance_p10 = 1, decode_pct_perfect = 100;
  double prefill_balance = 1, prefill_pct_perfect = 100;
  double prefix_hit_ratio = 0;      // hit tokens / prompt tokens
  uint64_t handoffs = 0, kept = 0, preemptions = 0;
  double wall_s = 0;
  uint64_t state_hash = 0;
};

// From request records alone (what a real cluster run yields); `prefill_ranks` for the
// per-rank figure, SLOs in seconds.
serving_metrics serving_from_records(const std::string& policy, const std::vector<request_record>& records,
                                     int64_t prefill_ranks, double ttft_slo_s, double tpot_slo_s);
serving_metrics summarize(const sim_result& r, const sim_config& c);

// One JSON object per line: {"kind":"sim"|"cluster", "policy", every field above, plus `extra`
// (a JSON object text merged in: the run's configuration and the machine).
std::string to_jsonl(const serving_metrics& m, const std::string& kind, const std::string& extra_json);
// The comparison table (one row per policy).
std::string format_table(const std::vector<serving_metrics>& ms);
// Panels of bars (one per metric, a bar per policy) and, when given, balance-ratio timelines.
std::string comparison_svg(const std::string& title, const std::vector<serving_metrics>& ms,
                           const std::vector<std::vector<std::pair<double, double>>>& timelines);

}  // namespace shoal::sim
