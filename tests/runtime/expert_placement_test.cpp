// ep_placement from EPLB plans (replicas, the balanced replica choice), the load window's
// buckets, and plan_placement: balance no worse than the running placement, as few experts
// moved as the rank matching allows, errors for plans that do not fit.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "runtime/placement/eplb_controller.hpp"
#include "runtime/placement/expert_placement.hpp"

using namespace shoal;
using runtime::ep_placement;

namespace {

// Skewed loads: slots × E, expert e of slot s drawn from a Zipf-like law, hot experts first.
std::vector<double> skewed_loads(int64_t slots, int64_t E, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<double> out(static_cast<size_t>(slots * E));
  for (int64_t s = 0; s < slots; ++s) {
    std::vector<int64_t> order(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) order[e] = e;
    std::shuffle(order.begin(), order.end(), rng);
    for (int64_t i = 0; i < E; ++i) out[s * E + order[i]] = std::floor(1000.0 / (1.0 + i) + rng() % 7);
  }
  return out;
}

}  // namespace

TEST_CASE("ep placement from a plan: replicas on their ranks, the replica choice spreads pairs evenly") {
  const int64_t slots = 3, E = 16;
  const int32_t ranks = 4;
  auto loads = skewed_loads(slots, E, 1);
  auto current = ep_placement::contiguous(slots, E, ranks);
  auto planned = runtime::plan_placement(loads, current, {2, 100, 10, 1, 1});
  REQUIRE(planned.has_value());
  const ep_placement& p = planned->placement;
  CHECK(p.epoch() == 1);
  REQUIRE(p.plan() != nullptr);
  CHECK(p.plan()->shape.physical == E + 2 * ranks);
  for (int64_t s = 0; s < slots; ++s) {
    CAPTURE(s);
    int64_t copies = 0;
    for (int64_t e = 0; e < E; ++e) {
      auto reps = p.replicas(s, e);
      REQUIRE_FALSE(reps.empty());
      CHECK(std::is_sorted(reps.begin(), reps.end()));
      for (int32_t r : reps) CHECK(p.holds(s, r, e));
      copies += static_cast<int64_t>(reps.size());
      // n-th pairs of one sender cycle over the replicas: counts differ by at most one
      std::map<int32_t, int64_t> got;
      for (int64_t n = 0; n < 10 * static_cast<int64_t>(reps.size()) + 3; ++n) ++got[p.replica_for(s, e, 2, n)];
      CHECK(got.size() == reps.size());
      auto [lo, hi] = std::minmax_element(got.begin(), got.end(),
                                          [](const auto& a, const auto& b) { return a.second < b.second; });
      CHECK(hi->second - lo->second <= 1);
    }
    CHECK(copies > E);  // redundant copies exist
    CHECK(copies <= E + 2 * ranks);
    // the hottest expert of the slot got a second copy
    const auto hottest = std::max_element(loads.begin() + s * E, loads.begin() + (s + 1) * E) - (loads.begin() + s * E);
    CHECK(p.replicas(s, hottest).size() >= 2);
  }
  // balance: never worse than the running placement, here much better
  for (int64_t s = 0; s < slots; ++s) {
    CAPTURE(s);
    CHECK(planned->imbalance_after[s] <= planned->imbalance_before[s]);
    CHECK(planned->imbalance_after[s] < 0.8 * planned->imbalance_before[s]);
  }
  CHECK(planned->experts_moved > 0);
  CHECK(planned->experts_moved <= slots * (E / ranks + 2) * ranks);

  // The same loads again: the next plan keeps what each rank holds (nothing moves).
  auto again = runtime::plan_placement(loads, p, {2, 100, 10, 1, 1});
  REQUIRE(again.has_value());
  CHECK(again->placement.epoch() == 2);
  CHECK(again->experts_moved == 0);
  CHECK(again->placement.same_experts(p));
}

TEST_CASE("ep placement: rank matching keeps experts where they are when the loads shift a little") {
  const int64_t slots = 4, E = 32;
  const int32_t ranks = 8;
  auto loads = skewed_loads(slots, E, 7);
  auto first = runtime::plan_placement(loads, ep_placement::contiguous(slots, E, ranks), {1, 100, 10, 1, 1});
  REQUIRE(first.has_value());
  for (double& l : loads) l *= 1.0 + 0.01 * (static_cast<int64_t>(l) % 3);  // a small drift
  auto second = runtime::plan_placement(loads, first->placement, {1, 100, 10, 1, 1});
  REQUIRE(second.has_value());
  // all slots of every rank would be (E/ranks + 1)·slots·ranks = 160 without the matching
  CHECK(second->experts_moved < slots * (E / ranks + 1) * ranks / 2);
  for (int64_t s = 0; s < slots; ++s) {
    CHECK(second->imbalance_after[s] <= second->imbalance_before[s]);
    CHECK(second->imbalance_after[s] == doctest::Approx(second->placement.imbalance(loads)[s]));
  }
}

TEST_CASE("ep placement: bad plans and loads are errors naming what is wrong") {
  auto current = ep_placement::contiguous(2, 8, 2);
  auto short_loads = runtime::plan_placement(std::vector<double>(15, 1.0), current, {});
  REQUIRE_FALSE(short_loads.has_value());
  CHECK(short_loads.error().find("15 entries, expected 16") != std::string::npos);
  auto negative = runtime::plan_placement(std::vector<double>(16, 1.0), current, {-1, 1, 1, 1, 1});
  REQUIRE_FALSE(negative.has_value());
  CHECK(negative.error().find("negative") != std::string::npos);

  runtime::eplb_plan plan;
  plan.shape = {1, 4, 4, 1, 1, 2};
  plan.phy2log = {0, 1, 2, 2};  // expert 3 nowhere
  auto missing = ep_placement::from_plan(plan, 1);
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error().find("places no copy of expert 3") != std::string::npos);
  plan.phy2log = {0, 1, 2, 9};
  auto outside = ep_placement::from_plan(plan, 1);
  REQUIRE_FALSE(outside.has_value());
  CHECK(outside.error().find("expert 9 outside [0, 4)") != std::string::npos);
  plan.phy2log = {0, 1, 2};
  CHECK_FALSE(ep_placement::from_plan(plan, 1).has_value());
  plan.phy2log = {3, 1, 2, 0};
  auto ok = ep_placement::from_plan(plan, 5);
  REQUIRE(ok.has_value());
  CHECK(ok->epoch() == 5);
  CHECK(std::vector<int32_t>(ok->experts_of(0, 0).begin(), ok->experts_of(0, 0).end()) == std::vector<int32_t>{1, 3});
  CHECK(ok->gained(ep_placement::contiguous(1, 4, 2), 0) == 1);  // rank 0 held {0, 1}, now {1, 3}
}

TEST_CASE("ep load window: counts the last N steps in buckets of N/10") {
  runtime::expert_load_window w(2, 4, 20);  // buckets of 2 steps
  const std::vector<int32_t> ids{0, 1, 1, 3};
  for (int step = 0; step < 5; ++step) {
    w.count(1, ids);
    w.end_step();
  }
  CHECK(w.steps() == 5);
  auto t = w.totals();
  CHECK(t == std::vector<double>{0, 0, 0, 0, 5, 10, 0, 5});
  for (int step = 0; step < 40; ++step) {
    w.count(0, std::vector<int32_t>{2});
    w.end_step();
  }
  // only the last 19 or 20 steps: all of slot 0's latest counts, none of slot 1's
  CHECK(w.steps() >= 19);
  CHECK(w.steps() <= 20);
  t = w.totals();
  CHECK(t[2] == static_cast<double>(w.steps()));
  CHECK(t[4 + 1] == 0);
  w.clear();
  CHECK(w.steps() == 0);
  CHECK(w.totals() == std::vector<double>(8, 0.0));
}

namespace {

// Four ranks' reports on `place`: rank r's rows went to experts as `loads` says, split evenly.
std::vector<runtime::rank_load_report> reports_for(const std::shared_ptr<const ep_placement>& place,
                                                   const std::vector<double>& loads, uint64_t steps) {
  std::vector<runtime::rank_load_report> out;
  for (int32_t r = 0; r < place->ranks(); ++r) {
    runtime::rank_load_report x;
    x.group = 77;
    x.steps = steps;
    x.window_steps = 50;
    for (double l : loads) x.window.push_back(l / place->ranks());
    x.recent = x.window;
    x.placement = place;
    x.pairs_computed = 10 * (r + 1);
    x.expert_bytes = 1000;
    out.push_back(std::move(x));
  }
  return out;
}

}  // namespace

TEST_CASE("eplb controller: plans when the period passed or when asked, waits while a placement is adopted") {
  const int64_t slots = 2, E = 8;
  auto loads = skewed_loads(slots, E, 3);
  auto place = std::make_shared<const ep_placement>(ep_placement::contiguous(slots, E, 4));
  runtime::eplb_controller c({1, 100, 50, 1, 1});
  CHECK(c.status().find("no report from the group yet") != std::string::npos);

  auto first = c.decide(reports_for(place, loads, 10), false);  // the placement began at step 10
  REQUIRE(first.has_value());
  CHECK_FALSE(first->has_value());
  CHECK(c.status().find("next plan after 100 more steps") != std::string::npos);
  auto early = c.decide(reports_for(place, loads, 60), false);
  REQUIRE(early.has_value());
  CHECK_FALSE(early->has_value());
  auto due = c.decide(reports_for(place, loads, 110), false);
  REQUIRE(due.has_value());
  REQUIRE(due->has_value());
  CHECK((*due)->placement.epoch() == 1);
  c.offered(**due, 110, false, 1000);
  REQUIRE(c.last_plan().has_value());
  CHECK(c.last_plan()->bytes_moved == 1000 * (*due)->experts_moved);
  CHECK(c.status().find("last plan: epoch 1 at step 110") != std::string::npos);

  // Being adopted: no plan, even when asked.
  auto adopting = reports_for(place, loads, 120);
  adopting[2].offered_epoch = 1;
  auto wait = c.decide(adopting, true);
  REQUIRE(wait.has_value());
  CHECK_FALSE(wait->has_value());
  CHECK(c.status().find("epoch 1 is being adopted") != std::string::npos);

  // Adopted: the period counts from the new epoch; a forced plan comes at once.
  auto next = std::make_shared<const ep_placement>((*due)->placement);
  auto quiet = c.decide(reports_for(next, loads, 130), false);
  REQUIRE(quiet.has_value());
  CHECK_FALSE(quiet->has_value());
  auto forced = c.decide(reports_for(next, loads, 131), true);
  REQUIRE(forced.has_value());
  REQUIRE(forced->has_value());
  CHECK((*forced)->placement.epoch() == 2);
  CHECK((*forced)->experts_moved == 0);  // same loads: nothing worth moving

  // Disagreeing reports are errors naming the rank.
  auto mixed = reports_for(next, loads, 140);
  mixed[3].placement = place;
  auto bad = c.decide(mixed, true);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().find("rank 3 runs another placement") != std::string::npos);
  auto other_group = reports_for(next, loads, 140);
  other_group[1].group = 5;
  CHECK(c.decide(other_group, true).error().find("rank 1 reports another group") != std::string::npos);
  auto short_window = reports_for(next, loads, 140);
  short_window[0].window.pop_back();
  CHECK(c.decide(short_window, true).error().find("rank 0 reports 15 load cells, expected 16") != std::string::npos);
  auto too_few = reports_for(next, loads, 140);
  too_few.pop_back();
  CHECK(c.decide(too_few, true).error().find("for 4 ranks, 3 reported") != std::string::npos);
}

TEST_CASE("ep placement, hierarchical policy: each expert group's copies stay on one node, balance still improves") {
  // 4 ranks on 2 nodes (ranks 0-1, 2-3), 32 experts in 4 groups of 8.
  const int64_t slots = 3, E = 32, groups = 4;
  const int32_t ranks = 4;
  const auto loads = skewed_loads(slots, E, 11);
  const auto current = ep_placement::contiguous(slots, E, ranks);
  auto plan = runtime::plan_placement(loads, current, {2, 100, 10, groups, 2});
  REQUIRE(plan.has_value());
  REQUIRE(plan->placement.plan() != nullptr);
  CHECK(plan->placement.plan()->hierarchical);
  for (int64_t s = 0; s < slots; ++s) {
    CAPTURE(s);
    CHECK(plan->imbalance_after[s] <= plan->imbalance_before[s]);
    std::map<int64_t, std::set<int32_t>> nodes_of_group;
    for (int32_t r = 0; r < ranks; ++r)
      for (int32_t e : plan->placement.experts_of(s, r)) nodes_of_group[e / (E / groups)].insert(r / 2);
    for (const auto& [g, nodes] : nodes_of_group) {
      CAPTURE(g);
      CHECK(nodes.size() == 1);
    }
  }
  double before = 0, after = 0;
  for (int64_t s = 0; s < slots; ++s) before += plan->imbalance_before[s], after += plan->imbalance_after[s];
  MESSAGE("hierarchical, mean max/mean over slots: " << before / slots << " -> " << after / slots);
  CHECK(after < 0.8 * before);

  // The controller says which policy it plans with.
  runtime::eplb_controller c({1, 100, 10, groups, 1});
  c.set_nodes(2);
  CHECK(c.status().find("hierarchical (4 expert groups over 2 node(s))") != std::string::npos);
  c.set_nodes(3);  // 4 groups do not divide over 3 nodes
  CHECK(c.status().find(", global") != std::string::npos);
}
