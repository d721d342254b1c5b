// `shoal bench swa`: what an SWA slot fetch from another machine costs against the bounded
// replay it replaces. Fetch: a machine's swa_store_actor (slots of the mission's shape,
// 20 × 134 × 528 = 1,415,040 B, and of --preset's shape), the directory, and another
// machine's swa_fetcher, each with its own libfabric endpoint (--provider): directory lookup,
// slot description and the one-sided read, checked, end to end; p50/p99 over --fetches.
// Replay: on one engine with --preset (random weights), the TTFT of a conversation's second
// turn whose block hit restores the window from a slot, against the same turn on an engine
// that keeps no slots and replays the last replay_tokens of the hit prefix. Prints both and
// appends a JSON record (machine facts included).
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/send.hpp>

#include <random>
#include <thread>

#include "actors/swa_tier.hpp"
#include "model/generate.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/core/swa_pool.hpp"
#include "tools/shoal/bench_swa.hpp"
#include "tools/shoal/bench_util.hpp"
#include "tools/shoal/commands.hpp"
#include "transport/fabric_transport.hpp"

namespace shoal::tools {

namespace {

using nlohmann::json;

struct swa_args {
  std::string provider = "tcp;ofi_rxm";
  std::string preset = "small";
  int fetches = 50;
  int turns = 5;
  std::string out = "bench/results/swa.jsonl";
};

struct bench_config : caf::actor_system_config {
  bench_config() { actors::add_message_types(*this); }
};

std::shared_ptr<runtime::transport> endpoint(const std::string& provider) {
  auto t = transport::fabric_transport::create({provider, provider == "shm" ? "" : "127.0.0.1"});
  if (!t) throw std::runtime_error("libfabric " + provider + ": " + t.error());
  return std::shared_ptr<runtime::transport>(std::move(*t));
}

// Fetch latencies (seconds) of slots of `slot_bytes` through the actors.
std::vector<double> fetch_seconds(caf::actor_system& sys, const std::string& provider, size_t slot_bytes, int n) {
  auto store = std::make_shared<runtime::swa_store>(8, slot_bytes);
  std::mt19937 rng(7);
  std::vector<uint8_t> bytes(slot_bytes);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  std::vector<runtime::block_key> keys;
  for (uint64_t i = 0; i < 8; ++i) {
    keys.push_back({i + 1, 0x5a5a});
    store->put(keys.back(), 128, bytes);
  }
  auto holder = actors::spawn_swa_store(sys, {"holder", store, endpoint(provider), nullptr});
  if (!holder) throw std::runtime_error(holder.error());
  auto dir = actors::spawn_swa_directory(sys);
  actors::membership m;
  actors::node_info d;
  d.name = "directory";
  d.swa_directory = caf::actor_cast<caf::actor>(dir);
  m.nodes.push_back(d);
  caf::anon_send(*holder, m);
  actors::swa_fetcher fetcher(sys, endpoint(provider), "reader", std::chrono::seconds(5), 1);
  fetcher.set_directory(caf::actor_cast<caf::actor>(dir));
  std::vector<double> out;
  int misses = 0;  // while the holder's full report is on its way to the directory (≤ 2 s)
  for (int i = 0; i < n + 3; ++i) {  // the first ones set up connections: not counted
    auto f = fetcher.start_fetch({keys[static_cast<size_t>(i) % keys.size()]}, slot_bytes);
    f->wait();
    if (f->index() < 0) {
      if (f->error().empty() && ++misses < 40) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        --i;
        continue;
      }
      throw std::runtime_error("slot fetch failed: " + (f->error().empty() ? "directory miss" : f->error()));
    }
    if (f->bytes() != bytes) throw std::runtime_error("slot fetch returned other bytes");
    if (i >= 3) out.push_back(f->seconds());
  }
  caf::anon_send_exit(*holder, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(dir, caf::exit_reason::user_shutdown);
  return out;
}

// TTFT (seconds) of the second turns of `turns` conversations on an engine keeping `slots`
// snapshots (0: every hit replays).
std::vector<double> second_turn_ttft(const std::shared_ptr<const model::model_weights>& w, int64_t slots, int turns,
                                     uint64_t& restores, uint64_t& replays) {
  const auto& c = w->config;
  runtime::engine_config ec;
  ec.cache.num_blocks = 512;
  ec.cache.swa_snapshots = slots;
  ec.batch_invariant = true;
  runtime::engine e(w, ec);
  runtime::sampling_params p;
  p.max_tokens = 1;
  p.ignore_eos = true;
  std::vector<double> out;
  std::mt19937 rng(11);
  auto random = [&](int64_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(c.vocab_size));
    return t;
  };
  for (int k = 0; k < turns; ++k) {
    auto first = random(4 * c.block_size);
    if (!e.add_request(first, p)) throw std::runtime_error("first turn refused");
    e.run_to_completion();
    auto second = first;
    auto more = random(c.replay_tokens + c.block_size);  // past the decoder tail
    second.insert(second.end(), more.begin(), more.end());
    const double t0 = now_s();
    auto id = e.add_request(second, p);
    if (!id) throw std::runtime_error("second turn refused");
    bool got = false;
    while (!got && e.has_work())
      for (auto& ev : e.step()) got = got || ev.id == *id;
    out.push_back(now_s() - t0);
    e.run_to_completion();
  }
  restores = e.stats().cache.swa_restores;
  replays = e.stats().cache.replays;
  return out;
}

}  // namespace

json swa_fetch_vs_replay(const std::string& provider, const std::string& preset_name, int fetches, int turns) {
  swa_args a;
  a.provider = provider;
  a.preset = preset_name;
  a.fetches = fetches;
  a.turns = turns;
  json rec;
  auto cfg = model::preset_config(a.preset);
  if (!cfg) throw std::runtime_error(cfg.error().message);
  if (!cfg->is_flash()) throw std::runtime_error("--preset must be a shoal_flash model (tiny, small)");
  auto w = std::make_shared<model::model_weights>();
  w->config = *cfg;
  if (w->config.vocab_size <= 0) w->config.vocab_size = 1024;  // the presets leave it to the tokenizer
  model::init_random(*w, 5);
  const size_t mission_slot = 20 * 134 * 528;
  const size_t preset_slot = runtime::swa_snapshot_bytes(w->config, runtime::swa_storage::mxfp8);

  bench_config sc;
  caf::actor_system sys{sc};
  auto mission = fetch_seconds(sys, a.provider, mission_slot, a.fetches);
  auto preset = fetch_seconds(sys, a.provider, preset_slot, a.fetches);
  uint64_t restores = 0, replays = 0, r2 = 0, p2 = 0;
  auto restored = second_turn_ttft(w, 64, a.turns, restores, replays);
  auto replayed = second_turn_ttft(w, 0, a.turns, r2, p2);
  const double restore_ms = 1000 * median(restored), replay_ms = 1000 * median(replayed);
  const double fetch_ms = 1000 * percentile(preset, 0.5);

  fmt::print("swa: slot fetch over libfabric {} (directory lookup + describe + read, checked), {} fetches each:\n",
             a.provider, a.fetches);
  fmt::print("  mission slot {} B: p50 {:.3f} ms, p99 {:.3f} ms ({:.2f} GB/s at p50)\n", mission_slot,
             1000 * percentile(mission, 0.5), 1000 * percentile(mission, 0.99),
             static_cast<double>(mission_slot) / percentile(mission, 0.5) / 1e9);
  fmt::print("  {} slot {} B: p50 {:.3f} ms, p99 {:.3f} ms\n", a.preset, preset_slot, fetch_ms,
             1000 * percentile(preset, 0.99));
  fmt::print("swa: second-turn TTFT on {} ({} conversations, {} + {} tokens): window restored {:.1f} ms "
             "({} restores), replayed {:.1f} ms ({} replays of {} tokens)\n",
             a.preset, a.turns, 4 * w->config.block_size, w->config.replay_tokens + w->config.block_size, restore_ms,
             restores, replay_ms, p2, w->config.replay_tokens);
  fmt::print("swa: a fetched slot costs {:.3f} ms against {:.1f} ms of replay ({:.1f}x)\n", fetch_ms,
             replay_ms - restore_ms, fetch_ms > 0 ? (replay_ms - restore_ms) / fetch_ms : 0.0);
  rec.update({{"swa_provider", a.provider}, {"swa_preset", a.preset}, {"fetches", a.fetches},
              {"mission_slot_bytes", mission_slot}, {"mission_fetch_p50_ms", 1000 * percentile(mission, 0.5)},
              {"mission_fetch_p99_ms", 1000 * percentile(mission, 0.99)}, {"preset_slot_bytes", preset_slot},
              {"preset_fetch_p50_ms", fetch_ms}, {"preset_fetch_p99_ms", 1000 * percentile(preset, 0.99)},
              {"turn_restored_ttft_ms", restore_ms}, {"turn_replayed_ttft_ms", replay_ms},
              {"replay_cost_ms", replay_ms - restore_ms}, {"restores", restores}, {"replays", p2}});
  return rec;
}

namespace {

int run_swa(const swa_args& a) {
  json rec = machine_facts();  // popen: before any thread of ours exists
  rec["bench"] = "swa";
  rec.update(swa_fetch_vs_replay(a.provider, a.preset, a.fetches, a.turns));
  append_jsonl(a.out, rec);
  return 0;
}

}  // namespace

void add_swa_bench(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("swa", "SWA slot fetch from another machine's store vs the bounded replay it replaces");
  auto a = std::make_shared<swa_args>();
  cmd->add_option("--provider", a->provider, "libfabric provider (shm, tcp;ofi_rxm)");
  cmd->add_option("--preset", a->preset, "shoal_flash preset for the slot shape and the replay (tiny, small)");
  cmd->add_option("--fetches", a->fetches, "fetches per slot size")->check(CLI::Range(1, 100000));
  cmd->add_option("--turns", a->turns, "conversations for the TTFT comparison")->check(CLI::Range(1, 1000));
  cmd->add_option("--out", a->out, "JSONL file the record is appended to");
  cmd->callback([a] { run_then_exit("swa", [a] { return run_swa(*a); }); });
}

}  // namespace shoal::tools
