// Live expert migration (MISSION.md "Expert-parallel load balancer"): when the balancer
// offers a new placement, each process reads the routed experts it gains from a process that
// holds them under the current placement, one-sided over the bulk transport (libfabric), while
// its ranks keep stepping on the current placement. The holder registers the experts' memory
// and describes it (expert_residency::lend); the reader checks every description against its
// own model, reads, and installs the weights between steps (expert_residency::fetch / hold).
// Plain data and plain functions; the eplb actor carries the descriptions between processes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/placement/expert_placement.hpp"
#include "runtime/base/transport.hpp"

namespace shoal::runtime {

// Which array of a linear an expert_part is (model::linear's storages).
enum class expert_field : int32_t {
  f32 = 0,             // w (float)
  bf16 = 1,            // w_bf16 (uint16)
  fp8_codes = 2,       // w_fp8.codes (uint8)
  fp8_scales = 3,      // w_fp8.scales (float)
  fp8_row_scales = 4,  // w_fp8.row_scales (int32)
};

// One array of one routed expert's weights in a holder's registered memory.
struct expert_part {
  int32_t slot = 0, expert = 0;  // MoE slot, logical expert
  int32_t tensor = 0;            // 0 gate_up, 1 down
  int32_t field = 0;             // expert_field
  int64_t block_in = 0;          // FP8: columns per scale
  remote_memory memory;
  bool operator==(const expert_part&) const = default;
};

// Who lends what for one placement change. A process gains the (slot, expert) weights its
// ranks compute under `next` that none of them computes under `current`; each is lent by a
// rank of another process computing it under `current`, the least-asked one first (ties:
// the lowest rank), so the bytes spread over the holders.
struct lend_request {
  int32_t holder = 0;                              // rank that lends
  std::vector<std::pair<int32_t, int32_t>> experts;  // (slot, expert), ascending
};
struct migration_plan {
  std::vector<lend_request> lends;                             // by holder, ascending; none empty
  std::vector<std::vector<std::pair<int32_t, int32_t>>> gains;  // per process: what it gains
};
// process_of[r]: the process (0..P−1) of rank r; both placements have process_of.size() ranks.
migration_plan plan_migration(const ep_placement& current, const ep_placement& next,
                              const std::vector<int32_t>& process_of);

}  // namespace shoal::runtime
