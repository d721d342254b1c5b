// The fault campaign the `sim` test label runs and `shoal sim-faults` replays: one small
// disaggregated cluster (4 prefill ranks in 2 EP groups, 4 decode ranks in 2 EP groups, the
// GPU profile) under a workload of 48 requests with shared prefixes over 12 s, faults on
// (sim/faults.hpp). A run is a function of its seed (and the planted bug, tests only), so a
// failing seed printed by the test is replayed by `shoal sim-faults --seed N`.
#pragma once

#include <cstdint>
#include <expected>
#include <string>
#include <vector>

#include "sim/cluster_sim.hpp"

namespace shoal::sim {

struct fault_campaign {
  sim_config config;
  std::vector<sim_request> work;
  policy_pair policy;
};

// `profile_path`: the GPU profile (config/sim/gpu-h800.json).
std::expected<fault_campaign, std::string> make_fault_campaign(const std::string& profile_path, uint64_t seed,
                                                               planted_bug bug = planted_bug::none);
std::expected<planted_bug, std::string> planted_bug_named(const std::string& name);

// One line about a run's outcome: the seed, the violations, the schedule of node faults.
std::string describe_faults(uint64_t seed, const fault_outcome& f);

}  // namespace shoal::sim
