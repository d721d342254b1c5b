// `shoal bench kv-trace`: a Mooncake trace replayed through real engines whose second cache
// tier is the KV-cache storage cluster (12 storage nodes in a child process over the
// middleman), at several storage capacities; the prefix hit ratio is printed next to the
// traces README's single-LRU figure (one global LRU of the same capacity in blocks), computed
// in the same run for the same requests and for the whole trace.
//
// Mapping: each 512-token trace block (hash id) becomes one engine block of `block_size`
// tokens drawn from the hash id, so requests that share a hash-id prefix share a token prefix
// and therefore prefix-hash-chain keys; a request's prompt is its blocks plus one tail token
// (so every block is cacheable) and it generates one token. Requests alternate between the
// engines, whose own block pools hold one request's blocks and a few more, so hits mostly come
// from the storage cluster. Each request's write-back is drained before the next request is
// admitted, as the single LRU inserts at once. Trace timestamps are not replayed (file order).
// Storage capacity C blocks: every node holds one chunk of every block (group of 12 over 12
// nodes), so each node's capacity is C chunks at a high watermark of 0.98 (GC down to 0.95).
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/interfaces.hpp"
#include "actors/kv_block_store.hpp"
#include "actors/kv_client.hpp"
#include "model/generate.hpp"
#include "model/weights.hpp"
#include "runtime/engine/engine.hpp"
#include "sim/prefix_trace.hpp"
#include "storage/erasure.hpp"
#include "tools/shoal/bench_util.hpp"
#include "tools/shoal/commands.hpp"
#include "tools/shoal/storage_child.hpp"


namespace shoal::tools {

namespace {

using nlohmann::json;
using namespace std::chrono_literals;

struct kv_trace_args {
  std::string trace = conversation_trace_path();
  int requests = 2000;
  std::vector<int> capacities = {1000, 10000};  // in fp32 blocks' bytes: every format gets these bytes
  std::vector<std::string> kv_dtypes = {"fp32", "bf16"};
  int engines = 2;
  int tokens_per_block = 4;
  std::string dir = std::filesystem::exists("/dev/shm") ? "/dev/shm" : "/tmp";
  std::string out = "bench/results/kv_trace.jsonl";
};

constexpr double high_watermark = 0.98, low_watermark = 0.95;

// The prompt of a trace request: `block_size` tokens per hash id (in [0, 256): plain bytes
// of the test vocabulary), then one tail token.
std::vector<int32_t> prompt_of(const sim::trace_request& r, int64_t block_size) {
  std::vector<int32_t> out;
  out.reserve(r.hash_ids.size() * static_cast<size_t>(block_size) + 1);
  for (int64_t h : r.hash_ids)
    for (int64_t j = 0; j < block_size; ++j)
      out.push_back(static_cast<int32_t>(splitmix64(static_cast<uint64_t>(h) * 131 + static_cast<uint64_t>(j)) % 256));
  out.push_back(1);
  return out;
}

struct point {
  int capacity = 0;
  std::string kv;
  uint64_t chunk_bytes = 0;
  uint64_t held_blocks = 0;  // blocks the storage cluster holds at the end (chunks of its fullest node)
  int64_t requests = 0, blocks = 0, hit_blocks = 0, local_hit_blocks = 0, remote_hit_blocks = 0;
  uint64_t fetch_failures = 0, written = 0, write_failed = 0, dropped = 0;
  uint64_t evicted_chunks = 0, gc_runs = 0;
  double lru_same = 0, lru_whole = 0, seconds = 0;
};

// One capacity: fresh engines over the (empty) storage cluster of `child`.
point replay(caf::actor_system& sys, const storage_child& child, int capacity, model::kv_dtype kv,
             const std::shared_ptr<model::model_weights>& w, const std::vector<sim::trace_request>& reqs,
             const kv_trace_args& a) {
  actors::membership m = storage_members(sys, child);
  auto nodes = actors::kv_client::nodes_of(m);
  const int64_t bs = w->config.block_size;
  int64_t max_blocks = 0;
  for (const auto& r : reqs) max_blocks = std::max<int64_t>(max_blocks, static_cast<int64_t>(r.hash_ids.size()));
  std::vector<std::shared_ptr<actors::kv_block_store>> stores;
  std::vector<std::unique_ptr<runtime::engine>> engines;
  for (int e = 0; e < a.engines; ++e) {
    auto client = actors::kv_client::create(sys, {});
    if (!client) throw std::runtime_error(client.error());
    (*client)->set_nodes(nodes);
    stores.push_back(std::make_shared<actors::kv_block_store>(std::move(*client), 4096));
    runtime::engine_config ec;
    ec.cache.num_blocks = max_blocks + 4;  // one request's blocks and a few: hits come from storage
    ec.cache.kv_dtype = kv;
    ec.cache.remote = stores.back();
    engines.push_back(std::make_unique<runtime::engine>(w, ec));
  }
  runtime::sampling_params sp;
  sp.max_tokens = 1;
  point p;
  p.capacity = capacity;
  p.kv = std::string(model::to_string(kv));
  double t0 = now_s();
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto& eng = *engines[i % engines.size()];
    auto id = eng.add_request(prompt_of(reqs[i], bs), sp);
    if (!id) throw std::runtime_error("request " + std::to_string(i) + ": " + id.error().message);
    while (eng.has_work()) eng.step();
    int64_t cached = eng.cached_tokens(*id);
    eng.forget(*id);
    p.hit_blocks += cached / bs;
    p.blocks += static_cast<int64_t>(reqs[i].hash_ids.size());
    ++p.requests;
    for (auto& s : stores) s->stats(true);  // this request's blocks are written before the next looks
    if ((i + 1) % 500 == 0)
      fmt::print(stderr, "  capacity {}: {} requests, hit ratio so far {:.4f}, {:.0f} s\n", capacity, i + 1,
                 static_cast<double>(p.hit_blocks) / static_cast<double>(p.blocks), now_s() - t0);
  }
  p.seconds = now_s() - t0;
  for (size_t e = 0; e < engines.size(); ++e) {
    auto st = engines[e]->stats();
    p.remote_hit_blocks += static_cast<int64_t>(st.cache.remote_hit_tokens) / bs;
    p.local_hit_blocks += static_cast<int64_t>(st.cache.hit_tokens - st.cache.remote_hit_tokens) / bs;
    p.fetch_failures += st.cache.remote_fetch_failures;
    auto c = stores[e]->stats(true);
    p.written += c.written;
    p.write_failed += c.failed;
    p.dropped += c.dropped;
  }
  caf::scoped_actor self{sys};
  for (const auto& n : nodes)
    self->request(n.actor, 10s, stats_atom_v)
      .receive([&](const actors::storage_stats_snapshot& s) {
                 p.held_blocks = std::max(p.held_blocks, s.chunks);
                 p.evicted_chunks += s.evicted_chunks;
                 p.gc_runs += s.gc_runs;
               },
               [&](caf::error&) {});
  return p;
}

int run_kv_trace(const kv_trace_args& a) {
  json base = machine_facts();  // popen: before any thread of ours exists
  auto whole = sim::load_mooncake_trace(a.trace);
  if (!whole) throw std::runtime_error(whole.error());
  auto w = std::make_shared<model::model_weights>();
  w->config = *model::preset_config("v3-tiny");
  w->config.vocab_size = 300;
  w->config.bos_token_id = 256;
  w->config.eos_token_id = 257;
  // One engine block per 512-token trace block, of `tokens_per_block` tokens: the longest
  // conversation (247 blocks) must fit.
  w->config.block_size = a.tokens_per_block;
  w->config.max_position_embeddings = 256 * a.tokens_per_block + 2;
  model::init_random(*w, 1);
  const int64_t bs = w->config.block_size;
  const auto max_blocks = static_cast<size_t>((w->config.max_position_embeddings - 2) / bs);
  std::vector<sim::trace_request> reqs(whole->begin(), whole->begin() + std::min<size_t>(whole->size(), a.requests));
  size_t truncated = 0;
  for (auto& r : reqs)
    if (r.hash_ids.size() > max_blocks) {
      r.hash_ids.resize(max_blocks);
      ++truncated;
    }

  // A chunk's stored size for this model's blocks in a format (its header included): the
  // capacities are in fp32 chunks, so every format gets the same bytes.
  auto codec = storage::ec_codec::create(10, 2);
  if (!codec) throw std::runtime_error(codec.error().message);
  auto chunk_bytes_of = [&](model::kv_dtype kv) {
    std::vector<uint8_t> probe(model::kv_block_header_bytes + model::kv_format_of(w->config, kv).block_bytes());
    auto chunks = codec->encode(probe);
    if (!chunks) throw std::runtime_error(chunks.error().message);
    return static_cast<uint64_t>((*chunks)[0].size());
  };
  const uint64_t chunk_bytes = chunk_bytes_of(model::kv_dtype::fp32);
  std::vector<model::kv_dtype> kvs;
  for (const auto& k : a.kv_dtypes) kvs.push_back(*model::parse_kv_dtype(k));

  // Every child before this process has an actor system (fork with threads is not safe).
  std::vector<storage_child> children;
  struct guard {
    std::vector<storage_child>& cs;
    ~guard() {
      for (auto& c : cs) stop_storage_child(c);
    }
  } g{children};
  for (size_t run = 0; run < kvs.size() * a.capacities.size(); ++run) {
    const int cap = a.capacities[run % a.capacities.size()];
    storage_child_options o;
    o.parent_dir = a.dir;
    o.capacity_bytes = static_cast<uint64_t>(static_cast<double>(cap) * static_cast<double>(chunk_bytes) / high_watermark) + 1;
    o.gc_high_watermark = high_watermark;
    o.gc_low_watermark = low_watermark;
    children.push_back(fork_storage_child(o));
  }
  for (auto& c : children) wait_port(c);
  auto* cfg = new caf::actor_system_config;  // never destroyed: see bench storage
  configure_bench_system(*cfg);
  auto& sys = *new caf::actor_system{*cfg};

  fmt::print("shoal bench kv-trace: {} ({} of {} requests, {} truncated to {} blocks), v3-tiny, {} engines, "
             "{} tokens per trace block, chunk {} B, storage in {}\n",
             a.trace, reqs.size(), whole->size(), truncated, max_blocks, a.engines, bs, chunk_bytes, a.dir);
  std::vector<point> points;
  for (size_t i = 0; i < children.size(); ++i) {
    const int cap = a.capacities[i % a.capacities.size()];
    const model::kv_dtype kv = kvs[i / a.capacities.size()];
    point p = replay(sys, children[i], cap, kv, w, reqs, a);
    p.chunk_bytes = chunk_bytes_of(kv);
    p.lru_same = sim::replay_trace(reqs, cap, sim::cache_policy::lru).hit_ratio();
    p.lru_whole = sim::replay_trace(*whole, cap, sim::cache_policy::lru).hit_ratio();
    points.push_back(p);
    stop_storage_child(children[i]);
  }
  auto ideal = sim::replay_trace(reqs, std::numeric_limits<int32_t>::max(), sim::cache_policy::lru).hit_ratio();

  fmt::print("\n{:>9} {:>5} {:>7} {:>7} {:>8} {:>9} {:>10} {:>10} {:>11} {:>11} {:>10} {:>9} {:>8}\n", "capacity", "kv",
             "chunk B", "held", "blocks", "hit ratio", "from local", "from store", "LRU same rq", "LRU whole",
             "evicted ch", "fetch err", "s");
  for (const auto& p : points) {
    auto ratio = [&](int64_t x) { return static_cast<double>(x) / static_cast<double>(std::max<int64_t>(1, p.blocks)); };
    fmt::print("{:>9} {:>5} {:>7} {:>7} {:>8} {:>9.4f} {:>10.4f} {:>10.4f} {:>11.4f} {:>11.4f} {:>10} {:>9} {:>8.1f}\n",
               p.capacity, p.kv, p.chunk_bytes, p.held_blocks, p.blocks, ratio(p.hit_blocks), ratio(p.local_hit_blocks),
               ratio(p.remote_hit_blocks), p.lru_same, p.lru_whole, p.evicted_chunks, p.fetch_failures, p.seconds);
  }
  fmt::print("capacity: bytes of that many fp32 chunks per node, the same for every format; held: blocks the "
             "storage cluster holds at the end (one chunk of each per node).\n");
  fmt::print("infinite cache, same requests: {:.4f}. LRU same rq: one global LRU of the capacity over the same "
             "requests; LRU whole: the traces README's figure (whole trace).\n",
             ideal);
  int bad = 0;
  for (const auto& p : points) {
    if (p.write_failed || p.dropped) {
      fmt::print("capacity {}: {} writes failed, {} dropped\n", p.capacity, p.write_failed, p.dropped);
      ++bad;
    }
    json r = base;
    r["bench"] = "kv_trace";
    r["trace"] = std::filesystem::path(a.trace).filename().string();
    r["requests"] = p.requests;
    r["truncated_requests"] = truncated;
    r["engines"] = a.engines;
    r["preset"] = "v3-tiny";
    r["tokens_per_block"] = bs;
    r["capacity_blocks"] = p.capacity;
    r["capacity_bytes_per_node"] = static_cast<uint64_t>(p.capacity) * chunk_bytes;
    r["kv_dtype"] = p.kv;
    r["chunk_bytes"] = p.chunk_bytes;
    r["held_blocks"] = p.held_blocks;
    r["blocks"] = p.blocks;
    r["hit_blocks"] = p.hit_blocks;
    r["hit_ratio"] = static_cast<double>(p.hit_blocks) / static_cast<double>(std::max<int64_t>(1, p.blocks));
    r["local_hit_blocks"] = p.local_hit_blocks;
    r["remote_hit_blocks"] = p.remote_hit_blocks;
    r["lru_same_requests"] = p.lru_same;
    r["lru_whole_trace"] = p.lru_whole;
    r["infinite_same_requests"] = ideal;
    r["evicted_chunks"] = p.evicted_chunks;
    r["gc_runs"] = p.gc_runs;
    r["fetch_failures"] = p.fetch_failures;
    r["blocks_written"] = p.written;
    r["write_failures"] = p.write_failed;
    r["writes_dropped"] = p.dropped;
    r["seconds"] = p.seconds;
    append_jsonl(a.out, r);
  }
  return bad ? 1 : 0;
}

}  // namespace

void add_kv_trace_bench(CLI::App& bench) {
  auto* b = bench.add_subcommand("kv-trace", "Mooncake trace through engines with the storage cluster as their "
                                             "second cache tier, at several storage capacities, vs a single LRU");
  auto a = std::make_shared<kv_trace_args>();
  b->add_option("--trace", a->trace, "Mooncake trace (JSON Lines)")->capture_default_str();
  b->add_option("--requests", a->requests, "the first N requests of the trace")->capture_default_str()->check(
    CLI::PositiveNumber);
  b->add_option("--kv-dtypes", a->kv_dtypes, "KV formats of the engines, each run at every capacity")
    ->capture_default_str()
    ->check(CLI::IsMember({"fp32", "bf16", "fp8"}));
  b->add_option("--capacities", a->capacities,
                "storage capacities in fp32 blocks' bytes (one storage cluster each, per format)")
    ->capture_default_str()
    ->check(CLI::Range(16, 1 << 24));
  b->add_option("--engines", a->engines, "engines the requests alternate between")->capture_default_str()->check(
    CLI::Range(1, 8));
  b->add_option("--tokens-per-block", a->tokens_per_block, "engine block size (tokens per trace block)")
    ->capture_default_str()
    ->check(CLI::Range(1, 64));
  b->add_option("--dir", a->dir, "parent directory of the storage nodes' directories")->capture_default_str();
  b->add_option("--out", a->out, "JSONL output")->capture_default_str();
  b->callback([a] { run_then_exit("kv-trace", [&] { return run_kv_trace(*a); }); });
}

}  // namespace shoal::tools
