// Faults in the simulator. A run with faults on draws, from its seed, a schedule of node
// faults over the workload's span (crash and restart, hang, partition and heal, a slow group,
// a full disk on the storage tier, damaged chunks) and injects message faults at the named
// fault points of runtime/base/fault_points.hpp (a KV handoff read that fails, is late or is
// delivered twice; a write that finds the disk full; a chunk damaged after its checksum).
// The cluster reacts with the daemons' own protocol code: each request's relay is
// runtime::relay and each prefill engine's leases are runtime::handoff_leases, hosted in virtual
// time (sim/cluster_relay.cpp, cluster_handoff.cpp): the relay re-routes a request whose
// engine went down (tokens already streamed are kept), the decode side recomputes when a
// handoff read fails or times out, a damaged chunk is a miss, a full disk drops the write. After the run the invariants are checked (fault_outcome::violations):
// - no request lost: each one completed with exactly its tokens, or got a clear error;
// - no wrong bytes served: no block read from the tier differs from what was written;
// - no placement on a node that is down (prefill balancer and decode placement);
// - no duplicate: a request finishes once, its output is the one token sequence expected;
// - convergence: at the end every node is up and back in the balancers' views, no block is
//   held by a request on any rank, no handoff is pending, the balancer has nothing in flight,
//   every expert-parallel group is whole again;
// - no step of a group that lost a rank routes tokens to that rank's experts.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/base/fault_points.hpp"

namespace shoal::sim {

// Test-only switches that break the reaction to a fault on purpose: the campaign must catch
// each of them with some seed (tests/sim). The last two are planted in the daemons' own
// protocol code (runtime::relay, runtime::handoff_leases), which the simulator runs.
enum class planted_bug {
  none,
  place_on_dead,        // decode placement is offered ranks that are down
  skip_checksum,        // the storage tier serves a damaged chunk instead of a miss
  repeat_tokens,        // the relay sends a re-routed request's tokens the client has again
  lease_never_expires,  // a prefill engine's placed lease outlives a decode engine that went quiet
  route_to_lost,        // a group that lost a rank keeps the placement that routes to its experts
};

// Node faults hit a whole group's processes; rank faults one process of an expert-parallel
// group, which re-forms without it and grows back when it is back.
enum class fault_kind { crash, hang, partition, slow, disk_full, corrupt, rank_crash, rank_hang };
const char* fault_kind_name(fault_kind k);

struct fault_event {
  fault_kind kind = fault_kind::crash;
  int32_t group = -1;        // the EP group hit (storage faults: -1)
  double start_s = 0;        // virtual time
  double duration_s = 0;     // until restart / heal / the end of the slowness or the full disk
  double factor = 1;         // slow: step-time multiplier; corrupt: chunks damaged
  int32_t rank = -1;         // rank faults: the rank within the group
  bool skipped = false;      // a rank fault on a group's last rank up (set by the run)
};

struct fault_options {
  bool enabled = false;
  int node_faults = 4;              // drawn over the workload's span
  int rank_faults = 2;              // drawn after them, on groups of 2 or more ranks
  double reform_s = 0.5;            // a group re-forms (placement, experts read) when a rank goes or comes back
  double detect_s = 2.0;            // heartbeat timeout: a longer hang is a node down
  double handoff_timeout_s = 1.0;   // the decode side gives up a handoff read and recomputes
  double request_timeout_s = 120;   // a request with no engine to go to this long gets an error
  int max_attempts = 4;             // placements of one request before it gets an error
  // Per-message points (the seed is replaced by the run's): kv_handoff, kv_handoff_delay,
  // message_dup, disk_full, storage_corrupt.
  runtime::fault_plan messages = default_messages();
  planted_bug planted = planted_bug::none;

  static runtime::fault_plan default_messages();
};

struct fault_outcome {
  std::vector<fault_event> schedule;
  int64_t completed = 0, errored = 0, lost = 0;
  int64_t wrong_blocks = 0;          // blocks served that differ from what was written
  int64_t placed_on_dead = 0;
  int64_t duplicates = 0;            // requests finished a second time
  int64_t wrong_outputs = 0;         // outputs that are not the expected token sequence
  int64_t leaked_blocks = 0;         // held at the end on some rank
  int64_t rerouted = 0, handoff_failures = 0, handoff_duplicates = 0, dropped_writes = 0, damaged_caught = 0;
  int64_t rank_losses = 0, rejoins = 0;  // ranks a group lost (crash, hang past the timeout), and got back
  int64_t routed_to_lost = 0;            // steps whose placement routed to a rank not in the group
  // Re-formations (runtime::regroup_placement, the daemons' rule): experts placed on a rank
  // anew (a lost rank's only copies, a joiner's share), and experts a survivor lost when no rank
  // joined (0: it keeps what it ran); a view the rule refused.
  int64_t experts_replaced = 0, survivor_moves = 0;
  std::vector<std::string> regroup_errors;
  std::vector<std::string> errors;   // the clear errors requests got (one per errored request)
  std::vector<std::string> violations;
  bool ok() const { return violations.empty(); }
};

// The fault schedule of a run, a function of the seed: `count` node faults over [0, span_s) on
// groups [0, group_sizes.size()), then `rank_faults` rank faults on the groups of 2 or more
// ranks (their sizes: group_sizes).
std::vector<fault_event> make_fault_schedule(uint64_t seed, int count, double span_s, std::span<const int32_t> group_sizes,
                                             int rank_faults = 0);

}  // namespace shoal::sim
