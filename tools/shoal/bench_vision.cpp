// `shoal bench vision`: the vision encoder's images/s against the OpenBLAS GEMM peak measured
// in the same run at the encoder's shapes, then one mixed text/image chat load run twice
// against real loopback clusters (`shoal up`), in the same run:
//   inside: a gateway and one colocated engine (CPU 0) that runs the encoder in its own steps;
//   disaggregated: the same plus a vision-encoder worker (`ve` role, CPU 1, beside the
//   gateway) whose rows the engine reads over libfabric.
// Each configuration gets the same requests at the same times (Poisson arrivals at --qps,
// --image-share of them with one distinct image each, so no embedding-cache hit helps either
// side), streamed; TTFT is the time to the first content chunk. Prints text and image TTFT
// p50/p99 of both and the text-TTFT p99 ratio, and appends JSON records.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "actors/http_client.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "model/vision.hpp"
#include "runtime/engine/engine_setup.hpp"
#include "runtime/vision/image.hpp"
#include "tools/shoal/bench_util.hpp"
#include "tools/shoal/commands.hpp"

namespace shoal::tools {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct vision_args {
  std::string model_dir = "models/small-vision";
  int images = 6;           // encoder throughput: images encoded (after one warm-up)
  int requests = 40;        // mixed load
  double qps = 0.5;
  double image_share = 0.5;
  int max_tokens = 8;
  uint64_t seed = 1;
  bool load = true;         // run the mixed load (else the encoder figure only)
  std::string work_dir = "bench/vision-clusters";
  std::string out = "bench/results/vision.jsonl";
};

// Multiply-adds ×2 of one image of `patches` patches through the encoder (MODEL.md §2).
double encoder_flops(const model::model_config& c, double patches) {
  const model::vision_config& v = c.vision;
  const double dv = v.hidden, d = c.hidden_size, pd = 3.0 * v.patch_size * v.patch_size;
  double f = patches * pd * dv;                                              // patch embedding
  f += v.layers * (patches * 4 * dv * dv + patches * 8 * dv * dv + 2 * patches * patches * dv);  // qkvo, MLP, attention
  f += patches * (dv * d + d * d);                                           // projector
  return 2 * f;
}

runtime::rgb_image noise_image(int64_t side, uint64_t seed) {
  runtime::rgb_image img{side, side, std::vector<uint8_t>(static_cast<size_t>(side * side * 3))};
  uint64_t x = seed;
  for (auto& b : img.rgb) b = static_cast<uint8_t>((x = splitmix64(x)) >> 56);
  return img;
}

struct encoder_figure {
  double images_per_s = 0, gflops = 0, peak = 0;
};

encoder_figure bench_encoder(const model::model_weights& w, int images) {
  const model::vision_config& v = w.config.vision;
  const int64_t side = v.image_size, patches = (side / v.patch_size) * (side / v.patch_size);
  encoder_figure f;
  for (auto [m, n, k] : {std::tuple{patches, 3 * v.hidden, v.hidden}, {patches, 4 * v.hidden, v.hidden},
                         {patches, w.config.hidden_size, w.config.hidden_size}})
    f.peak = std::max(f.peak, gemm_gflops(m, n, k, kernels::num_threads()));
  std::vector<runtime::rgb_image> imgs;
  for (int i = 0; i <= images; ++i) imgs.push_back(noise_image(side, 1000 + static_cast<uint64_t>(i)));
  (void)model::encode_image(w, imgs[0].rgb, side, side, false);  // warm-up
  const double t0 = now_s();
  for (int i = 1; i <= images; ++i) (void)model::encode_image(w, imgs[i].rgb, side, side, false);
  const double t = now_s() - t0;
  f.images_per_s = images / t;
  f.gflops = encoder_flops(w.config, static_cast<double>(patches)) * images / t / 1e9;
  return f;
}

// Node configs of one configuration, written to `dir`: gateway on CPU 1, the engine on CPU 0,
// and with `ve` a VE worker on CPU 1.
void write_configs(const fs::path& dir, const fs::path& model, bool ve) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string cluster = "[cluster]\nheartbeat_interval_ms = 500\nconnection_timeout_ms = 3000\n";
  std::ofstream(dir / "gateway.toml") << fmt::format(
      "[node]\nname = \"gateway\"\nlisten = \"127.0.0.1:7500\"\nroles = [\"gateway\"]\nmodel_dir = \"{}\"\ncpus = [1]\n"
      "[gateway]\nlisten = \"127.0.0.1:8030\"\n{}seeds = []\n",
      model.string(), cluster);
  std::ofstream(dir / "engine.toml") << fmt::format(
      "[node]\nname = \"engine\"\nlisten = \"127.0.0.1:7501\"\nroles = [\"engine\"]\nmodel_dir = \"{}\"\ncpus = [0]\n"
      "[engine]\nthreads = 1\ncache_mib = 512\n{}seeds = [\"127.0.0.1:7500\"]\n",
      model.string(), cluster);
  if (ve)
    std::ofstream(dir / "ve.toml") << fmt::format(
        "[node]\nname = \"ve\"\nlisten = \"127.0.0.1:7502\"\nroles = [\"ve\"]\nmodel_dir = \"{}\"\ncpus = [1]\n"
        "{}seeds = [\"127.0.0.1:7500\"]\n",
        model.string(), cluster);
}

struct load_item {
  double arrival = 0;
  bool image = false;
  json body;
};

std::vector<load_item> mixed_load(const vision_args& a, const model::model_config& c, const std::string& model_id) {
  std::mt19937_64 rng(a.seed);
  std::exponential_distribution<double> gap(a.qps);
  std::bernoulli_distribution is_image(a.image_share);
  std::vector<load_item> items;
  double t = 0;
  for (int i = 0; i < a.requests; ++i) {
    load_item it;
    it.arrival = t;
    t += gap(rng);
    it.image = is_image(rng);
    // Distinct text per request, ~60 tokens: no prefix hit past the template.
    std::string text = fmt::format("Request {}: ", i);
    for (int k = 0; k < 40; ++k) text += fmt::format("w{} ", (rng() % 9000) + 1000);
    json content = text;
    if (it.image) {
      const std::string url = runtime::png_data_url(noise_image(c.vision.image_size, a.seed * 7919 + static_cast<uint64_t>(i)));
      content = json::array({{{"type", "image_url"}, {"image_url", {{"url", url}}}},
                             {{"type", "text"}, {"text", text}}});
    }
    it.body = {{"model", model_id}, {"messages", json::array({{{"role", "user"}, {"content", content}}})},
               {"max_tokens", a.max_tokens}, {"temperature", 0}, {"stream", true}};
    items.push_back(std::move(it));
  }
  return items;
}

struct load_result {
  std::vector<double> text_ttft, image_ttft;
  int failed = 0;
  std::string first_error;
};

load_result run_load(const std::vector<load_item>& items) {
  load_result res;
  std::mutex mu;
  std::vector<std::thread> clients;
  const double t0 = now_s() + 0.5;
  for (const load_item& it : items)
    clients.emplace_back([&, p = &it] {
      const double wait = t0 + p->arrival - now_s();
      if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      const double start = now_s();
      double first = -1;
      actors::http_call_options o;
      o.timeout = std::chrono::seconds(600);
      o.on_body = [&](std::string_view chunk) {  // the role chunk comes first; then content
        if (first >= 0) return;
        for (size_t k = chunk.find("\"content\":\""); k != std::string_view::npos; k = chunk.find("\"content\":\"", k + 1))
          if (k + 11 < chunk.size() && chunk[k + 11] != '"') {
            first = now_s();
            return;
          }
        if (chunk.find("\"finish_reason\":\"") != std::string_view::npos) first = now_s();
      };
      auto resp = actors::http_call("127.0.0.1", 8030, "POST", "/v1/chat/completions", p->body.dump(), o);
      std::lock_guard lock(mu);
      if (!resp || resp->status != 200 || first < 0) {
        if (res.failed++ == 0)
          res.first_error = !resp ? resp.error() : fmt::format("HTTP {}: {}", resp->status, resp->body.substr(0, 300));
        return;
      }
      (p->image ? res.image_ttft : res.text_ttft).push_back(first - start);
    });
  for (auto& c : clients) c.join();
  return res;
}

int run_vision_bench(const vision_args& a) {
  auto m = runtime::load_model_dir(a.model_dir, true);
  if (!m) {
    fmt::print(stderr, "shoal bench vision: {}\n", m.error().message);
    return 2;
  }
  const model::model_config& c = m->weights->config;
  if (!c.vision.present) {
    fmt::print(stderr, "shoal bench vision: {} has no vision encoder (shoal mkmodel --preset small --vision --out {})\n",
               a.model_dir, a.model_dir);
    return 2;
  }
  json base = machine_facts();
  base["bench"] = "vision";
  base["model"] = a.model_dir;
  const encoder_figure e = bench_encoder(*m->weights, a.images);
  fmt::print("encoder ({}x{} images, {} patches, {} layers, {} threads): {:.2f} images/s, {:.1f} GFLOP/s = {:.1f}% of "
             "the GEMM peak {:.1f} GFLOP/s (OpenBLAS sgemm at the encoder's shapes)\n",
             c.vision.image_size, c.vision.image_size, model::image_tokens(c.vision, c.vision.image_size, c.vision.image_size),
             c.vision.layers, kernels::num_threads(), e.images_per_s, e.gflops, e.gflops / e.peak * 100, e.peak);
  json rec = base;
  rec.update({{"point", "encoder"}, {"images_per_s", e.images_per_s}, {"gflops", e.gflops},
              {"gemm_peak_gflops", e.peak}, {"pct_of_peak", e.gflops / e.peak * 100}, {"threads", kernels::num_threads()}});
  append_jsonl(a.out, rec);
  if (!a.load) return 0;

  const fs::path model = fs::absolute(a.model_dir);
  const auto items = mixed_load(a, c, model.filename().string());
  const int n_images = static_cast<int>(std::ranges::count(items, true, &load_item::image));
  fmt::print("mixed load: {} chat requests at {} QPS (Poisson, seed {}), {} with one {}x{} image, max_tokens {}\n",
             items.size(), a.qps, a.seed, n_images, c.vision.image_size, c.vision.image_size, a.max_tokens);
  std::vector<std::pair<std::string, load_result>> runs;
  for (bool ve : {false, true}) {
    const std::string name = ve ? "disaggregated" : "inside";
    const fs::path dir = fs::absolute(a.work_dir) / name;
    write_configs(dir, model, ve);
    if (cluster_up(dir, dir / "state", 300) != 0) return 1;
    load_result r = run_load(items);
    cluster_down(dir / "state", 60);
    auto pct = [](const std::vector<double>& v, double q) { return v.empty() ? 0.0 : percentile(v, q); };
    fmt::print("{:>14}: text TTFT p50 {:.3f} s p99 {:.3f} s ({} requests); image TTFT p50 {:.3f} s p99 {:.3f} s ({}); "
               "{} failed{}\n",
               name, pct(r.text_ttft, 0.5), pct(r.text_ttft, 0.99), r.text_ttft.size(), pct(r.image_ttft, 0.5),
               pct(r.image_ttft, 0.99), r.image_ttft.size(), r.failed, r.failed ? " (first: " + r.first_error + ")" : "");
    json lr = base;
    lr.update({{"point", "mixed_load"}, {"config", name}, {"qps", a.qps}, {"requests", a.requests},
               {"image_share", a.image_share}, {"text_ttft_p50_s", pct(r.text_ttft, 0.5)},
               {"text_ttft_p99_s", pct(r.text_ttft, 0.99)}, {"image_ttft_p50_s", pct(r.image_ttft, 0.5)},
               {"image_ttft_p99_s", pct(r.image_ttft, 0.99)}, {"failed", r.failed}});
    append_jsonl(a.out, lr);
    runs.emplace_back(name, std::move(r));
  }
  const auto& in = runs[0].second.text_ttft;
  const auto& dis = runs[1].second.text_ttft;
  if (!in.empty() && !dis.empty())
    fmt::print("text TTFT p99, vision inside the engine / disaggregated: {:.2f}x\n",
               percentile(in, 0.99) / std::max(1e-9, percentile(dis, 0.99)));
  fmt::print("records appended to {}\n", a.out);
  return 0;
}

}  // namespace

void add_vision_bench(CLI::App& bench) {
  auto* b = bench.add_subcommand("vision", "encoder images/s vs the GEMM peak; text TTFT under a mixed text/image "
                                           "load with vision disaggregated vs inside the engine");
  auto a = std::make_shared<vision_args>();
  b->add_option("--model", a->model_dir, "checkpoint with a vision encoder")->capture_default_str();
  b->add_option("--images", a->images, "images the encoder figure times")->capture_default_str();
  b->add_option("--requests", a->requests, "requests of the mixed load")->capture_default_str();
  b->add_option("--qps", a->qps, "mean arrival rate (Poisson)")->capture_default_str();
  b->add_option("--image-share", a->image_share, "fraction of requests with an image")->capture_default_str();
  b->add_option("--max-tokens", a->max_tokens, "max_tokens of every request")->capture_default_str();
  b->add_option("--seed", a->seed, "load seed")->capture_default_str();
  b->add_flag("!--no-load", a->load, "the encoder figure only");
  b->add_option("--work-dir", a->work_dir, "where the two clusters' configs and state go")->capture_default_str();
  b->add_option("--out", a->out, "JSONL records")->capture_default_str();
  b->callback([a] { set_exit_code(run_vision_bench(*a)); });
}

}  // namespace shoal::tools
