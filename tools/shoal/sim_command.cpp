// `shoal sim`: the deterministic cluster simulator (sim/cluster_sim.hpp) over a Mooncake trace
// or ServeGen's DeepSeek-R1 client model, every policy of the comparison in one run. Its
// printed report is a function of its inputs and seed only (no wall-clock figure in it); the
// run's own speed goes to stderr and the JSONL records.
#include <filesystem>
#include <fstream>
#include <map>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "sim/campaign.hpp"
#include "sim/cluster_sim.hpp"
#include "sim/report.hpp"
#include "tools/shoal/bench_util.hpp"
#include "tools/shoal/commands.hpp"

namespace shoal::tools {

namespace {

struct sim_args {
  std::string trace, servegen, profile = "config/sim/gpu-h800.json", cost_model, decode_cost_model, jsonl, svg;
  std::vector<std::string> policies;
  uint64_t seed = 1;
  int64_t requests = 0, prefill_ranks = 64, prefill_ep = 8, decode_ranks = 64, decode_ep = 64, max_input = 0;
  int64_t prefill_drafts = 0, decode_drafts = 0;
  std::string config;  // a node-config directory whose shape replaces the rank options
  double speed = 1, length_scale = 1, duration = 0, start = 0, round_s = 10, timeline = 0, warmup = 0;
  std::vector<int64_t> tiers;
};

// --config: the node configs' shape into `c`, and into the rank options the report prints.
std::expected<void, std::string> shape_from_config(sim_args& a, sim::sim_config& c) {
  if (a.config.empty()) return {};
  if (auto ok = sim_shape_from_config(a.config, c); !ok) return ok;
  a.prefill_ranks = c.prefill_ranks, a.prefill_ep = c.prefill_ep, a.decode_ranks = c.decode_ranks, a.decode_ep = c.decode_ep;
  a.prefill_drafts = c.prefill_drafts, a.decode_drafts = c.decode_drafts;
  return {};
}

int run_sim(sim_args a) {  // a copy: --config fills in the rank options
  auto prof = sim::load_profile(a.profile);
  if (!prof) {
    fmt::print(stderr, "shoal sim: {}\n", prof.error());
    return 2;
  }
  if (auto ok = sim::apply_fitted(*prof, a.cost_model, a.decode_cost_model); !ok) {
    fmt::print(stderr, "shoal sim: {}\n", ok.error());
    return 2;
  }
  sim::workload_options wo;
  wo.speed = a.speed, wo.length_scale = a.length_scale, wo.max_requests = a.requests;
  wo.duration_s = a.duration, wo.start_s = a.start, wo.max_input = a.max_input;
  auto work = a.servegen.empty() ? sim::mooncake_workload(a.trace, wo) : sim::servegen_workload(a.servegen, wo, a.seed);
  if (!work) {
    fmt::print(stderr, "shoal sim: {}\n", work.error());
    return 2;
  }
  sim::sim_config c;
  c.prof = *prof;
  c.prefill_ranks = a.prefill_ranks, c.prefill_ep = a.prefill_ep;
  c.decode_ranks = a.decode_ranks, c.decode_ep = a.decode_ep;
  c.prefill_drafts = a.prefill_drafts, c.decode_drafts = a.decode_drafts;
  if (auto ok = shape_from_config(a, c); !ok) {
    fmt::print(stderr, "shoal sim: {}\n", ok.error());
    return 2;
  }
  c.seed = a.seed;
  c.prefill_balancer.round_s = a.round_s;
  if (!a.tiers.empty()) c.prefill_balancer.tier_bounds = a.tiers;
  c.timeline_s = a.timeline;
  c.warmup_s = a.warmup;
  std::vector<sim::policy_pair> pols;
  if (a.policies.empty()) pols = sim::standard_policies();
  for (const auto& n : a.policies) {
    auto p = sim::policy_named(n);
    if (!p) {
      fmt::print(stderr, "shoal sim: {}\n", p.error());
      return 2;
    }
    pols.push_back(*p);
  }
  const std::string source = a.servegen.empty() ? a.trace : a.servegen;
  fmt::print("SEED={}\n", a.seed);
  fmt::print("workload {} ({} requests, speed {}, length scale {}), profile {} ({}), {} prefill ranks (EP {}) + {} decode ranks (EP {})\n",
             std::filesystem::path(source).filename().string(), work->size(), a.speed, a.length_scale, prof->name,
             prof->model_name, a.prefill_ranks, a.prefill_ep, a.decode_ranks, a.decode_ep);
  std::vector<sim::serving_metrics> ms;
  std::vector<std::vector<std::pair<double, double>>> timelines;
  nlohmann::json extra = {{"trace", source}, {"profile", prof->name}, {"seed", a.seed}, {"speed", a.speed},
                          {"length_scale", a.length_scale}, {"requests_in", work->size()},
                          {"prefill_ranks", a.prefill_ranks}, {"prefill_ep", a.prefill_ep},
                          {"decode_ranks", a.decode_ranks}, {"decode_ep", a.decode_ep},
                          {"prefill_drafts", a.prefill_drafts}, {"decode_drafts", a.decode_drafts}, {"machine", machine_facts()}};
  for (const auto& p : pols) {
    auto r = sim::run_cluster(c, *work, p);
    if (!r) {
      fmt::print(stderr, "shoal sim: {}\n", r.error());
      return 2;
    }
    ms.push_back(sim::summarize(*r, c));
    timelines.push_back(r->decode_timeline);
    const double span = ms.back().span_s;
    fmt::print(stderr, "shoal sim: {} took {:.1f} s for {:.0f} s of virtual time ({:.1f}x faster than trace time)\n",
               p.name, r->wall_s, span, r->wall_s > 0 ? span / r->wall_s : 0.0);
    fmt::print("policy {}: state hash {:016x}, handoffs {}, kept on prefill {}, preemptions {}, requests per tier [{}]\n",
               p.name, r->state_hash, r->handoffs, r->kept, r->preemptions, fmt::join(r->prefill_per_tier, ", "));
    if (!a.jsonl.empty()) {
      nlohmann::json e = extra;
      e["sim_speedup"] = r->wall_s > 0 ? span / r->wall_s : 0.0;
      append_jsonl(a.jsonl, nlohmann::json::parse(sim::to_jsonl(ms.back(), "sim", e.dump())));
    }
  }
  fmt::print("{}", sim::format_table(ms));
  fmt::print("(TTFT/TPOT in s; goodput: requests/s meeting TTFT <= {} s and TPOT <= {} s; dBal/pBal: mean balance ratio of "
             "decode/prefill steps from --warmup to the last arrival; %perf: % of perfectly balanced; hit: prefix hit "
             "ratio in tokens)\n",
             prof->ttft_slo_s, prof->tpot_slo_s);
  if (!a.svg.empty()) {
    std::ofstream f(a.svg);
    f << sim::comparison_svg(fmt::format("shoal sim: {} on {} ({} prefill + {} decode ranks), seed {}", prof->name,
                                         std::filesystem::path(source).filename().string(), a.prefill_ranks,
                                         a.decode_ranks, a.seed),
                             ms, c.timeline_s > 0 ? timelines : decltype(timelines){});
    if (!f) {
      fmt::print(stderr, "shoal sim: cannot write {}\n", a.svg);
      return 1;
    }
  }
  return 0;
}

struct faults_args {
  std::string profile = "config/sim/gpu-h800.json", planted = "none";
  uint64_t seed = 0, from = 1;
  int64_t runs = 1000;
};

// The fault campaign (sim/campaign.hpp): one seed, replayed and described, or `runs` seeds
// from `from` with a line per failing seed and the totals.
int run_sim_faults(const faults_args& a) {
  auto bug = sim::planted_bug_named(a.planted);
  if (!bug) {
    fmt::print(stderr, "shoal sim-faults: {}\n", bug.error());
    return 2;
  }
  const uint64_t first = a.seed ? a.seed : a.from;
  const int64_t runs = a.seed ? 1 : a.runs;
  sim::fault_outcome total;
  int64_t failed = 0, faults = 0;
  std::map<std::string, int64_t> kinds;
  for (int64_t i = 0; i < runs; ++i) {
    const uint64_t seed = first + static_cast<uint64_t>(i);
    auto fc = sim::make_fault_campaign(a.profile, seed, *bug);
    if (!fc) {
      fmt::print(stderr, "shoal sim-faults: {}\n", fc.error());
      return 2;
    }
    auto r = sim::run_cluster(fc->config, fc->work, fc->policy);
    if (!r) {
      fmt::print(stderr, "shoal sim-faults: {}\n", r.error());
      return 2;
    }
    const sim::fault_outcome& f = r->faults;
    if (!f.ok() || a.seed) fmt::print("{}\n", sim::describe_faults(seed, f));
    if (a.seed) {
      fmt::print("state_hash {:016x}\n", r->state_hash);
      for (const auto& e : f.errors) fmt::print("  error: {}\n", e);
    }
    failed += f.ok() ? 0 : 1;
    faults += static_cast<int64_t>(f.schedule.size());
    for (const auto& e : f.schedule) ++kinds[sim::fault_kind_name(e.kind)];
    total.completed += f.completed, total.errored += f.errored, total.lost += f.lost;
    total.wrong_blocks += f.wrong_blocks, total.wrong_outputs += f.wrong_outputs, total.duplicates += f.duplicates;
    total.placed_on_dead += f.placed_on_dead, total.leaked_blocks += f.leaked_blocks;
    total.rerouted += f.rerouted, total.handoff_failures += f.handoff_failures;
    total.handoff_duplicates += f.handoff_duplicates, total.dropped_writes += f.dropped_writes;
    total.damaged_caught += f.damaged_caught;
    total.rank_losses += f.rank_losses, total.rejoins += f.rejoins, total.routed_to_lost += f.routed_to_lost;
  }
  std::string mix;
  for (const auto& [k, n] : kinds) mix += fmt::format("{}{} {}", mix.empty() ? "" : ", ", n, k);
  fmt::print("runs {} (seeds {}..{}), failed {}; node faults {} ({})\n", runs, first, first + static_cast<uint64_t>(runs) - 1,
             failed, faults, mix);
  fmt::print("requests: completed {}, errored {}, lost {}; wrong blocks served {}, wrong outputs {}, duplicates {}, "
             "placements on down nodes {}, blocks leaked {}\n",
             total.completed, total.errored, total.lost, total.wrong_blocks, total.wrong_outputs, total.duplicates,
             total.placed_on_dead, total.leaked_blocks);
  fmt::print("reactions: re-routed {}, handoff reads failed or late {}, duplicate handoff deliveries ignored {}, "
             "writes dropped (disk full) {}, damaged chunks caught {}\n",
             total.rerouted, total.handoff_failures, total.handoff_duplicates, total.dropped_writes, total.damaged_caught);
  fmt::print("expert-parallel groups: ranks lost {}, back {}; steps routed to a lost rank {}\n", total.rank_losses,
             total.rejoins, total.routed_to_lost);
  return failed == 0 ? 0 : 1;
}

}  // namespace

void add_sim_command(CLI::App& app) {
  auto fa = std::make_shared<faults_args>();
  auto* f = app.add_subcommand("sim-faults", "the simulator's fault campaign: seeded runs with faults, invariants checked");
  f->add_option("--seed", fa->seed, "replay this one seed and describe it");
  f->add_option("--runs", fa->runs, "seeds to run (without --seed)")->capture_default_str();
  f->add_option("--from", fa->from, "first seed (without --seed)")->capture_default_str();
  f->add_option("--profile", fa->profile, "GPU step-time profile")->capture_default_str();
  f->add_option("--planted", fa->planted, "tests only: none, place_on_dead, skip_checksum, repeat_tokens, lease_never_expires, route_to_lost")->capture_default_str();
  f->callback([fa] { set_exit_code(run_sim_faults(*fa)); });

  auto a = std::make_shared<sim_args>();
  a->trace = conversation_trace_path();
  auto* s = app.add_subcommand("sim", "deterministic cluster simulation of the balancers on a trace");
  s->add_option("--trace", a->trace, "Mooncake JSONL trace")->capture_default_str();
  s->add_option("--servegen", a->servegen, "ServeGen client-model directory instead of a trace (needs --duration)");
  s->add_option("--seed", a->seed, "seed of step noise, storage jitter and ServeGen sampling")->capture_default_str();
  s->add_option("--requests", a->requests, "first N requests only (0 = all)");
  s->add_option("--profile", a->profile, "step-time profile (config/sim/*.json)")->capture_default_str();
  s->add_option("--cost-model", a->cost_model, "fitted cost model (shoal bench fit-cost) for a profile whose step is \"fitted\"");
  s->add_option("--decode-cost-model", a->decode_cost_model, "fitted decode steps (shoal bench fit-cost --decode) for its decode pool");
  s->add_option("--policies", a->policies, "shoal, untiered, round_robin, least_requests, cache_aware, dynamo or PREFILL+DECODE (default: all six)")->delimiter(',');
  std::vector<CLI::Option*> shape = {
    s->add_option("--prefill-ranks", a->prefill_ranks)->capture_default_str(),
    s->add_option("--prefill-ep", a->prefill_ep)->capture_default_str(),
    s->add_option("--decode-ranks", a->decode_ranks, "0: colocated (the prefill ranks decode what they prefilled)")
      ->capture_default_str(),
    s->add_option("--decode-ep", a->decode_ep)->capture_default_str(),
    s->add_option("--prefill-drafts", a->prefill_drafts, "DSpark drafts per decode step on the prefill ranks (colocated)")
      ->check(CLI::Range(0, 16)),
    s->add_option("--decode-drafts", a->decode_drafts,
                  "DSpark drafts per decode step on the decode ranks (the profile's \"speculation\" times them)")
      ->check(CLI::Range(0, 16))};
  auto* config = s->add_option("--config", a->config,
                               "the cluster of a node-config directory (as shoal bench cluster simulates it: its ranks, EP "
                               "groups, engine processes, DSpark depths, token budgets and max_running); not with the "
                               "rank and draft options")
                   ->check(CLI::ExistingDirectory);
  for (CLI::Option* o : shape) config->excludes(o);
  s->add_option("--speed", a->speed, "arrival rate × this")->capture_default_str();
  s->add_option("--length-scale", a->length_scale, "input and output lengths × this")->capture_default_str();
  s->add_option("--max-input", a->max_input, "cut longer prompts to this many tokens");
  s->add_option("--duration", a->duration, "seconds of trace (ServeGen: of the day, required)");
  s->add_option("--start", a->start, "ServeGen: start second of the day");
  s->add_option("--round", a->round_s, "prefill balancer round, seconds")->capture_default_str();
  s->add_option("--tiers", a->tiers, "prefill tier bounds, tokens (default 16384,65536,262144)")->delimiter(',');
  s->add_option("--timeline", a->timeline, "balance-ratio timeline bucket, seconds (0 = none)");
  s->add_option("--warmup", a->warmup, "virtual seconds left out of SPS and balance figures");
  s->add_option("--jsonl", a->jsonl, "append one record per policy");
  s->add_option("--svg", a->svg, "write the comparison plot");
  s->callback([a] { set_exit_code(run_sim(*a)); });
}

}  // namespace shoal::tools
