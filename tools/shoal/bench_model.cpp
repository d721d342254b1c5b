// `shoal bench fit-cost`: measures prefill chunk times t(n, p) through the forward pass and
// fits the scheduler's cost model t = a + b·n + c·n·p + d·n², saved per preset + machine;
// with --decode, decode steps of B sequences p tokens deep (the simulator's decode profile).
// `shoal bench replay`: logit divergence (max abs, KL) of bounded replay vs exact
// reconstruction over random prompts.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <cmath>
#include <random>

#include "kernels/cpu/thread_pool.hpp"
#include "model/forward.hpp"
#include "model/generate.hpp"
#include "runtime/core/cost_model.hpp"
#include "runtime/engine/engine.hpp"
#include "tools/shoal/bench_util.hpp"
#include "tools/shoal/commands.hpp"

namespace shoal::tools {
namespace {

std::shared_ptr<model::model_weights> preset_weights(const std::string& preset) {
  auto w = std::make_shared<model::model_weights>();
  auto cfg = model::preset_config(preset);
  if (!cfg) throw std::runtime_error(cfg.error().message);
  w->config = *cfg;
  w->config.vocab_size = preset == "small" ? 129280 : 300;
  w->config.eos_token_id = 1;
  model::init_random(*w, 0);
  return w;
}

std::vector<int32_t> random_prompt(size_t n, uint32_t seed, int32_t vocab) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(2 + rng() % static_cast<uint32_t>(vocab - 2));
  return t;
}

// A sequence over private paged memory of `blocks` blocks in format `kv`.
struct bench_sequence {
  std::unique_ptr<model::kv_pages> pages;
  model::sequence_cache cache;
  bench_sequence(const model::model_config& c, int64_t blocks, model::kv_dtype kv)
      : pages(std::make_unique<model::kv_pages>(model::kv_format_of(c, kv), static_cast<int32_t>(blocks))) {
    cache.init(c, std::max<int64_t>(model::min_ring_tokens(c), c.window()), kv);
    cache.pages = pages.get();
    for (int64_t b = 0; b < blocks; ++b) cache.blocks.push_back(static_cast<int32_t>(b));
  }
};

// Seconds to compute a chunk of n tokens after p computed ones (median of reps).
double time_chunk(const model::model_weights& w, int64_t n, int64_t p, int reps, const model::forward_options& o,
                  model::kv_dtype kv) {
  const auto& c = w.config;
  auto tokens = random_prompt(static_cast<size_t>(n + p), 7, static_cast<int32_t>(std::min<int64_t>(c.vocab_size, 5000)));
  int64_t blocks = (n + p) / c.block_size + 1;
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    bench_sequence seq(c, blocks, kv);
    model::sequence_cache& cache = seq.cache;
    int64_t dec_from = std::max<int64_t>(0, n + p - c.replay_tokens);
    for (int64_t pos = 0; pos < p; pos += 2048) {
      model::forward_item it{&cache, std::span<const int32_t>(tokens).subspan(pos, std::min<int64_t>(2048, p - pos)),
                             dec_from, 0, false, false, {}};
      model::forward(w, std::span<model::forward_item>(&it, 1), o);
    }
    model::forward_item it{&cache, std::span<const int32_t>(tokens).subspan(p, n), dec_from, 0, true, false, {}};
    double t0 = now_s();
    model::forward(w, std::span<model::forward_item>(&it, 1), o);
    t.push_back(now_s() - t0);
  }
  return median(t);
}

// Seconds of one decode step of `batch` sequences, each `p` tokens deep (median of reps): the
// sequences are prefilled once, then each rep decodes one token at position p of every one.
double time_decode(const model::model_weights& w, int64_t batch, int64_t p, int reps, const model::forward_options& o,
                   model::kv_dtype kv) {
  const auto& c = w.config;
  const int64_t blocks = (p + 1) / c.block_size + 1;
  std::vector<bench_sequence> seqs;
  std::vector<std::vector<int32_t>> tokens;
  for (int64_t b = 0; b < batch; ++b) {
    tokens.push_back(random_prompt(static_cast<size_t>(p + 1), static_cast<uint32_t>(11 + b),
                                   static_cast<int32_t>(std::min<int64_t>(c.vocab_size, 5000))));
    auto& cache = seqs.emplace_back(c, blocks, kv).cache;
    for (int64_t pos = 0; pos < p; pos += 2048) {
      model::forward_item it{&cache, std::span<const int32_t>(tokens[b]).subspan(pos, std::min<int64_t>(2048, p - pos)),
                             0, 0, false, false, {}};
      model::forward(w, std::span<model::forward_item>(&it, 1), o);
    }
  }
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    std::vector<model::forward_item> items;
    for (int64_t b = 0; b < batch; ++b) {
      seqs[b].cache.computed = p;  // decode the same position again
      items.push_back({&seqs[b].cache, std::span<const int32_t>(tokens[b]).subspan(p, 1), 0, 0, true, false, {}});
    }
    double t0 = now_s();
    model::forward(w, items, o);
    t.push_back(now_s() - t0);
  }
  return median(t);
}

// The weights to time: the checkpoint in `model_dir` as shoald loads it (its linears in the
// precision the file stores, so the fit times the kernels a node serving it runs), else the
// preset's shape with random fp32 weights.
std::shared_ptr<model::model_weights> fit_weights(const std::string& preset, const std::string& model_dir) {
  if (model_dir.empty()) return preset_weights(preset);
  auto w = model::load_weights(model_dir, model::print_load_progress);
  if (!w) throw std::runtime_error(w.error().message);
  return std::make_shared<model::model_weights>(std::move(*w));
}

int run_fit_cost(const std::string& preset, const std::string& model_dir, const std::string& dir, int reps, bool decode,
                 int threads, bool blas, model::kv_dtype kv) {
  if (threads > 0) kernels::set_num_threads(threads);  // the fit's machine id says how many
  // shoald always runs the batch-invariant kernels (tools/shoald/engine_options.hpp): fit
  // those unless asked for the BLAS ones of the offline engine, a different cost model.
  model::forward_options fo;
  fo.batch_invariant = !blas;
  auto w = fit_weights(preset, model_dir);
  std::vector<runtime::cost_sample> samples;
  if (decode) {  // samples (n = batch, p = context): t = a + b·B + c·B·p + d·B², ΣKV = B·p
    std::vector<int64_t> bs = {1, 4, 16}, ps = {64, 512, 1024};
    if (preset != "small") ps = {16, 64, 256};
    for (int64_t p : ps)
      for (int64_t b : bs) {
        double t = time_decode(*w, b, p, reps, fo, kv);
        samples.push_back({b, p, t});
        fmt::print("decode batch={:3d} context={:5d}: {:.4f} s\n", b, p, t);
      }
  } else {
    std::vector<int64_t> ns = {16, 64, 256, 1024}, ps = {0, 512, 2048};
    if (preset != "small") ns = {4, 16, 64, 256}, ps = {0, 64, 256};
    for (int64_t p : ps)
      for (int64_t n : ns) {
        double t = time_chunk(*w, n, p, reps, fo, kv);
        samples.push_back({n, p, t});
        fmt::print("n={:5d} p={:5d}: {:.4f} s\n", n, p, t);
      }
  }
  auto m = runtime::cost_model::fit(samples);
  if (!m) {
    fmt::print(stderr, "shoal bench fit-cost: {}\n", m.error());
    return 1;
  }
  m->set_preset((decode ? preset + "-decode" : preset) + (blas ? "-blas" : ""));
  m->set_machine(runtime::machine_id());
  auto path = runtime::save_cost_model(dir, *m);
  if (!path) {
    fmt::print(stderr, "shoal bench fit-cost: {}\n", path.error());
    return 1;
  }
  fmt::print("fitted {} (R² {:.4f}); saved to {}\n", m->to_json(), m->quality().r2, *path);
  return 0;
}

std::vector<double> softmax(const std::vector<float>& l) {
  double mx = *std::max_element(l.begin(), l.end()), s = 0;
  std::vector<double> p(l.size());
  for (size_t k = 0; k < l.size(); ++k) s += (p[k] = std::exp(l[k] - mx));
  for (auto& x : p) x /= s;
  return p;
}

std::vector<float> next_logits(runtime::engine& e, const std::vector<int32_t>& prompt) {
  runtime::sampling_params p;
  p.max_tokens = 1;
  auto id = e.add_request(prompt, p);
  std::vector<float> out;
  while (e.has_work())
    for (auto& ev : e.step())
      if (ev.id == *id) out = ev.logits;
  return out;
}

int run_replay(const std::string& preset, int prompts, const std::string& out) {
  auto w = preset_weights(preset);
  const auto& c = w->config;
  std::vector<double> kls, maxabs;
  int64_t head_len = 4 * c.block_size * 2, extra = c.replay_tokens;
  for (int i = 0; i < prompts; ++i) {
    auto prompt = random_prompt(static_cast<size_t>(head_len + extra + i % c.block_size), 1000 + i,
                                static_cast<int32_t>(std::min<int64_t>(c.vocab_size, 5000)));
    runtime::engine_config ec;
    ec.cache.num_blocks = static_cast<int64_t>(prompt.size()) / c.block_size * 2 + 8;
    ec.capture_logits = true;
    ec.cache.exact_swa = true;
    runtime::engine exact(w, ec);
    auto ref = next_logits(exact, prompt);
    ec.cache.exact_swa = false;
    ec.cache.swa_snapshots = 0;  // force replay on the hit
    runtime::engine rep(w, ec);
    next_logits(rep, std::vector<int32_t>(prompt.begin(), prompt.begin() + head_len));
    auto got = next_logits(rep, prompt);
    auto p = softmax(ref), q = softmax(got);
    double kl = 0, mabs = 0;
    for (size_t k = 0; k < p.size(); ++k) {
      kl += p[k] * std::log(p[k] / q[k]);
      mabs = std::max(mabs, double(std::fabs(ref[k] - got[k])));
    }
    kls.push_back(kl);
    maxabs.push_back(mabs);
  }
  auto mx = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  double mean_kl = 0;
  for (double k : kls) mean_kl += k / kls.size();
  fmt::print("bounded replay vs exact, {} prompts ({}): KL mean {:.5f} median {:.5f} max {:.5f}; "
             "max |Δlogit| median {:.4f} max {:.4f}\n",
             prompts, preset, mean_kl, median(kls), mx(kls), median(maxabs), mx(maxabs));
  nlohmann::json rec = machine_facts();
  rec.update({{"bench", "replay"}, {"preset", preset}, {"prompts", prompts}, {"kl_mean", mean_kl},
              {"kl_median", median(kls)}, {"kl_max", mx(kls)}, {"max_abs_median", median(maxabs)},
              {"max_abs_max", mx(maxabs)}});
  append_jsonl(out, rec);
  return 0;
}

}  // namespace

void add_model_benches(CLI::App& bench) {
  auto* fit = bench.add_subcommand("fit-cost", "fit the prefill chunk cost model for this machine");
  auto preset = std::make_shared<std::string>("small");
  auto model_dir = std::make_shared<std::string>();
  auto dir = std::make_shared<std::string>("bench/cost-models");
  auto reps = std::make_shared<int>(3);
  auto decode = std::make_shared<bool>(false);
  auto threads = std::make_shared<int>(0);
  auto blas = std::make_shared<bool>(false);
  auto kv = std::make_shared<model::kv_dtype>(model::kv_dtype::bf16);
  add_kv_dtype_option(*fit, *kv, "the KV cache's stored form (default bf16, shoald's)");
  fit->add_option("--preset", *preset,
                  "tiny | small | v3-tiny: the shape (random fp32 weights), the sample sizes and the name of the fit; "
                  "with --model, the sample sizes and the name only");
  fit->add_option("--model", *model_dir,
                  "time this checkpoint as shoald loads it (bf16 / FP8 linears stay so) instead of the preset's random "
                  "fp32 weights")
      ->check(CLI::ExistingDirectory);
  fit->add_flag("--decode", *decode,
                "fit decode steps instead (n = batch, p = context: cost-<preset>-decode-<machine>.json), the "
                "simulator's decode profile");
  fit->add_option("--dir", *dir, "where cost-<preset>-<machine>.json is written");
  fit->add_option("--reps", *reps, "repetitions per point (median)");
  fit->add_option("--threads", *threads, "compute threads, as engine.threads (default: one per CPU)")
      ->check(CLI::Range(1, 1024));
  fit->add_flag("--blas", *blas,
                "time the OpenBLAS kernels of the offline engine (batch_invariant off: cost-<preset>-blas-...) "
                "instead of the batch-invariant ones every shoald engine runs");
  fit->callback([=] {
    try {
      set_exit_code(run_fit_cost(*preset, *model_dir, *dir, *reps, *decode, *threads, *blas, *kv));
    } catch (const std::exception& e) {
      fmt::print(stderr, "shoal bench fit-cost: {}\n", e.what());
      set_exit_code(1);
    }
  });
  auto* rep = bench.add_subcommand("replay", "bounded replay vs exact reconstruction divergence");
  auto rpreset = std::make_shared<std::string>("tiny");
  auto n = std::make_shared<int>(100);
  auto out = std::make_shared<std::string>("bench/results/replay.jsonl");
  rep->add_option("--preset", *rpreset, "tiny | small");
  rep->add_option("--prompts", *n, "number of random prompts");
  rep->add_option("--out", *out, "JSONL output");
  rep->callback([=] {
    try {
      set_exit_code(run_replay(*rpreset, *n, *out));
    } catch (const std::exception& e) {
      fmt::print(stderr, "shoal bench replay: {}\n", e.what());
      set_exit_code(1);
    }
  });
}

}  // namespace shoal::tools
