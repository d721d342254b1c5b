// `shoal bench engine`: prefill tokens/s (batch 1) and decode tokens/s (batch 1, 8, 32) of
// the engine, with their limits measured in the same run: the OpenBLAS sgemm peak and the
// bf16 GEMM rate of the engine's matmul_bf16 at the model's shapes, the memory read bandwidth (streaming sum; and a triad) against the bytes of
// weights one decode token reads, and the peak RSS after loading against the checkpoint's
// size. Also the exposed scheduling overhead (compute thread idle between steps) as % of
// step time, with async and synchronous scheduling.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "model/forward.hpp"
#include "model/generate.hpp"
#include "runtime/engine/engine_setup.hpp"
#include "tools/shoal/bench_util.hpp"
#include "tools/shoal/commands.hpp"

namespace shoal::tools {
namespace {

struct engine_args {
  std::string preset = "small", model_dir, out = "bench/results/engine.jsonl";
  int64_t prompt_len = 1024;
  int reps = 3;
  int decode_tokens = 32;
  std::vector<int> batches = {1, 8, 32};
  int threads = 0;  // 0 = all cores
  std::vector<std::string> kv_dtypes = {"fp32", "bf16", "fp8"};
  model::kv_dtype kv = model::kv_dtype::bf16;  // the engine runs' cache
  int64_t kv_context = 2048;
  std::vector<int> kv_batches = {1, 32};
};

std::shared_ptr<const model::model_weights> bench_weights(const engine_args& a) {
  if (!a.model_dir.empty()) {
    auto m = runtime::load_model_dir(a.model_dir, true);
    if (!m) throw std::runtime_error(m.error().message);
    return m->weights;
  }
  auto w = std::make_shared<model::model_weights>();
  w->config = *model::preset_config(a.preset);
  w->config.vocab_size = a.preset == "small" || a.preset == "v3-small" ? 129280 : 300;
  w->config.eos_token_id = 1;
  model::init_random(*w, 0);
  return w;
}

// Bytes of weights one decode token reads at batch 1, as stored in memory: every projection
// of every layer (for MoE layers the router, num_experts_per_tok routed experts of average
// size and the shared expert), kv_b and the transposed W_UK of the absorbed attention, the
// vocabulary head and one embedding row. Norms are left out (tiny).
double weight_bytes_per_token(const model::model_weights& w) {
  const auto& c = w.config;
  double bytes = 0;
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const auto& l = w.layers[i];
    for (const model::linear* p : {&l.attn.q_proj, &l.attn.q_a, &l.attn.q_b, &l.attn.kv_a, &l.attn.kv_b, &l.attn.o_proj})
      bytes += static_cast<double>(p->bytes());
    bytes += static_cast<double>(l.attn.w_uk_t.bytes());
    const auto& f = l.ffn;
    if (!f.moe) {
      bytes += static_cast<double>(f.dense.gate_up.bytes() + f.dense.down.bytes());
      continue;
    }
    double experts = 0;
    for (const auto& e : f.experts) experts += static_cast<double>(e.gate_up.bytes() + e.down.bytes());
    bytes += static_cast<double>(f.router.bytes()) + experts / std::max<size_t>(1, f.experts.size()) * c.num_experts_per_tok +
             static_cast<double>(f.shared.gate_up.bytes() + f.shared.down.bytes());
  }
  bytes += static_cast<double>(w.decoder_kv.kv_a.bytes());
  return bytes + static_cast<double>(w.lm_head.bytes()) + static_cast<double>(c.hidden_size) * sizeof(float);
}

// Multiply-adds ×2 of one token through a layer's projections and FFN (GEMM work).
double layer_gemm_flops(const model::model_config& c, int64_t layer, bool compresses) {
  double d = c.hidden_size, H = c.num_attention_heads, qk = c.qk_head_dim(), f = 0;
  f += c.q_lora_rank > 0 ? d * c.q_lora_rank + c.q_lora_rank * H * qk : d * H * qk;
  f += d * c.entry_dim() + H * c.v_head_dim * d + (compresses ? d : 0);
  if (c.is_moe_layer(layer))
    f += d * c.n_routed_experts + 3.0 * d * c.moe_intermediate_size * (c.num_experts_per_tok + c.n_shared_experts);
  else
    f += 3.0 * d * c.intermediate_size;
  return 2 * f;
}

// Absorbed attention work of one query seeing `keys` entries.
double attn_flops(const model::model_config& c, double keys) {
  double H = c.num_attention_heads, r = c.kv_lora_rank;
  return 2 * H * (keys * (r + c.qk_rope_head_dim) + keys * r + c.qk_nope_head_dim * r + c.v_head_dim * r);
}

// Entries query t sees when raw windows are truncated at `floor` (0 = none).
double visible_keys(const model::model_config& c, int64_t t, int64_t floor = 0) {
  int64_t W = c.window(), start = t - W + 1;
  return static_cast<double>(std::min<int64_t>(t - floor + 1, W) + (start > 0 ? start / c.ratio() : 0));
}

// FLOPs of prefilling n tokens with the decoder tail `tail`, logits at the last position.
double prefill_flops(const model::model_config& c, int64_t n, int64_t tail) {
  double f = 0;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t l = 0; l < c.encoder_layers(); ++l)
      f += layer_gemm_flops(c, l, c.is_flash()) + attn_flops(c, visible_keys(c, t));
    if (c.is_flash()) f += 2.0 * c.hidden_size * (c.entry_dim() + 1);
    if (t >= n - tail)
      for (int64_t j = 0; j < c.decoder_layers(); ++j)
        f += layer_gemm_flops(c, c.encoder_layers() + j, false) + attn_flops(c, visible_keys(c, t, n - tail));
  }
  return f + 2.0 * c.hidden_size * c.vocab_size;
}

struct decode_result {
  double tokens_per_s = 0, steps_per_s = 0, overhead = 0;
};

decode_result bench_decode(std::shared_ptr<const model::model_weights> w, int batch, int tokens, bool async,
                           model::kv_dtype kv) {
  auto cfg = runtime::default_engine_config(w->config, 1024, kv);
  cfg.async_scheduling = async;
  runtime::engine e(w, cfg);
  runtime::sampling_params p;
  p.max_tokens = tokens;
  p.ignore_eos = true;
  for (int i = 0; i < batch; ++i) {
    std::vector<int32_t> prompt(64);
    for (int k = 0; k < 64; ++k) prompt[k] = (i * 131 + k * 7) % 1000 + 2;
    (void)e.add_request(prompt, p);
  }
  // Warm-up: until every request has finished its prefill and taken a few decode steps.
  for (int s = 0; s < 4 && e.has_work(); ++s) e.step();
  auto s0 = e.stats();
  double t0 = now_s();
  int64_t steps = 0;
  while (e.has_work()) {
    e.step();
    ++steps;
  }
  double t = now_s() - t0;
  auto s1 = e.stats();
  double busy = s1.forward_s - s0.forward_s, idle = s1.idle_s - s0.idle_s;
  return {static_cast<double>(s1.decode_tokens - s0.decode_tokens) / t, steps / t, idle / std::max(1e-9, busy + idle)};
}

// One decode step of `batch` sequences `context` tokens deep whose caches are in format `kv`
// (seconds, median of reps): the forward pass alone over paged memory filled with random
// entries of the format (decode cost does not depend on the values), so a 2,048-token context
// needs no prefill. `invariant`: shoald's batch-invariant kernels (one query at a time, each
// entry read in its stored form) or the offline engine's tiled GEMMs.
double decode_in_format(const model::model_weights& w, model::kv_dtype kv, int batch, int64_t context, int reps,
                        bool invariant) {
  const auto& c = w.config;
  const model::kv_format f = model::kv_format_of(c, kv);
  const int64_t per_seq = context / c.block_size + 1;
  model::kv_pages pages(f, static_cast<int32_t>(per_seq * batch));
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  {  // one random block, copied into every block
    std::vector<float> e(static_cast<size_t>(f.latent + f.rope));
    for (int64_t i = 0; i < f.entries(); ++i) {
      for (auto& x : e) x = normal(rng);
      model::encode_entry(f, e.data(), pages.block(0) + i * f.entry_bytes());
    }
    for (int32_t b = 1; b < pages.num_blocks(); ++b) std::memcpy(pages.block(b), pages.block(0), f.block_bytes());
  }
  std::vector<model::sequence_cache> caches(static_cast<size_t>(batch));
  std::vector<int32_t> tokens(static_cast<size_t>(batch));
  for (int b = 0; b < batch; ++b) {
    auto& cache = caches[b];
    cache.init(c, std::max<int64_t>(model::min_ring_tokens(c), c.window()), kv);
    cache.pages = &pages;
    for (int64_t k = 0; k < per_seq; ++k) cache.blocks.push_back(static_cast<int32_t>(b * per_seq + k));
    std::vector<float> e(static_cast<size_t>(c.entry_dim() + 1));
    for (size_t st = 0; st < cache.rings.size(); ++st)
      for (int64_t pos = 0; pos < cache.ring_tokens && !cache.rings[st].empty(); ++pos) {
        for (auto& x : e) x = normal(rng);
        cache.ring_write(static_cast<int64_t>(st), pos, e.data());
      }
    tokens[b] = static_cast<int32_t>(2 + b % 250);
  }
  model::forward_options o;
  o.batch_invariant = invariant;
  std::vector<double> t;
  for (int r = 0; r < reps + 1; ++r) {
    std::vector<model::forward_item> items;
    for (int b = 0; b < batch; ++b) {
      caches[b].computed = context;  // decode the same position again
      items.push_back({&caches[b], std::span<const int32_t>(&tokens[b], 1), 0, 0, true, false, {}});
    }
    double t0 = now_s();
    model::forward(w, items, o);
    if (r > 0) t.push_back(now_s() - t0);
  }
  return median(t);
}

// The KV formats at this model's shape: bytes per token per layer, tokens a GiB holds, and
// decode tok/s with a `kv_context`-token context.
void bench_kv_formats(const model::model_weights& w, const engine_args& a, const nlohmann::json& base) {
  const auto& c = w.config;
  const double fp32_bytes = static_cast<double>(model::kv_format_of(c, model::kv_dtype::fp32).entry_bytes());
  fmt::print("KV formats ({} + {} values an entry, {} cache layers, 1 entry per {} token(s)); decode with a {}-token "
             "context, forward pass only:\n",
             c.kv_lora_rank, c.qk_rope_head_dim, c.cache_layers(), c.ratio(), a.kv_context);
  for (const auto& name : a.kv_dtypes) {
    const model::kv_dtype kv = *model::parse_kv_dtype(name);
    const model::kv_format f = model::kv_format_of(c, kv);
    // One token adds 1/ratio entry to each cache layer.
    const double per_token_layer = static_cast<double>(f.entry_bytes()) / static_cast<double>(c.ratio());
    const double tokens_per_gib = 1073741824.0 / (per_token_layer * static_cast<double>(c.cache_layers()));
    std::string line = fmt::format("  {:>4}: {:7.1f} B per token per layer ({:.3f}x fp32), {:>9.0f} tokens per GiB",
                                   name, per_token_layer, static_cast<double>(f.entry_bytes()) / fp32_bytes, tokens_per_gib);
    nlohmann::json r = base;
    r.update({{"point", "kv_format"}, {"kv_dtype", name}, {"bytes_per_token_per_layer", per_token_layer},
              {"ratio_to_fp32", static_cast<double>(f.entry_bytes()) / fp32_bytes}, {"tokens_per_gib", tokens_per_gib},
              {"context", a.kv_context}});
    for (int b : a.kv_batches)
      for (bool invariant : {true, false}) {
        const double s = decode_in_format(w, kv, b, a.kv_context, a.reps, invariant);
        line += fmt::format("; b{} {}: {:.1f} tok/s", b, invariant ? "shoald" : "offline", b / s);
        r[fmt::format("decode_b{}_{}_tokens_per_s", b, invariant ? "invariant" : "tiled")] = b / s;
      }
    fmt::print("{}\n", line);
    append_jsonl(a.out, r);
  }
  fmt::print("  (shoald: the batch-invariant kernels every daemon runs, entries read in their stored form; offline: "
             "the tiled GEMM path)\n");
}

int run_engine_bench(const engine_args& a) {
  if (a.threads > 0) kernels::set_num_threads(a.threads);
  auto w = bench_weights(a);
  const auto& c = w->config;
  const int64_t rss = peak_rss_bytes(), ckpt = checkpoint_bytes(a.model_dir);  // before the benches' buffers
  nlohmann::json base = machine_facts();
  base["bench"] = "engine";
  base["preset"] = a.model_dir.empty() ? a.preset : a.model_dir;
  base["threads"] = kernels::num_threads();
  base["kv_dtype"] = std::string(model::to_string(a.kv));
  fmt::print("cpu: {}; kernels {}; {} threads\n", base["cpu"].get<std::string>(), kernels::isa_summary(),
             kernels::num_threads());
  if (ckpt > 0)
    fmt::print("peak RSS after loading: {:.3f} GB = {:.2f}x the checkpoint's {:.3f} GB\n", rss / 1e9,
               double(rss) / double(ckpt), ckpt / 1e9);
  else
    fmt::print("peak RSS after building the preset in memory: {:.3f} GB\n", rss / 1e9);
  const memory_bandwidth bw = measure_bandwidth();
  const double per_token = weight_bytes_per_token(*w);
  const double decode_limit = bw.read_gbs * 1e9 / per_token;
  fmt::print("memory bandwidth: read {:.1f} GB/s, triad {:.1f} GB/s; weights read per decode token {:.1f} MB "
             "-> batch-1 decode limit {:.1f} tok/s\n",
             bw.read_gbs, bw.triad_gbs, per_token / 1e6, decode_limit);
  nlohmann::json limits = base;
  limits.update({{"point", "limits"}, {"peak_rss_bytes", rss}, {"checkpoint_bytes", ckpt}, {"read_gbs", bw.read_gbs},
                 {"triad_gbs", bw.triad_gbs}, {"weight_bytes_per_token", per_token},
                 {"decode_limit_tokens_per_s", decode_limit}});
  append_jsonl(a.out, limits);
  if (!a.kv_dtypes.empty()) bench_kv_formats(*w, a, base);
  // GEMM peak at the model's prefill shapes, same thread count.
  double peak = 0;
  int64_t rows = std::min<int64_t>(a.prompt_len, 2048);
  for (auto [m, n, k] : {std::tuple{rows, c.hidden_size, c.hidden_size},
                         {rows / 4, 2 * c.moe_intermediate_size, c.hidden_size},
                         {rows, 2 * c.intermediate_size, c.hidden_size}})
    peak = std::max(peak, gemm_gflops(m, n, k, kernels::num_threads()));
  // bf16 weights at the same shapes: the engine's kernel and the library's, the faster is the peak.
  double ours = 0;
  std::optional<library_gemm> lib;
  for (auto [m, n, k] : {std::tuple{rows, c.hidden_size, c.hidden_size}, {rows, 2 * c.intermediate_size, c.hidden_size}}) {
    ours = std::max(ours, engine_bf16_gemm_gflops(m, n, k));
    if (auto l = onednn_bf16_gemm_gflops(m, n, k, kernels::num_threads()); l && (!lib || l->gflops > lib->gflops))
      lib = std::move(l);
  }
  const double bf16_peak = std::max(ours, lib ? lib->gflops : 0.0);
  fmt::print("GEMM peak (OpenBLAS sgemm, {} threads): {:.1f} GFLOP/s; bf16 weights: matmul_bf16 {:.1f} GFLOP/s, {}; "
             "bf16 GEMM peak {:.1f} ({})\n",
             kernels::num_threads(), peak, ours,
             lib ? fmt::format("{} {:.1f} GFLOP/s", lib->impl, lib->gflops) : std::string("no library bf16 GEMM in this build"),
             bf16_peak, lib && lib->gflops > ours ? "the library's" : "matmul_bf16");
  limits.update({{"point", "bf16_gemm"}, {"matmul_bf16_gflops", ours}, {"library_bf16_gflops", lib ? lib->gflops : 0.0},
                 {"library_bf16_impl", lib ? lib->impl : ""}, {"bf16_gemm_gflops", bf16_peak}});
  append_jsonl(a.out, limits);
  // Prefill, batch 1.
  auto cfg = runtime::default_engine_config(c, 1024, a.kv);
  cfg.cache.prefix_caching = false;
  std::vector<double> times;
  runtime::engine e(w, cfg);  // one engine (its cache memory touched once), prefix caching off
  for (int r = 0; r < a.reps + 1; ++r) {
    std::vector<int32_t> prompt(static_cast<size_t>(a.prompt_len));
    for (int64_t k = 0; k < a.prompt_len; ++k) prompt[k] = static_cast<int32_t>((k * 7919 + r) % 5000 + 2);
    runtime::sampling_params p;
    p.max_tokens = 1;
    (void)e.add_request(prompt, p);
    double t0 = now_s();
    e.run_to_completion();
    if (r > 0) times.push_back(now_s() - t0);
  }
  int64_t tail = c.is_flash() ? (c.swa_mode == "exact" ? model::exact_decoder_tail(c) : c.replay_tokens) : 0;
  double t = median(times), flops = prefill_flops(c, a.prompt_len, tail);
  double pct = flops / t / 1e9 / peak * 100, pct_bf16 = flops / t / 1e9 / bf16_peak * 100;
  fmt::print("prefill  batch 1, {} tokens: {:.0f} tok/s, {:.1f} GFLOP/s = {:.1f}% of the sgemm peak, {:.1f}% of the "
             "bf16 GEMM peak (median of {}, {:.3f}-{:.3f} s)\n",
             a.prompt_len, a.prompt_len / t, flops / t / 1e9, pct, pct_bf16, times.size(),
             *std::min_element(times.begin(), times.end()), *std::max_element(times.begin(), times.end()));
  nlohmann::json rec = base;
  rec.update({{"point", "prefill"}, {"prompt_len", a.prompt_len}, {"seconds", t}, {"tokens_per_s", a.prompt_len / t},
              {"model_gflop", flops / 1e9}, {"gemm_peak_gflops", peak}, {"pct_of_peak", pct},
              {"bf16_gemm_gflops", bf16_peak}, {"pct_of_bf16_peak", pct_bf16}});
  append_jsonl(a.out, rec);
  double batch1 = 0;
  for (int b : a.batches)
    for (bool async : {true, false}) {
      auto d = bench_decode(w, b, a.decode_tokens, async, a.kv);
      if (b == 1 && async) batch1 = d.tokens_per_s;
      std::string vs;
      if (b == 1) vs = fmt::format(", {:.1f}% of the bandwidth limit", d.tokens_per_s / decode_limit * 100);
      else if (batch1 > 0) vs = fmt::format(", {:.2f}x batch 1", d.tokens_per_s / batch1);
      fmt::print("decode   batch {:2d} ({}): {:.1f} tok/s{}, {:.1f} steps/s, exposed scheduling overhead {:.2f}% of step time\n",
                 b, async ? "async" : "sync ", d.tokens_per_s, vs, d.steps_per_s, d.overhead * 100);
      nlohmann::json r2 = base;
      r2.update({{"point", "decode"}, {"batch", b}, {"async", async}, {"tokens_per_s", d.tokens_per_s},
                 {"steps_per_s", d.steps_per_s}, {"exposed_overhead_pct", d.overhead * 100}});
      if (b == 1) r2["pct_of_bandwidth_limit"] = d.tokens_per_s / decode_limit * 100;
      else if (batch1 > 0) r2["ratio_to_batch1"] = d.tokens_per_s / batch1;
      append_jsonl(a.out, r2);
    }
  fmt::print("records appended to {}\n", a.out);
  return 0;
}

}  // namespace

void add_engine_bench(CLI::App& bench) {
  auto* b = bench.add_subcommand("engine", "prefill/decode throughput vs the measured GEMM peak");
  auto a = std::make_shared<engine_args>();
  b->add_option("--preset", a->preset, "tiny | small | v3-tiny | v3-small (random fp32 weights in memory)");
  b->add_option("--model", a->model_dir, "checkpoint directory instead of a preset");
  b->add_option("--prompt-len", a->prompt_len, "prefill tokens");
  b->add_option("--reps", a->reps, "repetitions (median reported)");
  b->add_option("--decode-tokens", a->decode_tokens, "tokens generated per request in the decode runs");
  b->add_option("--batches", a->batches, "decode batch sizes");
  b->add_option("--out", a->out, "JSONL output");
  b->add_option("--threads", a->threads, "worker threads (0 = all cores)");
  add_kv_dtype_option(*b, a->kv, "the KV cache of the prefill and decode runs (default bf16, shoald's)");
  b->add_option("--kv-dtypes", a->kv_dtypes, "KV formats compared (bytes, tokens per GiB, decode at --kv-context)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp8"}));
  b->add_option("--kv-context", a->kv_context, "context of the KV-format decode runs")->check(CLI::Range(1, 1 << 20));
  b->add_option("--kv-batches", a->kv_batches, "batch sizes of the KV-format decode runs")->check(CLI::Range(1, 4096));
  b->callback([a] {
    try {
      set_exit_code(run_engine_bench(*a));
    } catch (const std::exception& e) {
      fmt::print(stderr, "shoal bench engine: {}\n", e.what());
      set_exit_code(1);
    }
  });
}

}  // namespace shoal::tools
