// `shoal bench eplb`: expert-parallel load imbalance (slowest rank / mean, MISSION.md's measure)
// on real routing: the ESFT traces' top-6 decisions of a 64-expert model on four tasks
// (../shared/traces/esft-expert-routing). For the prefill preset (4 redundant experts per rank,
// EP 2/4/8) and the decode preset (1 per rank, EP 8/16/64, simulated) it reports, per layer
// averaged and at the worst layer: no redundancy (contiguous experts), EPLB's placement and the
// refined one. "in-sample": planned and measured on the same tokens (how eplb_golden.json
// measures); "held-out": planned on the first half of each task's sequences and measured on
// the second, as a deployment plans on a past window and serves the next.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <cstdio>
#include <filesystem>
#include <numeric>
#include <sstream>

#include "model/weights.hpp"
#include "runtime/placement/eplb.hpp"
#include "runtime/ep/expert_residency.hpp"
#include "tools/shoal/bench_util.hpp"
#include "tools/shoal/commands.hpp"

namespace shoal::tools {

namespace {

namespace fs = std::filesystem;

struct eplb_args {
  std::string dir = "../shared/traces/esft-expert-routing";
  std::string out = "bench/results/eplb.jsonl";
};

constexpr int64_t layers = 26, experts = 64, top_k = 6;

// Per sequence, per layer, per expert: routed token slots. From expert_weights_<L>.txt.xz
// (one line per sequence: the 6 expert ids of each token, a blank field, the gate weights).
std::expected<std::vector<std::vector<double>>, std::string> read_routing(const fs::path& task) {
  std::vector<std::vector<double>> seqs;  // [sequence][layer · experts + expert]
  for (int64_t l = 0; l < layers; ++l) {
    const fs::path f = task / ("expert_weights_" + std::to_string(l + 1) + ".txt.xz");
    if (!fs::exists(f)) return std::unexpected("missing " + f.string());
    FILE* p = popen(("xz -dc '" + f.string() + "'").c_str(), "r");
    if (!p) return std::unexpected("cannot run xz on " + f.string());
    std::string text;
    char buf[1 << 16];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) text.append(buf, n);
    if (pclose(p) != 0) return std::unexpected("xz failed on " + f.string());
    std::istringstream in(text);
    size_t s = 0;
    for (std::string line; std::getline(in, line); ++s) {
      if (seqs.size() <= s) seqs.emplace_back(static_cast<size_t>(layers * experts), 0.0);
      const std::string ids = line.substr(0, line.find("\t\t"));
      std::istringstream fields(ids);
      int64_t n = 0;
      for (std::string id; std::getline(fields, id, '\t'); ++n) {
        const long e = std::strtol(id.c_str(), nullptr, 10);
        if (e < 0 || e >= experts) return std::unexpected(f.string() + ": expert id " + id + " out of range");
        seqs[s][static_cast<size_t>(l * experts + e)] += 1;
      }
      if (n % top_k != 0) return std::unexpected(f.string() + ": a sequence's ids are not a multiple of " + std::to_string(top_k));
    }
  }
  return seqs;
}

std::vector<double> sum(const std::vector<std::vector<double>>& seqs, size_t from, size_t to) {
  std::vector<double> w(static_cast<size_t>(layers * experts), 0.0);
  for (size_t s = from; s < to; ++s)
    for (size_t i = 0; i < w.size(); ++i) w[i] += seqs[s][i];
  return w;
}

struct figure {
  double mean = 0, worst = 0;
};
figure summarize(const std::vector<double>& per_layer) {
  figure f;
  for (double v : per_layer) f.mean += v, f.worst = std::max(f.worst, v);
  f.mean /= static_cast<double>(per_layer.size());
  return f;
}

int run_eplb_bench(const eplb_args& a) {
  struct cfg {
    const char* preset;
    int64_t ep, redundant_per_rank;
  };
  const cfg cfgs[] = {{"prefill", 2, 4}, {"prefill", 4, 4}, {"prefill", 8, 4},
                      {"decode", 8, 1},  {"decode", 16, 1}, {"decode", 64, 1}};
  fmt::print("{:<12} {:<8} {:>3} {:>5}  {:>17} {:>17} {:>17} {:>17} {:>17}\n", "task", "preset", "EP", "slots",
             "none mean/worst", "EPLB in-sample", "refined in-sample", "EPLB held-out", "refined held-out");
  std::vector<double> eplb_held[6], refined_held[6];
  for (const char* task : {"intent", "law", "summary", "translation"}) {
    auto seqs = read_routing(fs::path(a.dir) / task);
    if (!seqs) {
      fmt::print(stderr, "shoal bench eplb: {}\n", seqs.error());
      return 2;
    }
    const size_t half = seqs->size() / 2;
    const auto all = sum(*seqs, 0, seqs->size()), first = sum(*seqs, 0, half), second = sum(*seqs, half, seqs->size());
    for (size_t c = 0; c < std::size(cfgs); ++c) {
      const cfg& k = cfgs[c];
      runtime::eplb_shape sh{layers, experts, experts + k.redundant_per_rank * k.ep, 1, 1, k.ep};
      auto in = runtime::rebalance_experts(all, sh);
      auto past = runtime::rebalance_experts(first, sh);
      if (!in || !past) {
        fmt::print(stderr, "shoal bench eplb: {}\n", in ? past.error() : in.error());
        return 2;
      }
      auto in_r = runtime::refine_placement(all, *in, nullptr);
      auto past_r = runtime::refine_placement(first, *past, nullptr);
      const figure none = summarize(runtime::gpu_max_over_mean(all, sh, nullptr));
      const figure e_in = summarize(runtime::gpu_max_over_mean(all, sh, &*in));
      const figure r_in = summarize(runtime::gpu_max_over_mean(all, sh, &in_r.plan));
      const figure e_out = summarize(runtime::gpu_max_over_mean(second, sh, &*past));
      const figure r_out = summarize(runtime::gpu_max_over_mean(second, sh, &past_r.plan));
      eplb_held[c].push_back(e_out.mean), refined_held[c].push_back(r_out.mean);
      const auto pair = [](const figure& f) { return fmt::format("{:.3f} / {:.3f}", f.mean, f.worst); };
      fmt::print("{:<12} {:<8} {:>3} {:>5}  {:>17} {:>17} {:>17} {:>17} {:>17}\n", task, k.preset, k.ep, sh.physical,
                 pair(none), pair(e_in), pair(r_in), pair(e_out), pair(r_out));
      nlohmann::json rec = {{"kind", "eplb"}, {"task", task}, {"preset", k.preset}, {"ep", k.ep}, {"slots", sh.physical},
                            {"none_mean", none.mean}, {"none_worst", none.worst},
                            {"eplb_in_mean", e_in.mean}, {"eplb_in_worst", e_in.worst},
                            {"refined_in_mean", r_in.mean}, {"refined_in_worst", r_in.worst},
                            {"eplb_heldout_mean", e_out.mean}, {"eplb_heldout_worst", e_out.worst},
                            {"refined_heldout_mean", r_out.mean}, {"refined_heldout_worst", r_out.worst},
                            {"machine", machine_facts()}};
      append_jsonl(a.out, rec);
    }
  }
  fmt::print("\nheld-out mean over tasks (DeepSeek reports 1.045 at EP2, 1.074 at EP4 for prefill, 1.090 for decode):\n");
  for (size_t c = 0; c < std::size(cfgs); ++c) {
    const auto avg = [](const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size()); };
    fmt::print("  {} EP{}: EPLB {:.3f}, refined {:.3f}\n", cfgs[c].preset, cfgs[c].ep, avg(eplb_held[c]), avg(refined_held[c]));
  }
  return 0;
}

struct ep_memory_args {
  std::string model_dir;
  std::vector<int32_t> sizes{1, 2, 4};
  std::string out = "bench/results/ep_memory.jsonl";
};

// One rank of an EP group of `size` (run in a child process: its own peak RSS): the weights
// without routed experts, then rank 0's experts held as a rank of a shoald does; its figures
// as JSON.
std::string ep_memory_child(const std::string& dir, int32_t size) {
  nlohmann::json r;
  model::load_options none;
  none.keep_routed_expert = [](int64_t, int64_t) { return false; };
  auto w = model::load_weights(dir, nullptr, none);
  if (!w) {
    r["error"] = w.error().message;
  } else {
    const int64_t E = w->config.n_routed_experts;
    auto shared = std::make_shared<const model::model_weights>(std::move(*w));
    const int64_t base = peak_rss_bytes();
    auto residency = runtime::expert_residency::open(dir, shared);
    const auto placement = runtime::ep_placement::contiguous(model::moe_slot_count(shared->config), E, size);
    const auto own = placement.experts_of(0, 0);
    const auto mine = runtime::expert_residency::experts_for(placement, 0);
    if (residency) (*residency)->wait_ready(mine);
    auto held = residency ? (*residency)->hold(&r, mine)
                          : std::expected<void, std::string>(std::unexpected(residency.error()));
    if (!held) {
      r["error"] = held.error();
    } else {
      r = {{"experts", own.size()}, {"of_experts", E}, {"expert_bytes", (*residency)->resident_bytes()},
           {"rss_without_experts", base}, {"peak_rss_bytes", peak_rss_bytes()}};
    }
  }
  return r.dump();
}

int run_ep_memory_bench(const ep_memory_args& a) {
  const int64_t ckpt = checkpoint_bytes(a.model_dir);
  fmt::print("EP rank 0's memory, {} ({:.3f} GB of safetensors); one process per size\n", a.model_dir, ckpt / 1e9);
  fmt::print("{:>4} {:>12} {:>16} {:>20} {:>14} {:>12}\n", "EP", "experts", "expert GB", "RSS w/o experts GB",
             "peak RSS GB", "/ checkpoint");
  for (int32_t size : a.sizes) {
    const auto text = run_in_child([&] { return ep_memory_child(a.model_dir, size); });
    auto r = nlohmann::json::parse(text.value_or(""), nullptr, false);
    if (r.is_discarded() || r.contains("error")) {
      fmt::print(stderr, "shoal bench ep-memory: EP {}: {}\n", size, r.is_discarded() ? "the child process failed" : r["error"].get<std::string>());
      return 1;
    }
    const int64_t peak = r["peak_rss_bytes"];
    fmt::print("{:>4} {:>5} of {:>4} {:>16.3f} {:>20.3f} {:>14.3f} {:>12.2f}\n", size, r["experts"].get<int64_t>(),
               r["of_experts"].get<int64_t>(), r["expert_bytes"].get<int64_t>() / 1e9,
               r["rss_without_experts"].get<int64_t>() / 1e9, peak / 1e9, static_cast<double>(peak) / static_cast<double>(ckpt));
    nlohmann::json rec = machine_facts();
    rec.update(r);
    rec.update({{"bench", "ep_memory"}, {"model", a.model_dir}, {"ep", size}, {"rank", 0}, {"checkpoint_bytes", ckpt}});
    append_jsonl(a.out, rec);
  }
  return 0;
}

}  // namespace

void add_eplb_bench(CLI::App& bench) {
  auto m = std::make_shared<ep_memory_args>();
  auto* mem = bench.add_subcommand("ep-memory", "per-rank memory with partitioned expert weights, EP 1/2/4");
  mem->add_option("--model", m->model_dir, "checkpoint directory")->required();
  mem->add_option("--sizes", m->sizes, "EP group sizes")->check(CLI::Range(1, 1 << 16))->capture_default_str();
  mem->add_option("--out", m->out, "JSONL records")->capture_default_str();
  mem->callback([m] { set_exit_code(run_ep_memory_bench(*m)); });

  auto a = std::make_shared<eplb_args>();
  auto* c = bench.add_subcommand("eplb", "expert-parallel load imbalance on real routing: EPLB and the refined placement");
  c->add_option("--dir", a->dir, "the esft-expert-routing traces")->capture_default_str();
  c->add_option("--out", a->out, "JSONL records")->capture_default_str();
  c->callback([a] { set_exit_code(run_eplb_bench(*a)); });
}

}  // namespace shoal::tools
