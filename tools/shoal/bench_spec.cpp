// `shoal bench spec`: DSpark speculative decoding on the real engine. Random weights give
// meaningless acceptance, so drafts come from the model's MTP chain (their real cost) while
// acceptance follows the synthetic model matching MISSION.md's production statistics
// (fixed-5 accepts 3.29 per step). Per concurrency it first measures the decode step time
// against verified tokens (t = a + b·tokens, least squares over fixed-k steps, k = 0…5),
// hands that cost model to the adaptive policy, then runs off / fixed-5 / adaptive and
// reports decode tokens/s, verified and accepted drafts per step. The concurrency from which
// adaptive beats fixed is the measured threshold (engine spec_config::adaptive_from). auto
// (spec_mode::automatic) measures both choices itself and keeps the faster per concurrency.
// --ep N runs the group of N ranks in lockstep (DSpark under expert parallelism: off /
// fixed-5 / auto). Engines schedule overlapped (the next step planned while one computes)
// unless --sync; the column `plan exp.` is the planning each decode step waited for (the
// exposed scheduling overhead of that configuration).
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <barrier>
#include <thread>

#include "model/generate.hpp"
#include "runtime/ep/expert_parallel.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/engine_setup.hpp"
#include "tools/shoal/bench_util.hpp"
#include "tools/shoal/commands.hpp"

namespace shoal::tools {

namespace {

struct spec_args {
  std::string preset = "tiny";
  std::string model_dir;
  std::vector<int> concurrency = {1, 4, 16, 60};
  int prompt = 64;
  int tokens = 40;
  int draft_context = 0;
  int ep = 1;  // > 1: an expert-parallel group of this many ranks (threads, in lockstep)
  bool sync = false;  // async (overlapped) scheduling off
  std::string out = "bench/results/spec.jsonl";
};

struct run_figures {
  double tokens_per_s = 0, step_s = 0, verified = 0, accepted = 0, tokens_per_step = 0;
  double forward_share = 0;  // of decode step time: the forward pass (the rest drafts, verifies, plans)
  double plan_exposed_s = 0; // per decode step: planning it waited for
  std::vector<std::pair<int64_t, double>> steps;  // (tokens in the step, step seconds)
};

void add_requests(runtime::engine& e, int from, int count, int stride, const spec_args& a) {
  for (int i = from; i < count; i += stride) {
    runtime::sampling_params p;
    p.max_tokens = a.tokens;
    p.ignore_eos = true;
    std::vector<int32_t> prompt(static_cast<size_t>(a.prompt));
    for (size_t t = 0; t < prompt.size(); ++t)
      prompt[t] = static_cast<int32_t>(splitmix64(static_cast<uint64_t>(i) * 100003 + t) % 250);
    if (!e.add_request(prompt, p)) throw std::runtime_error("request refused");
  }
}

runtime::engine_config bench_config(const model::model_weights& w, runtime::spec_config spec, int concurrency,
                                    const spec_args& a) {
  runtime::engine_config cfg = runtime::default_engine_config(w.config, 256);
  cfg.async_scheduling = !a.sync;
  cfg.sched.max_running = std::max(concurrency, 1);
  cfg.cache.prefix_caching = false;
  cfg.spec = std::move(spec);
  return cfg;
}

// One rank's lockstep step as the bench saw it.
struct step_rec {
  double dt = 0, forward_s = 0, plan_exposed_s = 0;
  int64_t emitted = 0, decode_tokens = 0;
  bool prefill = false;
};
run_figures group_figures(const std::vector<std::vector<step_rec>>& recs, const runtime::spec_stats& s);

// Under expert parallelism: `a.ep` engines of one group on threads in lockstep (local_ep_hub),
// the sequences dealt round-robin. A lockstep step is a decode step when no rank prefilled in
// it; its time is the slowest rank's, its tokens every rank's. Figures of the whole group
// (verified / accepted per request-step over every rank).
run_figures run_mode_ep(const std::shared_ptr<const model::model_weights>& w, const runtime::spec_config& spec,
                        int concurrency, const spec_args& a) {
  const size_t n = static_cast<size_t>(a.ep);
  runtime::local_ep_hub hub(a.ep, std::chrono::seconds(60));
  std::vector<std::unique_ptr<runtime::engine>> engines;
  for (size_t r = 0; r < n; ++r) {
    runtime::engine_config cfg = bench_config(*w, spec, concurrency, a);
    cfg.batch_invariant = true;
    cfg.ep = runtime::engine_config::ep_config{};
    cfg.ep->layout = {static_cast<int32_t>(r), a.ep};
    cfg.ep->transport = hub.transport(static_cast<int32_t>(r));
    engines.push_back(std::make_unique<runtime::engine>(w, cfg));
    add_requests(*engines.back(), static_cast<int>(r), concurrency, a.ep, a);
  }
  std::vector<std::vector<step_rec>> recs(n);
  std::vector<char> busy(n, 0);
  std::barrier sync(static_cast<std::ptrdiff_t>(n));
  std::vector<std::thread> threads;
  for (size_t r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      runtime::engine& e = *engines[r];
      for (;;) {
        busy[r] = e.has_work();
        sync.arrive_and_wait();
        const bool any = std::any_of(busy.begin(), busy.end(), [](char b) { return b != 0; });
        sync.arrive_and_wait();
        if (!any) return;
        const auto before = e.stats();
        const double t0 = now_s();
        auto events = e.step();
        step_rec s;
        s.dt = now_s() - t0;
        const auto after = e.stats();
        s.prefill = after.prefill_tokens != before.prefill_tokens;
        s.forward_s = after.forward_s - before.forward_s;
        s.plan_exposed_s = after.plan_exposed_s - before.plan_exposed_s;
        s.decode_tokens = static_cast<int64_t>(after.decode_tokens - before.decode_tokens);
        for (const auto& ev : events) s.emitted += ev.token >= 0;
        recs[r].push_back(s);
      }
    });
  for (auto& t : threads) t.join();
  runtime::spec_stats s;
  for (auto& e : engines) {
    const auto x = e->stats().spec;
    s.decode_steps += x.decode_steps, s.verified += x.verified, s.accepted += x.accepted, s.emitted += x.emitted;
  }
  return group_figures(recs, s);
}

run_figures group_figures(const std::vector<std::vector<step_rec>>& recs, const runtime::spec_stats& s) {
  const size_t n = recs.size();
  run_figures f;
  int64_t emitted = 0;
  double decode_s = 0, forward_s = 0, plan_s = 0;
  uint64_t steps = 0;
  for (size_t i = 0; i < recs[0].size(); ++i) {
    bool prefill = false;
    double dt = 0, fw = 0, pl = 0;
    int64_t em = 0;
    for (size_t r = 0; r < n; ++r) {
      if (i >= recs[r].size()) continue;
      prefill = prefill || recs[r][i].prefill;
      dt = std::max(dt, recs[r][i].dt);
      fw = std::max(fw, recs[r][i].forward_s);
      pl = std::max(pl, recs[r][i].plan_exposed_s);
      em += recs[r][i].emitted;
    }
    if (prefill) continue;
    emitted += em, decode_s += dt, forward_s += fw, plan_s += pl, ++steps;
    f.steps.emplace_back(recs[0][i].decode_tokens, recs[0][i].dt);  // rank 0's tokens: its own cost model
  }
  f.tokens_per_s = decode_s > 0 ? double(emitted) / decode_s : 0;
  f.step_s = steps ? decode_s / double(steps) : 0;
  f.forward_share = decode_s > 0 ? forward_s / decode_s : 0;
  f.plan_exposed_s = steps ? plan_s / double(steps) : 0;
  f.verified = s.verified_per_step();
  f.accepted = s.accepted_per_step();
  f.tokens_per_step = s.decode_steps ? s.tokens_per_step() : 1.0;
  return f;
}

run_figures run_mode(const std::shared_ptr<const model::model_weights>& w, runtime::spec_config spec, int concurrency,
                     const spec_args& a) {
  if (a.ep > 1) return run_mode_ep(w, spec, concurrency, a);
  runtime::engine e(w, bench_config(*w, std::move(spec), concurrency, a));
  add_requests(e, 0, concurrency, 1, a);
  run_figures f;
  int64_t emitted = 0;
  double decode_s = 0, forward_s = 0, plan_s = 0;
  uint64_t steps = 0;
  while (e.has_work()) {
    const auto before = e.stats();
    const double t0 = now_s();
    auto events = e.step();
    const double dt = now_s() - t0;
    const auto after = e.stats();
    if (after.prefill_tokens != before.prefill_tokens) continue;  // prefill steps are not decode speed
    int64_t n = 0;
    for (const auto& ev : events) n += ev.token >= 0;
    emitted += n;
    decode_s += dt;
    forward_s += after.forward_s - before.forward_s;
    plan_s += after.plan_exposed_s - before.plan_exposed_s;
    ++steps;
    f.steps.emplace_back(static_cast<int64_t>(after.decode_tokens - before.decode_tokens), dt);
  }
  const auto s = e.stats();
  f.tokens_per_s = decode_s > 0 ? double(emitted) / decode_s : 0;
  f.step_s = steps ? decode_s / double(steps) : 0;
  f.forward_share = decode_s > 0 ? forward_s / decode_s : 0;
  f.plan_exposed_s = steps ? plan_s / double(steps) : 0;
  f.verified = s.spec.verified_per_step();
  f.accepted = s.spec.accepted_per_step();
  f.tokens_per_step = s.spec.decode_steps ? s.spec.tokens_per_step() : 1.0;
  return f;
}

// Least squares t = a + b·n over the measured decode steps.
runtime::cost_model fit_linear(const std::vector<std::pair<int64_t, double>>& pts) {
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (auto [x, y] : pts) {
    n += 1, sx += double(x), sy += y, sxx += double(x) * double(x), sxy += double(x) * y;
  }
  const double den = n * sxx - sx * sx;
  const double b = den > 0 ? (n * sxy - sx * sy) / den : 0;
  const double a0 = n > 0 ? (sy - b * sx) / n : 0;
  return runtime::cost_model(std::max(a0, 0.0), std::max(b, 0.0), 0, 0);
}

// The checkpoint of --model, or the preset's shape with random weights; null after an error.
std::shared_ptr<const model::model_weights> spec_weights(const spec_args& a) {
  if (!a.model_dir.empty()) {
    auto m = runtime::load_model_dir(a.model_dir, true);
    if (!m) {
      fmt::print(stderr, "shoal bench spec: {}\n", m.error().message);
      return nullptr;
    }
    return m->weights;
  }
  auto mw = std::make_shared<model::model_weights>();
  auto c = model::preset_config(a.preset);
  if (!c) {
    fmt::print(stderr, "shoal bench spec: {}\n", c.error().message);
    return nullptr;
  }
  mw->config = *c;
  mw->config.vocab_size = a.preset == "small" || a.preset == "v3-small" ? 129280 : 300;
  mw->config.eos_token_id = 1;
  model::init_random(*mw, 0);
  return mw;
}

int run_spec_bench(const spec_args& a) {
  std::shared_ptr<const model::model_weights> w = spec_weights(a);
  if (!w) return 2;
  if (w->mtp.empty()) {
    fmt::print(stderr, "shoal bench spec: the model has no MTP module to draft with\n");
    return 2;
  }
  const nlohmann::json machine = machine_facts();
  fmt::print("model {}, prompt {} tokens, {} generated per request, nextn 5, draft context {}, synthetic acceptance "
             "(fixed-5 accepts 3.30), {} scheduling, EP {}, CPU {}\n",
             a.model_dir.empty() ? a.preset : a.model_dir, a.prompt, a.tokens,
             a.draft_context ? std::to_string(a.draft_context) : "default", a.sync ? "sync" : "overlapped", a.ep,
             machine.value("cpu", std::string("?")));
  fmt::print("{:>5} {:>9} {:>11} {:>9} {:>9} {:>9} {:>10} {:>8} {:>12}\n", "conc", "mode", "tok/s", "s/step", "verified",
             "accepted", "tok/step", "forward", "plan exp. ms");
  std::optional<int> threshold;
  for (int conc : a.concurrency) {
    runtime::spec_config base;
    base.nextn = 5;
    base.draft_context = a.draft_context;
    base.synthetic = runtime::production_acceptance();
    // Decode step time against the step's tokens, 5 drafts made every step (their cost is in
    // the fixed part) and k = 1, 3, 5 verified.
    std::vector<std::pair<int64_t, double>> pts;
    for (int64_t k = 1; k <= 5; k += 2) {
      runtime::spec_config s = base;
      s.mode = runtime::spec_mode::fixed;
      s.fixed_k = k;
      s.synthetic = runtime::synthetic_acceptance{{0.15}};  // mostly rejected: every step verifies k
      auto f = run_mode(w, s, conc, a);
      pts.insert(pts.end(), f.steps.begin(), f.steps.end());
    }
    const runtime::cost_model cost = fit_linear(pts);
    fmt::print("{:>5} step cost model: t = {:.3g} s + {:.3g} s/token\n", conc, cost.a(), cost.b());
    std::map<std::string, run_figures> res;
    std::vector<runtime::spec_mode> modes = {runtime::spec_mode::off, runtime::spec_mode::fixed};
    if (a.ep == 1) modes.push_back(runtime::spec_mode::adaptive);
    modes.push_back(runtime::spec_mode::automatic);
    for (auto mode : modes) {
      runtime::spec_config s = base;
      s.mode = mode;
      s.cost = cost;
      s.adaptive_from = 0;  // measured here, not assumed
      run_figures f = run_mode(w, s, conc, a);
      res[to_string(mode)] = f;
      fmt::print("{:>5} {:>9} {:>11.1f} {:>9.4f} {:>9.2f} {:>9.2f} {:>10.2f} {:>7.0f}% {:>12.3f}\n", conc, to_string(mode),
                 f.tokens_per_s, f.step_s, f.verified, f.accepted, f.tokens_per_step, 100 * f.forward_share,
                 1e3 * f.plan_exposed_s);
      append_jsonl(a.out, {{"kind", "spec"}, {"model", a.model_dir.empty() ? a.preset : a.model_dir}, {"ep", a.ep},
                           {"concurrency", conc}, {"mode", to_string(mode)}, {"nextn", 5}, {"draft_context", a.draft_context},
                           {"tokens_per_s", f.tokens_per_s}, {"step_s", f.step_s},
                           {"verified_per_step", f.verified}, {"accepted_per_step", f.accepted},
                           {"tokens_per_step", f.tokens_per_step}, {"counting", "actual"},
                           {"tau", 1 + f.accepted}, {"forward_share", f.forward_share},
                           {"scheduling", a.sync ? "sync" : "overlapped"}, {"plan_exposed_s_per_step", f.plan_exposed_s},
                           {"cost_a", cost.a()}, {"cost_b", cost.b()},
                           {"machine", machine}});
    }
    const double better = std::max(res["off"].tokens_per_s, res["fixed"].tokens_per_s);
    fmt::print("{:>5} fixed / off = {:.3f}, auto / better of off and fixed = {:.3f}\n", conc,
               res["fixed"].tokens_per_s / std::max(res["off"].tokens_per_s, 1e-12),
               res["auto"].tokens_per_s / std::max(better, 1e-12));
    if (a.ep > 1) continue;
    const double gain = res["adaptive"].tokens_per_s / std::max(res["fixed"].tokens_per_s, 1e-12);
    fmt::print("{:>5} adaptive / fixed = {:.3f}\n", conc, gain);
    if (gain > 1.0 && !threshold) threshold = conc;
    if (gain <= 1.0) threshold.reset();
  }
  if (a.ep > 1) return 0;
  if (threshold) fmt::print("adaptive beats fixed from {} concurrent sequences on (spec_config::adaptive_from)\n", *threshold);
  else fmt::print("adaptive did not beat fixed at the largest concurrency run\n");
  return 0;
}

}  // namespace

void add_spec_bench(CLI::App& bench) {
  auto a = std::make_shared<spec_args>();
  auto* c = bench.add_subcommand("spec", "DSpark speculative decoding: off / fixed-5 / adaptive tokens/s per concurrency");
  c->add_option("--preset", a->preset, "random-weight preset (without --model)")->capture_default_str();
  c->add_option("--model", a->model_dir, "a checkpoint directory instead of a preset");
  c->add_option("--concurrency", a->concurrency, "concurrent sequences")->capture_default_str();
  c->add_option("--prompt", a->prompt, "prompt tokens")->capture_default_str();
  c->add_option("--tokens", a->tokens, "generated tokens per request")->capture_default_str();
  c->add_option("--draft-context", a->draft_context, "MTP rows per draft depth (0: the model's default)")->capture_default_str();
  c->add_option("--ep", a->ep, "ranks of one expert-parallel group (threads in lockstep); 1: one engine")
    ->check(CLI::Range(1, 64))
    ->capture_default_str();
  c->add_flag("--sync", a->sync, "plan each step after the previous one completed (no overlapped scheduling)");
  c->add_option("--out", a->out, "JSONL records")->capture_default_str();
  c->callback([a] { set_exit_code(run_spec_bench(*a)); });
}

}  // namespace shoal::tools
