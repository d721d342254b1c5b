// The cluster simulator: deterministic by seed, requests flow prefill → handoff → decode through
// the real policies and state machines, the storage tier makes prefix hits, the workloads load.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>

#include "sim/cluster_sim.hpp"
#include "sim/report.hpp"

using namespace shoal::sim;

namespace {

const std::string conversation = std::string(SHOAL_SHARED_DIR) + "/traces/mooncake/conversation_trace.jsonl";
const std::string servegen = std::string(SHOAL_SHARED_DIR) + "/traces/servegen-deepseek-r1";

profile gpu_profile() {
  auto p = load_profile(std::string(SHOAL_SOURCE_DIR) + "/config/sim/gpu-h800.json");
  REQUIRE_MESSAGE(p, p.error());
  return *p;
}

// 8 prefill ranks (EP 4) + 8 decode ranks (EP 8), the first 400 conversation requests at 20x.
sim_config small_config(uint64_t seed) {
  sim_config c;
  c.prof = gpu_profile();
  c.prefill_ranks = 8, c.prefill_ep = 4, c.decode_ranks = 8, c.decode_ep = 8;
  c.seed = seed;
  c.prefill_balancer.round_s = 2;
  return c;
}

std::vector<sim_request> small_work() {
  workload_options o;
  o.speed = 20;
  o.max_requests = 400;
  auto w = mooncake_workload(conversation, o);
  REQUIRE_MESSAGE(w, w.error());
  return *w;
}

}  // namespace

TEST_CASE("sim: the same seed gives the same run, another seed another") {
  auto work = small_work();
  auto a = run_cluster(small_config(7), work, *policy_named("shoal"));
  auto b = run_cluster(small_config(7), work, *policy_named("shoal"));
  auto c = run_cluster(small_config(8), work, *policy_named("shoal"));
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(c);
  CHECK(a->state_hash == b->state_hash);
  CHECK(a->decode.busy_s == b->decode.busy_s);
  CHECK(a->state_hash != c->state_hash);
  // Every request finished with its trace output length.
  for (size_t i = 0; i < work.size(); ++i) {
    const request_record& r = a->requests[i];
    REQUIRE(r.finish_s >= 0);
    CHECK(r.first_token_s >= r.arrival_s);
    CHECK(r.finish_s >= r.first_token_s);
    CHECK(r.output == work[i].output_len);
  }
}

TEST_CASE("sim: prefill hands off to decode ranks, the placement policy decides where") {
  auto work = small_work();
  auto rr = run_cluster(small_config(1), work, *policy_named("round_robin"));
  REQUIRE(rr);
  int64_t handed = 0;
  for (const auto& r : rr->requests) handed += r.decode_rank >= 0;
  CHECK(handed == static_cast<int64_t>(rr->handoffs));
  CHECK(rr->handoffs + rr->kept == work.size() - std::count_if(work.begin(), work.end(), [](auto& w) { return w.output_len == 1; }));
  // Round-robin with room everywhere: the counts per decode rank differ by at most one.
  auto [lo, hi] = std::minmax_element(rr->decode_per_rank.begin(), rr->decode_per_rank.end());
  CHECK(*hi - *lo <= 1);
  // Round-robin prefill: request i on prefill rank i mod 8.
  for (const auto& r : rr->requests) CHECK(r.prefill_rank == r.id % 8);
  // The decode balancer places by load, not in turn.
  auto db = run_cluster(small_config(1), work, *policy_named("shoal"));
  REQUIRE(db);
  bool differs = false;
  for (size_t i = 0; i < work.size(); ++i) differs = differs || db->requests[i].decode_rank != rr->requests[i].decode_rank;
  CHECK(differs);
  serving_metrics m = summarize(*db, small_config(1));
  CHECK(m.finished == static_cast<int64_t>(work.size()));
  CHECK(m.decode_balance > 0);
  CHECK(m.decode_balance <= 1);
  CHECK(m.decode_pct_perfect <= 100);
  CHECK(m.tpot_p50 > 0);
}

TEST_CASE("sim: the storage tier serves prefixes computed on other ranks") {
  auto work = small_work();
  sim_config with = small_config(3), without = small_config(3);
  without.prof.storage.capacity_blocks = 0;
  auto a = run_cluster(with, work, *policy_named("round_robin"));
  auto b = run_cluster(without, work, *policy_named("round_robin"));
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->storage_lookups > 0);
  CHECK(a->storage_hit_blocks > 0);
  CHECK(b->storage_lookups == 0);
  // Every conversation request starts with the shared block 0, so storage hits more than the
  // ranks' own caches do, and the prefill pool computes fewer tokens.
  CHECK(a->hit_tokens > b->hit_tokens);
  CHECK(a->prefill.tokens < b->prefill.tokens);
}

TEST_CASE("sim: tiers are counted by prompt length and the report renders") {
  auto work = small_work();
  auto r = run_cluster(small_config(1), work, *policy_named("shoal"));
  REQUIRE(r);
  int64_t below = 0;
  for (const auto& w : work) below += w.input_len < 16384;
  CHECK(r->prefill_per_tier[0] == below);
  serving_metrics m = summarize(*r, small_config(1));
  const std::string line = to_jsonl(m, "sim", R"({"seed":1})");
  CHECK(line.find("\"decode_balance_ratio\"") != std::string::npos);
  CHECK(line.find("\"seed\":1") != std::string::npos);
  const std::string svg = comparison_svg("t", {m}, {{{0.0, 0.5}, {1.0, 0.9}}});
  CHECK(svg.starts_with("<svg"));
  CHECK(svg.find("polyline") != std::string::npos);
  CHECK(format_table({m}).find("shoal") != std::string::npos);
}

TEST_CASE("sim: bad configurations and profiles are refused with a reason") {
  auto work = small_work();
  sim_config c = small_config(1);
  c.prefill_ep = 3;
  auto r = run_cluster(c, work, *policy_named("shoal"));
  REQUIRE_FALSE(r);
  CHECK(r.error().find("prefill EP") != std::string::npos);
  CHECK_FALSE(policy_named("nope"));
  CHECK(policy_named("tiered+least_kv"));
  auto p = parse_profile(R"({"name":"x","model":"tiny","prefill":{"step":{"a":0,"b":1,"c":0,"d":0},"kv_blocks":10}})", "p.json");
  REQUIRE_FALSE(p);
  CHECK(p.error().find("p.json: decode") != std::string::npos);
  auto q = parse_profile(R"({"name":"x","model":"tiny","prefill":{"step":{"a":0,"b":"1","c":0,"d":0},"kv_blocks":10}})", "q.json");
  REQUIRE_FALSE(q);
  CHECK(q.error().find("prefill.step.b") != std::string::npos);
  sim_config tight = small_config(1);
  tight.prof.decode.kv_blocks = 4;
  auto t = run_cluster(tight, work, *policy_named("shoal"));
  REQUIRE_FALSE(t);
  CHECK(t.error().find("does not fit") != std::string::npos);
}

TEST_CASE("sim: cores shared by a pool's ranks slow the steps computed at once, not the other pool's") {
  auto work = small_work();
  sim_config c = small_config(3);
  c.prefill_ep = 1, c.decode_ep = 1;  // ranks that step on their own
  c.prof.step_noise = 0;
  auto base = run_cluster(c, work, *policy_named("shoal"));
  sim_config shared = c;
  shared.prof.prefill.cores = 1;  // 8 prefill ranks on one core; decode ranks as before
  auto slow = run_cluster(shared, work, *policy_named("shoal"));
  REQUIRE(base);
  REQUIRE(slow);
  auto ttft = [](const sim_result& r) {
    double s = 0;
    for (const auto& q : r.requests) s += q.first_token_s - q.arrival_s;
    return s;
  };
  CHECK(ttft(*slow) > 1.5 * ttft(*base));
  CHECK(slow->prefill.busy_s > base->prefill.busy_s);
  auto both = parse_profile(R"({"name":"x","model":"tiny","host_cores":2,
      "prefill":{"step":{"a":0,"b":1,"c":0,"d":0},"kv_blocks":10,"cores":1},
      "decode":{"step":{"a":0,"b":1,"c":0,"d":0},"kv_blocks":10},"kv_bytes_per_token":1,"handoff_gbps":1,
      "storage":{"capacity_blocks":0,"read_latency_s":0,"read_gbps":1}})", "b.json");
  REQUIRE_FALSE(both);
  CHECK_MESSAGE(both.error().find("host_cores") != std::string::npos, both.error());
  auto pinned = load_profile(std::string(SHOAL_SOURCE_DIR) + "/config/sim/cpu-pinned.json");
  REQUIRE_MESSAGE(pinned, pinned.error());
  CHECK(pinned->prefill.cores == 1);
  CHECK(pinned->decode.cores == 1);
  CHECK(pinned->host_cores == 0);
}

TEST_CASE("sim: ranks on shared cores progress as a processor-sharing server of engine processes") {
  // Two prefill ranks on one core, each step 0.01 s per token: a 100-token prompt is 1 s alone.
  auto p = parse_profile(R"({"name":"ps","model":"small",
      "prefill":{"step":{"a":0,"b":0.01,"c":0,"d":0},"kv_blocks":100,"cores":1},
      "decode":{"step":{"a":0,"b":0.001,"c":0,"d":0},"kv_blocks":100},"kv_bytes_per_token":1,"handoff_gbps":1,
      "storage":{"capacity_blocks":0,"read_latency_s":0,"read_gbps":1},"slo":{"ttft_s":1,"tpot_s":1}})", "ps.json");
  REQUIRE_MESSAGE(p, p.error());
  sim_config c;
  c.prof = *p;
  c.prefill_ranks = 2, c.prefill_ep = 1, c.decode_ranks = 1, c.decode_ep = 1;
  std::vector<sim_request> work(2);
  work[0] = {0, 0.0, 100, 1, {}, 512};
  work[1] = {1, 0.5, 100, 1, {}, 512};
  auto r = run_cluster(c, work, *policy_named("round_robin"));
  REQUIRE_MESSAGE(r, r.error());
  REQUIRE(r->requests[0].prefill_rank != r->requests[1].prefill_rank);
  // The first runs alone for 0.5 s, then both at half speed until it ends (0.5 s of its work
  // left: 1 s); the second did 0.5 s of work by then and finishes its last 0.5 s alone.
  CHECK(r->requests[0].first_token_s == doctest::Approx(1.5));
  CHECK(r->requests[1].first_token_s == doctest::Approx(2.0));
  // Busy time is wall time: the one step begun in [warmup 0, last arrival 0.5) lasted 1.5 s.
  CHECK(r->prefill.busy_s == doctest::Approx(1.5));

  // Two cores: ranks in processes of their own each go at full speed; the two ranks of one
  // process share its thread pool, so each goes at half speed while both compute.
  c.prof.prefill.cores = 2;
  auto apart = run_cluster(c, work, *policy_named("round_robin"));
  REQUIRE_MESSAGE(apart, apart.error());
  CHECK(apart->requests[0].first_token_s == doctest::Approx(1.0));
  CHECK(apart->requests[1].first_token_s == doctest::Approx(1.5));
  c.prefill_processes = {2};
  auto together = run_cluster(c, work, *policy_named("round_robin"));
  REQUIRE_MESSAGE(together, together.error());
  CHECK(together->requests[0].first_token_s == doctest::Approx(1.5));
  CHECK(together->requests[1].first_token_s == doctest::Approx(2.0));
  c.prefill_processes = {1, 2};
  auto wrong = run_cluster(c, work, *policy_named("round_robin"));
  REQUIRE_FALSE(wrong);
  CHECK(wrong.error().find("prefill processes") != std::string::npos);
}

TEST_CASE("sim: ServeGen's client model gives a seeded, rate-true workload") {
  workload_options o;
  o.start_s = 36000, o.duration_s = 600;
  auto a = servegen_workload(servegen, o, 5);
  auto b = servegen_workload(servegen, o, 5);
  auto c = servegen_workload(servegen, o, 6);
  REQUIRE_MESSAGE(a, a.error());
  REQUIRE(b);
  REQUIRE(c);
  REQUIRE(a->size() == b->size());
  for (size_t i = 0; i < a->size(); ++i) CHECK((*a)[i].arrival_s == (*b)[i].arrival_s);
  CHECK(a->size() != c->size());
  CHECK(std::is_sorted(a->begin(), a->end(), [](auto& x, auto& y) { return x.arrival_s < y.arrival_s; }));
  // The day's mean is 16 req/s (traces README); a 10-minute window lands within a factor 3.
  CHECK(a->size() > 16 * 600 / 3);
  CHECK(a->size() < 16 * 600 * 3);
  for (const auto& r : *a) CHECK(r.input_len >= 1);
  CHECK_FALSE(servegen_workload("/nonexistent", o, 1));
}

TEST_CASE("sim: a colocated cluster decodes where it prefilled, and speculating ranks emit their accepted drafts") {
  const std::string text = R"({"name":"co","model":"small",
      "prefill":{"step":{"a":0.01,"b":0.001,"c":0,"d":0},"kv_blocks":1000},
      "decode":{"step":{"a":0.01,"b":0.001,"c":0,"d":0},"kv_blocks":1000},"kv_bytes_per_token":1,"handoff_gbps":1,
      "storage":{"capacity_blocks":0,"read_latency_s":0,"read_gbps":1},"slo":{"ttft_s":1,"tpot_s":1},
      "speculation":{"accept":1,"draft_factor":0.5}})";
  auto p = parse_profile(text, "co.json");
  REQUIRE_MESSAGE(p, p.error());
  CHECK(p->speculation.known);
  std::vector<sim_request> work;
  for (int64_t i = 0; i < 4; ++i) work.push_back({i, 0.001 * static_cast<double>(i), 100, 31, {}, 512});
  auto run = [&](int64_t drafts, double accept, double ep_pass = 0) {
    sim_config c;
    c.prof = *p;
    c.prof.speculation.accept = accept;
    c.prof.ep_pass_s = ep_pass;
    c.prefill_ranks = 2, c.prefill_ep = 2, c.decode_ranks = 0, c.decode_ep = 1;
    c.prefill_drafts = drafts;
    auto r = run_cluster(c, work, *policy_named("round_robin"));
    REQUIRE_MESSAGE(r, r.error());
    return *r;
  };
  // The mean time per output token after the first.
  auto tpot = [](const sim_result& r) {
    double s = 0;
    for (const auto& q : r.requests) s += (q.finish_s - q.first_token_s) / static_cast<double>(q.output - 1);
    return s / static_cast<double>(r.requests.size());
  };
  const sim_result plain = run(0, 1), sure = run(2, 1), never = run(2, 0);
  for (const sim_result* r : {&plain, &sure, &never}) {
    CHECK(r->handoffs == 0);
    CHECK(r->kept == 0);
    for (const auto& q : r->requests) {
      CHECK(q.output == 31);  // every token, each once (a repeated or skipped one fails the client's check)
      CHECK(q.decode_rank == -1);
      CHECK(q.error.empty());
    }
  }
  // Every draft accepted: 3 tokens a step, so about a third of the decode steps, each dearer
  // (3 verified tokens and 2 draft passes at half a step's cost) but cheaper per token.
  CHECK(sure.prefill.all_steps * 2 < plain.prefill.all_steps);
  CHECK(tpot(sure) < tpot(plain));
  // None accepted: a token a step, as without drafts, each step paying for the verify and the drafts.
  CHECK(never.prefill.all_steps == plain.prefill.all_steps);
  CHECK(tpot(never) > 1.5 * tpot(plain));
  // Exchanges: the first prefill step (request 0 alone) waits one pass's latency more; a
  // drafting decode step waits three (the main pass and two draft passes).
  const sim_result waits = run(0, 1, 0.05), waits_drafting = run(2, 0, 0.05);
  CHECK(waits.requests[0].first_token_s == doctest::Approx(plain.requests[0].first_token_s + 0.05));
  CHECK(tpot(waits) == doctest::Approx(tpot(plain) + 0.05).epsilon(0.02));
  CHECK(tpot(waits_drafting) == doctest::Approx(tpot(never) + 0.15).epsilon(0.02));
  sim_config no_spec;
  no_spec.prof = gpu_profile();
  no_spec.prefill_ranks = 8, no_spec.prefill_ep = 4, no_spec.decode_ranks = 8, no_spec.decode_ep = 8;
  no_spec.decode_drafts = 2;
  auto refused = run_cluster(no_spec, work, *policy_named("shoal"));
  REQUIRE_FALSE(refused);
  CHECK(refused.error().find("\"speculation\"") != std::string::npos);
  auto shipped = load_profile(std::string(SHOAL_SOURCE_DIR) + "/config/sim/cpu-deepseek.json");
  REQUIRE_MESSAGE(shipped, shipped.error());
  CHECK(shipped->speculation.known);
  CHECK(shipped->ep_pass_s > 0);
  std::string wrong = text;
  wrong.replace(wrong.find("\"accept\":1"), 10, "\"accept\":2");
  auto bad = parse_profile(wrong, "s.json");
  REQUIRE_FALSE(bad);
  CHECK(bad.error().find("speculation.accept") != std::string::npos);
}
