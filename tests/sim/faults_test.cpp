// The simulator with faults: a campaign of seeded runs, each with node faults (crash, hang,
// partition, slow group, full disk, damaged chunks), rank faults inside expert-parallel groups
// (a rank's process crashes or hangs, the group re-forms without it, it rejoins) and message
// faults (handoff reads failed, late or delivered twice), every invariant of sim/faults.hpp
// checked on every run; a seed replays its run exactly; each planted bug is caught by some seed.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include "sim/campaign.hpp"

using namespace shoal::sim;

namespace {

fault_campaign campaign(uint64_t seed, planted_bug bug = planted_bug::none) {
  auto c = make_fault_campaign(std::string(SHOAL_SOURCE_DIR) + "/config/sim/gpu-h800.json", seed, bug);
  REQUIRE_MESSAGE(c, c.error());
  return std::move(*c);
}

}  // namespace

TEST_CASE("sim faults: 1000 seeded runs, every invariant holds on each") {
  fault_outcome total;
  int64_t injected = 0, failed = 0;
  for (uint64_t seed = 1; seed <= 1000; ++seed) {
    const auto fc = campaign(seed);
    auto r = run_cluster(fc.config, fc.work, fc.policy);
    REQUIRE_MESSAGE(r, r.error());
    const fault_outcome& f = r->faults;
    injected += static_cast<int64_t>(f.schedule.size());
    if (!f.ok()) {
      ++failed;
      FAIL_CHECK(describe_faults(seed, f));  // replay: shoal sim-faults --seed N
    }
    CHECK(f.completed + f.errored == static_cast<int64_t>(fc.work.size()));
    total.completed += f.completed, total.errored += f.errored, total.rerouted += f.rerouted;
    total.handoff_failures += f.handoff_failures, total.handoff_duplicates += f.handoff_duplicates;
    total.dropped_writes += f.dropped_writes, total.damaged_caught += f.damaged_caught;
    total.rank_losses += f.rank_losses, total.rejoins += f.rejoins;
    total.experts_replaced += f.experts_replaced;
  }
  MESSAGE(fmt::format("1000 runs, {} node and rank faults: {} completed, {} errored, {} re-routed, {} handoffs failed, {} "
                      "duplicate handoff deliveries ignored, {} writes dropped (disk full), {} damaged chunks caught, "
                      "{} ranks lost from their expert-parallel group and {} back ({} experts placed anew, none "
                      "moved off a survivor)",
                      injected, total.completed, total.errored, total.rerouted, total.handoff_failures,
                      total.handoff_duplicates, total.dropped_writes, total.damaged_caught, total.rank_losses, total.rejoins,
                      total.experts_replaced));
  CHECK(failed == 0);
  // The campaign exercised every reaction.
  CHECK(total.rerouted > 0);
  CHECK(total.handoff_failures > 0);
  CHECK(total.handoff_duplicates > 0);
  CHECK(total.dropped_writes > 0);
  CHECK(total.damaged_caught > 0);
  CHECK(total.rank_losses > 100);  // groups lost a rank (crash, hang past the timeout) and re-formed
  CHECK(total.rejoins > 100);      // and grew back (every group whole at the end: an invariant)
  // Each loss placed the lost rank's only copies anew and each rank back took its share
  // (runtime::regroup_placement); survivors keep theirs (an invariant: survivor_moves).
  CHECK(total.experts_replaced >= total.rank_losses);
  CHECK(total.completed > 40000);  // errors are the exception (a request losing its engine 4 times)
}

TEST_CASE("sim faults: a seed replays its run exactly, another seed differs") {
  for (uint64_t seed : {3u, 17u, 256u}) {
    const auto fc = campaign(seed);
    auto a = run_cluster(fc.config, fc.work, fc.policy);
    auto b = run_cluster(fc.config, fc.work, fc.policy);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(a->state_hash == b->state_hash);
    CHECK(a->faults.rerouted == b->faults.rerouted);
    CHECK(a->faults.errors == b->faults.errors);
    const auto next = campaign(seed + 1);
    auto c = run_cluster(next.config, next.work, next.policy);
    REQUIRE(c);
    CHECK(a->state_hash != c->state_hash);
  }
}

TEST_CASE("sim faults: each planted bug is caught by some seed") {
  // The last two are planted in runtime::relay and runtime::handoff_leases, the daemons' code.
  const std::pair<planted_bug, std::string> bugs[] = {{planted_bug::place_on_dead, "placements on a node"},
                                                       {planted_bug::skip_checksum, "damaged blocks served"},
                                                       {planted_bug::repeat_tokens, "outputs differ"},
                                                       {planted_bug::lease_never_expires, "leases at the end"},
                                                       {planted_bug::route_to_lost, "experts of a rank lost"}};
  for (const auto& [bug, expected] : bugs) {
    CAPTURE(expected);
    uint64_t caught = 0;
    std::string report;
    for (uint64_t seed = 1; seed <= 300 && caught == 0; ++seed) {
      const auto fc = campaign(seed, bug);
      auto r = run_cluster(fc.config, fc.work, fc.policy);
      REQUIRE(r);
      if (!r->faults.ok()) caught = seed, report = describe_faults(seed, r->faults);
    }
    MESSAGE(report);
    CHECK(caught > 0);
    CHECK(report.find(expected) != std::string::npos);  // caught by the invariant it breaks
  }
}

TEST_CASE("sim faults: without faults nothing is injected and the run is unchanged by the option's presence") {
  auto fc = campaign(5);
  fc.config.faults.enabled = false;
  auto r = run_cluster(fc.config, fc.work, fc.policy);
  REQUIRE(r);
  CHECK(r->faults.schedule.empty());
  for (const auto& q : r->requests) {
    CHECK(q.finish_s >= 0);
    CHECK(q.attempts == 1);
    CHECK(q.error.empty());
  }
}
