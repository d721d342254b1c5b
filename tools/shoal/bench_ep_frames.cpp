// `shoal bench ep-frames`: the same load on a loopback expert-parallel cluster (a gateway and
// two engine processes whose ranks form one EP group) twice, once with the dispatch/combine
// bytes inside CAF messages (engine.ep_frames = "caf") and once over libfabric
// (engine.ep_frames = "transport", engine.transport), and the engines' mean step time of each
// from their Prometheus counters: the step time before/after moving frames to the transport,
// in one run.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "actors/http_client.hpp"
#include "tools/shoal/bench_util.hpp"
#include "tools/shoal/commands.hpp"

namespace shoal::tools {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct ep_frames_args {
  std::string model_dir = "models/small";
  int ranks = 1;            // per engine node
  int requests = 16;        // at once
  int prompt_words = 200;   // distinct words per prompt (no prefix-cache hits)
  int max_tokens = 32;
  std::string transport = "tcp;ofi_rxm";
  int64_t bulk_min = 16 << 10;
  std::string work_dir = "bench/results/ep-frames";
  std::string out = "bench/results/ep_frames.jsonl";
};

constexpr uint16_t http_port = 8050, metrics_a = 7620, metrics_b = 7621;

void write_configs(const fs::path& dir, const fs::path& model, const ep_frames_args& a, const std::string& frames) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string cluster = "[cluster]\nheartbeat_interval_ms = 500\nconnection_timeout_ms = 3000\n";
  std::ofstream(dir / "gateway.toml") << fmt::format(
      "[node]\nname = \"gateway\"\nlisten = \"127.0.0.1:7610\"\nroles = [\"gateway\"]\nmodel_dir = \"{}\"\n"
      "[gateway]\nlisten = \"127.0.0.1:{}\"\n{}seeds = []\n",
      model.string(), http_port, cluster);
  for (int i = 0; i < 2; ++i)
    std::ofstream(dir / fmt::format("engine-{}.toml", "ab"[i])) << fmt::format(
        "[node]\nname = \"engine-{}\"\nlisten = \"127.0.0.1:{}\"\nroles = [\"engine\"]\nmodel_dir = \"{}\"\n"
        "metrics_listen = \"127.0.0.1:{}\"\n"
        "[engine]\nranks = {}\ncache_mib = 256\nexpert_parallel = true\nep_frames = \"{}\"\ntransport = \"{}\"\n"
        "{}{}seeds = [\"127.0.0.1:7610\"]\n",
        "ab"[i], 7611 + i, model.string(), i ? metrics_b : metrics_a, a.ranks, frames, a.transport,
        // the node config refuses a bulk threshold where frames travel inside CAF messages
        frames == "caf" ? std::string() : fmt::format("ep_bulk_min_bytes = {}\n", a.bulk_min), cluster);
}

struct counters {
  double steps = 0, seconds = 0, bulk = 0, inline_ = 0;
  bool ok = true;
};

counters scrape() {
  counters c;
  for (uint16_t port : {metrics_a, metrics_b}) {
    auto r = actors::http_call("127.0.0.1", port, "GET", "/metrics", "");
    if (!r || r->status != 200) {
      c.ok = false;
      continue;
    }
    c.steps += counter_sum(r->body, "shoal_engine_steps_total");
    c.seconds += counter_sum(r->body, "shoal_engine_step_seconds_total");
    c.bulk += counter_sum(r->body, "shoal_ep_frames_sent_total{path=\"bulk\"}");
    c.inline_ += counter_sum(r->body, "shoal_ep_frames_sent_total{path=\"inline\"}");
  }
  return c;
}

int run_ep_frames_bench(const ep_frames_args& a) {
  const fs::path model = fs::absolute(a.model_dir);
  if (!fs::exists(model / "config.json")) {
    fmt::print(stderr, "shoal bench ep-frames: {} holds no checkpoint (config.json)\n", model.string());
    return 2;
  }
  std::mt19937_64 rng(7);
  std::vector<json> bodies;
  for (int i = 0; i < a.requests; ++i) {
    std::string text = fmt::format("Request {}: ", i);
    for (int k = 0; k < a.prompt_words; ++k) text += fmt::format("w{} ", rng() % 90000 + 10000);
    bodies.push_back({{"model", model.filename().string()}, {"prompt", text}, {"max_tokens", a.max_tokens},
                      {"temperature", 0}, {"ignore_eos", true}});
  }
  json base = machine_facts();
  base.update({{"bench", "ep_frames"}, {"model", a.model_dir}, {"ranks_per_node", a.ranks}, {"requests", a.requests},
               {"prompt_words", a.prompt_words}, {"max_tokens", a.max_tokens}, {"transport", a.transport},
               {"bulk_min_bytes", a.bulk_min}});
  fmt::print("{} requests at once ({} words, {} tokens out) on 2 engine processes x {} rank(s), one EP group\n",
             a.requests, a.prompt_words, a.max_tokens, a.ranks);
  std::vector<double> step_s;
  for (const std::string frames : {"caf", "transport"}) {
    const fs::path dir = fs::absolute(a.work_dir) / frames;
    write_configs(dir, model, a, frames);
    if (cluster_up(dir, dir / "state", 300) != 0) return 1;
    const counters before = scrape();
    const double t0 = now_s();
    std::vector<std::thread> clients;
    std::atomic<int> failed{0};
    for (const auto& b : bodies)
      clients.emplace_back([&, b] {
        actors::http_call_options o;
        o.timeout = std::chrono::seconds(600);
        auto r = actors::http_call("127.0.0.1", http_port, "POST", "/v1/completions", b.dump(), o);
        if (!r || r->status != 200) ++failed;
      });
    for (auto& c : clients) c.join();
    const double wall = now_s() - t0;
    const counters after = scrape();
    cluster_down(dir / "state", 60);
    if (!before.ok || !after.ok) {
      fmt::print(stderr, "shoal bench ep-frames: the engines' metrics did not answer\n");
      return 1;
    }
    const double steps = after.steps - before.steps, secs = after.seconds - before.seconds;
    const double per_step = steps > 0 ? secs / steps : 0;
    step_s.push_back(per_step);
    fmt::print("{:>9}: {:.2f} s wall, {:.0f} rank steps, {:.2f} ms/step, {:.1f} output tok/s; frames {:.0f} bulk, "
               "{:.0f} inline; {} failed\n",
               frames, wall, steps, per_step * 1e3, a.requests * a.max_tokens / wall, after.bulk - before.bulk,
               after.inline_ - before.inline_, failed.load());
    json rec = base;
    rec.update({{"frames", frames}, {"wall_s", wall}, {"rank_steps", steps}, {"step_s", per_step},
                {"output_tok_s", a.requests * a.max_tokens / wall}, {"frames_bulk", after.bulk - before.bulk},
                {"frames_inline", after.inline_ - before.inline_}, {"failed", failed.load()}});
    append_jsonl(a.out, rec);
  }
  if (step_s[0] > 0 && step_s[1] > 0)
    fmt::print("mean step time over the transport / inside CAF messages: {:.3f}\n", step_s[1] / step_s[0]);
  fmt::print("records appended to {}\n", a.out);
  return 0;
}

}  // namespace

void add_ep_frames_bench(CLI::App& bench) {
  auto* b = bench.add_subcommand("ep-frames", "EP step time with dispatch/combine frames inside CAF messages vs over "
                                              "libfabric, on a loopback 2-process EP cluster");
  auto a = std::make_shared<ep_frames_args>();
  b->add_option("--model", a->model_dir, "checkpoint directory (MoE)")->capture_default_str();
  b->add_option("--ranks", a->ranks, "ranks per engine node")->check(CLI::Range(1, 8))->capture_default_str();
  b->add_option("--requests", a->requests, "requests sent at once")->check(CLI::Range(1, 4096))->capture_default_str();
  b->add_option("--prompt-words", a->prompt_words, "words per prompt")->check(CLI::Range(1, 100000))->capture_default_str();
  b->add_option("--max-tokens", a->max_tokens, "tokens generated per request")->check(CLI::Range(1, 100000))->capture_default_str();
  b->add_option("--transport", a->transport, "libfabric provider (engine.transport)")->capture_default_str();
  b->add_option("--bulk-min", a->bulk_min, "engine.ep_bulk_min_bytes")->check(CLI::Range(0, 1 << 30))->capture_default_str();
  b->add_option("--work-dir", a->work_dir, "where the two clusters' configs and state go")->capture_default_str();
  b->add_option("--out", a->out, "JSONL records")->capture_default_str();
  b->callback([a] { set_exit_code(run_ep_frames_bench(*a)); });
}

}  // namespace shoal::tools
