// `shoal bench ep-migration`: what moving routed experts between processes costs. A holder
// residency holds rank 0's experts of an EP group of --ep ranks (contiguous blocks); a reader
// residency gains them all: the holder lends them (registration + crc32c), the reader reads
// them one-sided over the transport and installs them. Against the same experts read from
// the checkpoint by a third residency (page cache warm after the holder's read). One process
// with the endpoints of both sides; the figures are wall times.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <chrono>
#include <thread>

#include "model/weights.hpp"
#include "runtime/ep/expert_residency.hpp"
#include "tools/shoal/bench_util.hpp"
#include "tools/shoal/commands.hpp"
#include "transport/dual_transport.hpp"

namespace shoal::tools {

namespace {

struct ep_migration_args {
  std::string model_dir;
  std::string transport = "shm";
  int32_t ep = 4;
  std::string out = "bench/results/ep_migration.jsonl";
};

int run_ep_migration_bench(const ep_migration_args& a) {
  auto fail = [](const std::string& why) {
    fmt::print(stderr, "shoal bench ep-migration: {}\n", why);
    return 1;
  };
  model::load_options none;
  none.keep_routed_expert = [](int64_t, int64_t) { return false; };
  std::shared_ptr<runtime::transport> holder_bulk, reader_bulk;
  for (auto* t : {&holder_bulk, &reader_bulk}) {
    auto opened = transport::open_transport(a.transport, "127.0.0.1");
    if (!opened) return fail("engine.transport \"" + a.transport + "\": " + opened.error());
    *t = std::move(*opened);
  }
  std::shared_ptr<runtime::expert_residency> side[3];  // holder, reader, checkpoint reader
  for (auto& r : side) {
    auto w = model::load_weights(a.model_dir, nullptr, none);
    if (!w) return fail(w.error().message);
    auto opened = runtime::expert_residency::open(a.model_dir, std::make_shared<const model::model_weights>(std::move(*w)));
    if (!opened) return fail(opened.error());
    r = *opened;
  }
  const auto cfg = model::load_config(a.model_dir);
  if (!cfg) return fail(cfg.error().message);
  const auto placement = runtime::ep_placement::contiguous(model::moe_slot_count(*cfg), cfg->n_routed_experts, a.ep);
  const auto experts = runtime::expert_residency::experts_for(placement, 0);
  std::vector<std::pair<int32_t, int32_t>> pairs;
  for (size_t s = 0; s < experts.size(); ++s)
    for (int32_t e : experts[s]) pairs.emplace_back(static_cast<int32_t>(s), e);
  int tags[3];
  side[0]->wait_ready(experts);
  if (auto held = side[0]->hold(&tags[0], experts); !held) return fail(held.error());
  const int64_t bytes = side[0]->resident_bytes();

  double t0 = now_s();
  auto parts = side[0]->lend(1, pairs, *holder_bulk, std::chrono::minutes(10));
  if (!parts) return fail(parts.error().message);
  const double lend_s = now_s() - t0;
  t0 = now_s();
  if (auto started = side[1]->fetch(1, *parts, reader_bulk, std::chrono::minutes(5)); !started)
    return fail(started.error().message);
  const double call_s = now_s() - t0;  // what an engine's thread spends between two steps
  while (!side[1]->ready(experts)) std::this_thread::sleep_for(std::chrono::microseconds(100));
  const double read_s = now_s() - t0;
  t0 = now_s();
  if (auto held = side[1]->hold(&tags[1], experts); !held) return fail(held.error());
  const double install_s = now_s() - t0;
  const auto moved = side[1]->migration();
  if (moved.fetched_bytes != bytes || moved.fetch_failures != 0)
    return fail(fmt::format("{} of {} bytes arrived from the holder, {} read(s) failed: {}", moved.fetched_bytes,
                            bytes, moved.fetch_failures, moved.last_failure));
  t0 = now_s();
  side[2]->wait_ready(experts);  // read from the checkpoint on the residency's thread
  if (auto held = side[2]->hold(&tags[2], experts); !held) return fail(held.error());
  const double checkpoint_s = now_s() - t0;

  const double mb = static_cast<double>(bytes) / 1e6;
  fmt::print("EP {} rank 0's {} experts ({:.1f} MB) of {}, over {}\n", a.ep, pairs.size(), mb, a.model_dir,
             holder_bulk->name());
  fmt::print("  lend (register + crc32c) {:8.1f} ms   {:8.0f} MB/s\n", lend_s * 1e3, mb / lend_s);
  fmt::print("  read one-sided           {:8.1f} ms   {:8.0f} MB/s (of which the fetch call on the caller's thread "
             "{:.1f} ms)\n", read_s * 1e3, mb / read_s, call_s * 1e3);
  fmt::print("  install                  {:8.1f} ms\n", install_s * 1e3);
  fmt::print("  checkpoint read instead  {:8.1f} ms   {:8.0f} MB/s (page cache warm)\n", checkpoint_s * 1e3,
             mb / checkpoint_s);
  nlohmann::json rec = machine_facts();
  rec.update({{"bench", "ep_migration"}, {"model", a.model_dir}, {"ep", a.ep}, {"transport", holder_bulk->name()},
              {"experts", pairs.size()}, {"bytes", bytes}, {"lend_s", lend_s}, {"read_s", read_s}, {"fetch_call_s", call_s},
              {"install_s", install_s}, {"checkpoint_s", checkpoint_s}});
  append_jsonl(a.out, rec);
  side[0]->end_loans(1);
  return 0;
}

}  // namespace

void add_ep_migration_bench(CLI::App& bench) {
  auto a = std::make_shared<ep_migration_args>();
  auto* c = bench.add_subcommand("ep-migration", "moving routed experts between processes: lend, one-sided read, "
                                                 "install, against a checkpoint read");
  c->add_option("--model", a->model_dir, "checkpoint directory")->required();
  c->add_option("--transport", a->transport, "engine.transport value (shm, tcp;ofi_rxm, auto, ...)")->capture_default_str();
  c->add_option("--ep", a->ep, "EP group size (rank 0's experts move)")->check(CLI::Range(1, 1 << 16))->capture_default_str();
  c->add_option("--out", a->out, "JSONL records")->capture_default_str();
  c->callback([a] { set_exit_code(run_ep_migration_bench(*a)); });
}

}  // namespace shoal::tools
