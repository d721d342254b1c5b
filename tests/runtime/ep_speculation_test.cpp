// DSpark under expert parallelism at the engine level: every rank of a lockstep group drafts
// and verifies its own requests (the draft passes' MoE exchanges part of each lockstep step),
// greedy output exact, seeded sampling batch-invariant across ranks; the auto policy; the draft
// passes run only in steps where some rank drafts; all of it with overlapped scheduling or without.
#include <doctest/doctest.h>

#include <map>
#include <thread>
#include <vector>

#include "runtime/engine/engine.hpp"
#include "runtime/ep/expert_parallel.hpp"
#include "tests/runtime/ep_lockstep.hpp"
#include "tests/support/tiny_models.hpp"

using namespace shoal;
using namespace shoal::test::ep;
using runtime::spec_mode;
using runtime::spec_stats;
using namespace std::chrono_literals;

namespace {

// Tokens per (rank, job index) of `jobs` all on one engine of config `c` (no expert parallelism).
std::map<std::pair<int32_t, size_t>, std::vector<int32_t>> tokens_on_one(const std::shared_ptr<model::model_weights>& w,
                                                                        const engine_config& c,
                                                                        const std::vector<std::vector<job>>& jobs) {
  engine e(w, c);
  std::map<int64_t, std::pair<int32_t, size_t>> who;
  for (int32_t r = 0; r < static_cast<int32_t>(jobs.size()); ++r)
    for (size_t i = 0; i < jobs[r].size(); ++i) who[e.add_request(jobs[r][i].prompt, jobs[r][i].params)->value] = {r, i};
  std::map<std::pair<int32_t, size_t>, std::vector<int32_t>> out;
  while (e.has_work())
    for (auto& ev : e.step())
      if (ev.token >= 0) out[who[ev.id.value]].push_back(ev.token);
  return out;
}

engine_config with_spec(engine_config c, spec_mode mode, int64_t nextn) {
  c.spec.mode = mode;
  c.spec.nextn = nextn;
  return c;
}

}  // namespace

TEST_CASE("ep speculation: DSpark on every rank of a lockstep group, greedy equals plain greedy, seeded sampling "
          "equals one speculating engine, an idle rank joins the draft passes, with overlapped scheduling or without") {
  for (const char* preset : {"tiny", "v3-tiny"})
  for (bool overlap : {true, false}) {
    CAPTURE(preset);
    CAPTURE(overlap);
    auto w = test::tiny_model(preset);
    REQUIRE(!w->mtp.empty());
    const int32_t n = 3, nextn = 3;
    local_ep_hub hub(n, 10s);
    std::vector<std::unique_ptr<engine>> engines;
    for (int32_t r = 0; r < n; ++r) {
      engine_config c = with_spec(ep_config(hub, r), spec_mode::fixed, nextn);
      c.async_scheduling = overlap;
      engines.push_back(std::make_unique<engine>(w, c));
    }
    std::vector<std::vector<job>> jobs;
    std::vector<std::map<int64_t, size_t>> ids;
    std::vector<engine*> group;
    for (int32_t r = 0; r < n; ++r) {
      jobs.push_back(jobs_for(r, 5, /*idle=*/2));
      for (job& j : jobs.back()) j.params.max_tokens += 10;  // decode long enough to speculate
      ids.push_back(add_jobs(*engines[r], jobs[r]));
      group.push_back(engines[r].get());
    }
    auto events = run_lockstep(group);
    const auto plain = tokens_on_one(w, base_config(512), jobs);
    const auto spec_one = tokens_on_one(w, with_spec(base_config(512), spec_mode::fixed, nextn), jobs);
    for (int32_t r = 0; r < n; ++r) {
      trace t = trace_of(events[r]);
      for (auto& [id, i] : ids[r]) {
        CAPTURE(r);
        CAPTURE(i);
        REQUIRE(t.count(id) == 1);
        CHECK(t[id].first == spec_one.at({r, i}));  // batch-invariant across ranks
        if (jobs[r][i].params.temperature == 0.0f) CHECK(t[id].first == plain.at({r, i}));  // exact
      }
      CHECK(engines[r]->last_error() == "");
      CHECK(engines[r]->steps_started() == engines[0]->steps_started());
      CHECK(engines[r]->stats().blocks_free == engines[r]->stats().blocks_total);
    }
    const spec_stats s = engines[0]->stats().spec;
    CHECK(s.verified > 0);
    CHECK(s.accepted > 0);  // MTP drafts of a random model agree with it now and then
    CHECK(engines[2]->stats().spec.drafted == 0);  // the idle rank drafted nothing but stepped along
    // Overlapped: part of the planning ran during forward passes; else all of it was exposed.
    const auto st = engines[0]->stats();
    if (overlap) CHECK(st.plan_exposed_s < st.plan_s);
    else CHECK(st.plan_exposed_s == st.plan_s);
  }
}

TEST_CASE("ep speculation, auto policy: each rank measures both choices at its concurrency and switches, greedy "
          "output exact, the group runs the draft passes only in steps where some rank drafts") {
  auto w = test::tiny_model("v3-tiny");
  local_ep_hub hub(2, 10s);
  std::vector<std::unique_ptr<engine>> engines;
  for (int32_t r = 0; r < 2; ++r) {
    engine_config c = with_spec(ep_config(hub, r), spec_mode::automatic, 2);
    c.spec.auto_from = 3;
    engines.push_back(std::make_unique<engine>(w, c));
  }
  // Rank 0 decodes 2 requests (below auto_from: its prior is off), rank 1 decodes 4 (on); each
  // tries the other choice to measure it. Greedy output exact on both.
  std::vector<std::vector<job>> jobs(2);
  for (int32_t r = 0; r < 2; ++r)
    for (uint32_t i = 0; i < (r == 0 ? 2u : 4u); ++i) {
      job j;
      j.prompt = test::random_tokens(9 + 5 * i, 300 + 10 * r + i);
      j.params.max_tokens = 24;
      j.params.ignore_eos = true;
      jobs[r].push_back(j);
    }
  std::vector<std::map<int64_t, size_t>> ids;
  for (int32_t r = 0; r < 2; ++r) ids.push_back(add_jobs(*engines[r], jobs[r]));
  auto events = run_lockstep({engines[0].get(), engines[1].get()});
  const auto plain = tokens_on_one(w, base_config(512), jobs);
  for (int32_t r = 0; r < 2; ++r) {
    trace t = trace_of(events[r]);
    for (auto& [id, i] : ids[r]) CHECK(t[id].first == plain.at({r, i}));
    CHECK(engines[r]->last_error() == "");
  }
  for (int32_t r = 0; r < 2; ++r) {
    CAPTURE(r);
    const spec_stats s = engines[r]->stats().spec;
    CHECK(s.auto_switches >= 1);  // both choices were tried
    CHECK(s.drafted > 0);
    CHECK(s.verified > 0);
    CHECK(engines[r]->stats().blocks_free == engines[r]->stats().blocks_total);
  }
  CHECK(engines[0]->steps_started() == engines[1]->steps_started());
}

TEST_CASE("ep draft passes: a lockstep step runs them only when some rank announced drafting in its first frames") {
  auto w = test::tiny_model("v3-tiny");
  const int64_t slots = model::moe_slot_count(w->config), depth = 3;
  local_ep_hub hub(2, 10s);
  std::vector<int64_t> runs[2];
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      runtime::ep_moe_exchange ex(w, *model::make_backend("cpu", w), {r, 2}, hub.transport(r), true);
      ex.set_draft_depth(depth);
      // nobody drafts; rank 0 drafts; rank 1 drafts; both draft
      for (auto [a, b] : std::vector<std::pair<bool, bool>>{{false, false}, {true, false}, {false, true}, {true, true}}) {
        const int64_t before = ex.positions_run();
        ex.begin_step(r == 0 ? a : b);
        REQUIRE(ex.end_step());
        runs[r].push_back(ex.positions_run() - before);
      }
    });
  for (auto& t : threads) t.join();
  const int64_t mtp_moe = depth * (model::moe_slot_of_layer(w->config, w->config.num_hidden_layers) >= 0 ? 1 : 0);
  REQUIRE(mtp_moe > 0);
  for (int r = 0; r < 2; ++r) CHECK(runs[r] == std::vector<int64_t>{slots, slots + mtp_moe, slots + mtp_moe, slots + mtp_moe});
}
