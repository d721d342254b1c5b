// `shoal generate`: offline generation of N samples of one prompt through the engine.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <fstream>

#include "runtime/core/cost_model.hpp"
#include "runtime/engine/engine_setup.hpp"
#include "tools/shoal/commands.hpp"

namespace shoal::tools {

namespace {

struct generate_args {
  std::string model_dir, prompt;
  int n = 1;
  int max_tokens = 32;
  float temperature = 0.0f, top_p = 1.0f;
  int top_k = 0;
  uint64_t seed = 0;
  double cache_mib = 512;
  model::kv_dtype kv = model::kv_dtype::bf16;
  bool invariant = false;
  std::string cost_model;   // fitted cost model file (shoal bench fit-cost)
  double step_ms = 0;       // step time budget for prefill chunks (with --cost-model)
};

int run_generate(const generate_args& a) {
  auto m = runtime::load_model_dir(a.model_dir, true);
  if (!m) {
    fmt::print(stderr, "shoal generate: {}\n", m.error().message);
    return 1;
  }
  runtime::engine_config cfg = runtime::default_engine_config(m->weights->config, a.cache_mib, a.kv);
  cfg.batch_invariant = a.invariant;
  if (!a.cost_model.empty()) {
    auto cm = runtime::read_cost_model_file(a.cost_model);
    if (!cm) {
      fmt::print(stderr, "shoal generate: {}\n", cm.error());
      return 2;
    }
    cfg.sched.cost = *cm;
    cfg.sched.step_time_budget_s = a.step_ms / 1000.0;
  }
  runtime::engine eng(m->weights, cfg, m->tokenizer);
  auto ids = runtime::encode_prompt(*m->tokenizer, a.prompt);
  for (int i = 0; i < a.n; ++i) {
    runtime::sampling_params p;
    p.max_tokens = a.max_tokens, p.temperature = a.temperature, p.top_p = a.top_p, p.top_k = a.top_k;
    p.seed = a.seed + static_cast<uint64_t>(i);
    auto id = eng.add_request(ids, p);
    if (!id) {
      fmt::print(stderr, "shoal generate: {}\n", id.error().message);
      return 2;
    }
  }
  for (const auto& c : eng.run_to_completion())
    fmt::print("[{}] ({} tokens, {}, cached {}) {}\n", c.id.value, c.output.size(), runtime::to_string(c.reason),
               c.cached_tokens, c.text);
  auto s = eng.stats();
  fmt::print(stderr, "steps={} prefill_tokens={} decode_tokens={} forward={:.3f}s idle={:.3f}s\n", s.steps,
             s.prefill_tokens, s.decode_tokens, s.forward_s, s.idle_s);
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto* g = app.add_subcommand("generate", "generate completions of one prompt");
  auto a = std::make_shared<generate_args>();
  g->add_option("--model", a->model_dir, "checkpoint directory")->required();
  g->add_option("--prompt", a->prompt, "prompt text")->required();
  g->add_option("--n", a->n, "number of samples")->check(CLI::Range(1, 1024));
  g->add_option("--max-tokens", a->max_tokens, "tokens to generate per sample")->check(CLI::Range(1, 1 << 20));
  g->add_option("--temperature", a->temperature, "0 = greedy");
  g->add_option("--top-p", a->top_p, "nucleus mass");
  g->add_option("--top-k", a->top_k, "top-k (0 = off)");
  g->add_option("--seed", a->seed, "seed of sample 0 (sample i uses seed + i)");
  add_kv_dtype_option(*g, a->kv, "the KV cache's stored form (default bf16, as shoald)");
  g->add_option("--cache-mib", a->cache_mib, "block cache memory");
  g->add_flag("--batch-invariant", a->invariant, "fixed-order kernels (same tokens whatever the batch)");
  g->add_option("--cost-model", a->cost_model, "fitted prefill cost model (from shoal bench fit-cost)");
  g->add_option("--step-ms", a->step_ms, "step time budget for prefill chunks, with --cost-model");
  g->callback([a] { set_exit_code(run_generate(*a)); });
}

}  // namespace shoal::tools
