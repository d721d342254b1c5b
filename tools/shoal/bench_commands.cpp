// `shoal bench …`: benchmarks that print a table and append JSONL records (MEASURE.md).
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "sim/prefix_trace.hpp"
#include "tools/shoal/commands.hpp"

namespace shoal::tools {

void add_bench_commands(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  add_engine_bench(*bench);
  add_transport_bench(*bench);
  add_disagg_bench(*bench);
  add_swa_bench(*bench);
  add_vision_bench(*bench);
  add_ep_frames_bench(*bench);
  add_grammar_bench(*bench);
  add_eplb_bench(*bench);
  add_ep_migration_bench(*bench);
  add_spec_bench(*bench);
  add_cluster_bench(*bench);
  add_ep_fault_bench(*bench);
  add_model_benches(*bench);
  add_serve_bench(*bench);
  add_storage_bench(*bench);
  add_kv_trace_bench(*bench);
  auto* pt = bench->add_subcommand("prefix-trace", "replay a Mooncake trace against the prefix cache");
  auto trace = std::make_shared<std::string>();
  auto capacity = std::make_shared<int32_t>(10000);
  auto policy = std::make_shared<std::string>("lru");
  pt->add_option("--trace", *trace, "trace file (JSON Lines)")->required();
  pt->add_option("--capacity", *capacity, "cache capacity in blocks");
  pt->add_option("--policy", *policy, "lru | pool")->check(CLI::IsMember({"lru", "pool"}));
  pt->callback([=] {
    auto t = sim::load_mooncake_trace(*trace);
    if (!t) {
      fmt::print(stderr, "shoal bench prefix-trace: {}\n", t.error());
      set_exit_code(1);
      return;
    }
    auto pol = *policy == "lru" ? sim::cache_policy::lru : sim::cache_policy::pool;
    auto s = sim::replay_trace(*t, *capacity, pol);
    fmt::print("policy={} capacity={} requests={} blocks={} hit_blocks={} evictions={} hit_ratio={:.4f}\n",
               *policy, *capacity, s.requests, s.blocks, s.hit_blocks, s.evictions, s.hit_ratio());
  });
}

}  // namespace shoal::tools
