// `shoal sim`: the deterministic cluster simulator (sim/cluster_sim.hpp) over a Mooncake trace
// or ServeGen's DeepSeek-R1 client model, every policy of the comparison in one run. Its
// printed report is a function of its inputs and seed only (no wall-clock figure in it); the
// run's own speed goes to stderr and the JSONL records.
#include <filesystem>
#include <fstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

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
  double speed = 1, length_scale = 1, duration = 0, start = 0, round_s = 10, timeline = 0, warmup = 0;
  std::vector<int64_t> tiers;
};

int run_sim(const sim_args& a) {
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
                          {"decode_ranks", a.decode_ranks}, {"decode_ep", a.decode_ep}, {"machine", machine_facts()}};
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

}  // namespace

void add_sim_command(CLI::App& app) {
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
  s->add_option("--prefill-ranks", a->prefill_ranks)->capture_default_str();
  s->add_option("--prefill-ep", a->prefill_ep)->capture_default_str();
  s->add_option("--decode-ranks", a->decode_ranks)->capture_default_str();
  s->add_option("--decode-ep", a->decode_ep)->capture_default_str();
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
