// `shoal bench storage`: the KV-cache storage cluster measured against its own limits, in one
// run (MEASURE.md): raw ISA-L 10+2 encode/decode of the block size (no I/O), a plain TCP bulk
// transfer between two processes over loopback, then 12 storage nodes in a child process
// reached over the middleman through a kv_client: put and get GB/s, their ratios to raw encode
// and to loopback (printed, never asserted), bit-exactness of every get, and single-block get
// latency with 0, 1 and 2 storage nodes down.
// First run (c3a84ae, 2 cores): with 2 nodes killed over the middleman, single-block gets take the
// kv_client's full 5 s request timeout: requests to a killed remote storage actor are not failed
// at once, so the get waits for the dead chunks of its first k + 1 before asking the rest.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include "actors/interfaces.hpp"
#include "actors/kv_block_store.hpp"
#include "actors/kv_client.hpp"
#include "model/generate.hpp"
#include "model/kv_format.hpp"
#include "actors/storage_node_actor.hpp"
#include "storage/chunk_file.hpp"
#include "storage/chunk_store.hpp"
#include "storage/erasure.hpp"
#include "tools/shoal/bench_util.hpp"
#include "tools/shoal/commands.hpp"
#include "tools/shoal/storage_child.hpp"

namespace shoal::tools {

namespace {

using nlohmann::json;
using namespace std::chrono_literals;

constexpr int storage_nodes = 12;

struct storage_args {
  int blocks = 128;
  int block_kib = 1024;
  int reps = 5;
  int loopback_mib = 256;
  int latency_gets = 64;
  int inflight = 8;
  bool fsync = false;
  std::string dir = "/tmp";
  std::string out = "bench/results/storage.jsonl";
};

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5))];
}

std::vector<uint8_t> random_block(size_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> b(n);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x = rng();
    std::memcpy(b.data() + i, &x, 8);
  }
  for (; i < n; ++i) b[i] = static_cast<uint8_t>(rng());
  return b;
}

// -- 1. raw ISA-L ---------------------------------------------------------------------------

struct ec_result {
  double encode_gbps = 0, decode_gbps = 0;
  double encode_min = 0, encode_max = 0, decode_min = 0, decode_max = 0;
  int blocks = 0, mismatches = 0;
};

ec_result measure_ec(const storage_args& a) {
  auto codec = storage::ec_codec::create(10, 2);
  if (!codec) throw std::runtime_error("ec_codec: " + codec.error().message);
  size_t bytes = static_cast<size_t>(a.block_kib) * 1024;
  ec_result r;
  r.blocks = 64;
  std::vector<std::vector<uint8_t>> blocks;
  for (int b = 0; b < r.blocks; ++b) blocks.push_back(random_block(bytes, 1000 + b));
  std::vector<std::vector<std::vector<uint8_t>>> encoded(blocks.size());
  std::vector<double> enc, dec;
  for (int rep = 0; rep < a.reps + 1; ++rep) {  // rep 0 warms up
    double t0 = now_s();
    for (size_t b = 0; b < blocks.size(); ++b) {
      auto c = codec->encode(blocks[b]);
      if (!c) throw std::runtime_error("encode: " + c.error().message);
      encoded[b] = std::move(*c);
    }
    double te = now_s() - t0;
    // Two data chunks lost (0 and 1): the decode has to rebuild from parity.
    std::vector<std::vector<storage::chunk_ref>> refs(blocks.size());
    for (size_t b = 0; b < blocks.size(); ++b)
      for (size_t i = 2; i < encoded[b].size(); ++i) refs[b].push_back({static_cast<uint32_t>(i), encoded[b][i]});
    std::vector<std::vector<uint8_t>> decoded(blocks.size());
    int bad = 0;
    t0 = now_s();
    for (size_t b = 0; b < blocks.size(); ++b) {
      auto d = codec->decode(refs[b]);
      if (d) decoded[b] = std::move(*d);
      else ++bad;
    }
    double td = now_s() - t0;
    for (size_t b = 0; b < blocks.size(); ++b)
      if (decoded[b] != blocks[b]) ++bad;
    r.mismatches += bad;
    if (rep == 0) continue;
    enc.push_back(static_cast<double>(bytes) * blocks.size() / te / 1e9);
    dec.push_back(static_cast<double>(bytes) * blocks.size() / td / 1e9);
  }
  r.encode_gbps = median(enc);
  r.decode_gbps = median(dec);
  r.encode_min = *std::min_element(enc.begin(), enc.end());
  r.encode_max = *std::max_element(enc.begin(), enc.end());
  r.decode_min = *std::min_element(dec.begin(), dec.end());
  r.decode_max = *std::max_element(dec.begin(), dec.end());
  return r;
}

// -- 2. plain loopback TCP ------------------------------------------------------------------

struct loopback_result {
  double gbps = 0, min = 0, max = 0;
  size_t bytes = 0;
};

// One transfer: a forked sender writes `total` bytes in 1 MiB writes to 127.0.0.1; the GB/s is
// taken at the receiver (accept → last byte).
double loopback_once(size_t total) {
  int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  if (ls < 0) throw std::runtime_error("socket: " + std::string(strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(ls, reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0 || ::listen(ls, 1) < 0)
    throw std::runtime_error("bind/listen: " + std::string(strerror(errno)));
  socklen_t len = sizeof addr;
  ::getsockname(ls, reinterpret_cast<sockaddr*>(&addr), &len);
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork: " + std::string(strerror(errno)));
  if (pid == 0) {
    ::close(ls);
    int s = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0) std::_Exit(1);
    std::vector<char> buf(1 << 20, 'x');
    for (size_t sent = 0; sent < total; sent += buf.size())
      if (storage::write_all(s, std::as_bytes(std::span(buf).first(std::min(buf.size(), total - sent)))) != 0)
        std::_Exit(1);
    ::close(s);
    std::_Exit(0);
  }
  int s = ::accept(ls, nullptr, nullptr);
  ::close(ls);
  if (s < 0) throw std::runtime_error("accept: " + std::string(strerror(errno)));
  std::vector<char> buf(1 << 20);
  size_t got = 0;
  double t0 = now_s();
  while (got < total) {
    ssize_t r = ::read(s, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  double t = now_s() - t0;
  ::close(s);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (got < total) throw std::runtime_error("loopback: received " + std::to_string(got) + " of " + std::to_string(total));
  return static_cast<double>(total) / t / 1e9;
}

loopback_result measure_loopback(const storage_args& a) {
  loopback_result r;
  r.bytes = static_cast<size_t>(a.loopback_mib) << 20;
  loopback_once(r.bytes / 4);  // warm-up
  std::vector<double> v;
  for (int rep = 0; rep < a.reps; ++rep) v.push_back(loopback_once(r.bytes));
  r.gbps = median(v);
  r.min = *std::min_element(v.begin(), v.end());
  r.max = *std::max_element(v.begin(), v.end());
  return r;
}

// -- 3. one chunk store alone: the storage directory's own limit ---------------------------

struct store_result {
  double put_gbps = 0, get_gbps = 0;  // block bytes per second (a block = k + m chunk files)
};

// The chunks of `blocks` blocks written to and read from one chunk store in `parent_dir`, no
// network: what the file system gives the cluster's puts at best (one file per chunk).
store_result measure_store(const storage_args& a, const std::string& parent_dir) {
  std::string tmpl = parent_dir + "/shoal-bench-store-XXXXXX";
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp: " + std::string(strerror(errno)));
  storage::store_options o;
  o.root = tmpl;
  o.capacity_bytes = 64ull << 30;
  o.max_chunk_bytes = 64ull << 20;
  o.sync = a.fsync ? storage::sync_policy::always : storage::sync_policy::never;
  o.now_ms = [] { return int64_t{0}; };
  store_result r;
  {
    auto store = storage::chunk_store::open(o);
    if (!store) throw std::runtime_error("chunk store: " + storage::to_string(store.error()));
    size_t block = static_cast<size_t>(a.block_kib) * 1024;
    std::vector<uint8_t> chunk = random_block(block / 10 + 32, 99);
    const int chunks = a.blocks * 12;
    auto bytes = std::span<const std::byte>(reinterpret_cast<const std::byte*>(chunk.data()), chunk.size());
    double t0 = now_s();
    for (int i = 0; i < chunks; ++i)
      if (auto p = (*store)->put({{.lo = static_cast<uint64_t>(i), .hi = 0x5107eull}, 0}, bytes, storage::traffic_class::chat); !p)
        throw std::runtime_error("chunk store put: " + storage::to_string(p.error()));
    r.put_gbps = static_cast<double>(block) * a.blocks / (now_s() - t0) / 1e9;
    t0 = now_s();
    for (int i = 0; i < a.blocks * 11; ++i)  // a get reads k + 1 chunks
      if (auto g = (*store)->get({{.lo = static_cast<uint64_t>(i), .hi = 0x5107eull}, 0}); !g)
        throw std::runtime_error("chunk store get: " + storage::to_string(g.error()));
    r.get_gbps = static_cast<double>(block) * a.blocks / (now_s() - t0) / 1e9;
  }
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);
  return r;
}

runtime::block_key key_of(int b) {
  return {.lo = 0xb10c000000000000ull ^ static_cast<uint64_t>(b), .hi = 0x5107a6e000000000ull + static_cast<uint64_t>(b)};
}

// Bytes the storage nodes hold, summed (their stats).
uint64_t stored_bytes(caf::actor_system& sys, const std::vector<actors::storage_endpoint>& nodes) {
  caf::scoped_actor self{sys};
  uint64_t total = 0;
  for (const auto& n : nodes)
    self->request(n.actor, 10s, stats_atom_v)
      .receive([&](const actors::storage_stats_snapshot& st) { total += st.usage_bytes; },
               [&](caf::error& e) { throw std::runtime_error("storage stats: " + caf::to_string(e)); });
  return total;
}

struct kv_block_point {
  std::string kv;
  uint64_t block_bytes = 0;     // one engine block in the format
  double stored_per_block = 0;  // bytes the nodes hold per stored block (header, parity, chunk files)
  uint64_t written = 0, failed = 0;
};

// Engine KV blocks of the v3-small shape written through the engines' store (kv_block_store:
// the format's header, then the block) in each format: the bytes the cluster holds per block.
std::vector<kv_block_point> measure_kv_blocks(caf::actor_system& sys, const std::vector<actors::storage_endpoint>& nodes,
                                              int blocks) {
  const auto c = model::preset_config("v3-small");
  if (!c) throw std::runtime_error(c.error().message);
  std::vector<kv_block_point> out;
  int next = 2'000'000;
  for (model::kv_dtype kv : {model::kv_dtype::fp32, model::kv_dtype::bf16, model::kv_dtype::fp8}) {
    const model::kv_format f = model::kv_format_of(*c, kv);
    auto client = actors::kv_client::create(sys, {});
    if (!client) throw std::runtime_error(client.error());
    (*client)->set_nodes(nodes);
    actors::kv_block_store store(std::move(*client), static_cast<size_t>(blocks) + 8);
    const uint64_t before = stored_bytes(sys, nodes);
    std::vector<uint8_t> raw = random_block(f.block_bytes(), 4242);
    const auto bytes = std::as_bytes(std::span(raw));
    for (int b = 0; b < blocks; ++b)
      if (!store.store_async(key_of(next++), bytes, f, runtime::traffic_class::agent))
        throw std::runtime_error("kv block store: write queue full");
    const auto counters = store.stats(true);
    const uint64_t after = stored_bytes(sys, nodes);
    out.push_back({std::string(model::to_string(kv)), f.block_bytes(),
                   static_cast<double>(after - before) / std::max<uint64_t>(1, counters.written), counters.written,
                   counters.failed});
  }
  return out;
}

// The KV-block figures (fp32 first), printed and appended as records.
void print_kv_blocks(const std::vector<kv_block_point>& points, const json& base, const std::string& out) {
  fmt::print("\nengine KV blocks (v3-small shape) through the engines' store, 64 each:\n");
  const double fp32_stored = points.front().stored_per_block;
  for (const auto& p : points) {
    fmt::print("  {:>4}: block {} bytes ({:.4f}x fp32), stored {:.0f} bytes per block with header, parity and chunk "
               "files ({:.4f}x fp32's), {} written, {} failed\n",
               p.kv, p.block_bytes, static_cast<double>(p.block_bytes) / static_cast<double>(points.front().block_bytes),
               p.stored_per_block, p.stored_per_block / fp32_stored, p.written, p.failed);
    json r = base;
    r["point"] = "kv_blocks";
    r["kv_dtype"] = p.kv;
    r["engine_block_bytes"] = p.block_bytes;
    r["stored_bytes_per_block"] = p.stored_per_block;
    r["ratio_to_fp32"] = p.stored_per_block / fp32_stored;
    r["written"] = p.written;
    r["failed"] = p.failed;
    append_jsonl(out, r);
  }
}

int run_storage_bench(const storage_args& a) {
  json base = machine_facts();  // popen: before any thread of ours exists
  base["bench"] = "storage";
  base["block_bytes"] = static_cast<int64_t>(a.block_kib) * 1024;
  base["k"] = 10;
  base["m"] = 2;
  base["fsync"] = a.fsync;
  base["reps"] = a.reps;
  base["inflight"] = a.inflight;
  base["dir"] = a.dir;
  // Fork the storage cluster first, before this process has an actor system or threads.
  storage_child_options so;
  so.nodes = storage_nodes;
  so.fsync = a.fsync;
  so.parent_dir = a.dir;
  storage_child child = fork_storage_child(so);
  struct guard {
    storage_child& c;
    ~guard() { stop_storage_child(c); }
  } g{child};

  ec_result ec = measure_ec(a);
  loopback_result lb = measure_loopback(a);
  store_result st = measure_store(a, so.parent_dir);
  wait_port(child);

  // Never destroyed: CAF 0.17's teardown can block once a remote node was connected (the
  // process ends with std::_Exit).
  auto* cfg = new caf::actor_system_config;
  configure_bench_system(*cfg);
  auto& sys = *new caf::actor_system{*cfg};
  actors::membership m = storage_members(sys, child);
  actors::kv_client_config kc;
  kc.timeout = 5s;
  auto created = actors::kv_client::create(sys, kc);
  if (!created) throw std::runtime_error(created.error());
  actors::kv_client* client = created->release();  // leaked with the actor system
  auto nodes = actors::kv_client::nodes_of(m);
  if (static_cast<int>(nodes.size()) != storage_nodes)
    throw std::runtime_error("membership lists " + std::to_string(nodes.size()) + " storage nodes");
  client->set_nodes(nodes);

  size_t bytes = static_cast<size_t>(a.block_kib) * 1024;
  std::vector<std::vector<uint8_t>> blocks;
  for (int b = 0; b < a.blocks; ++b) blocks.push_back(random_block(bytes, 7 + b));
  // Warm-up: the connections to every node and the stores' first files (keys apart).
  for (int b = 0; b < 4; ++b) {
    runtime::block_key k = key_of(1'000'000 + b);
    if (auto r = client->put(k, blocks[b % blocks.size()], runtime::traffic_class::agent); !r) throw std::runtime_error("warm-up put: " + r.error());
    if (auto r = client->get(k); !r) throw std::runtime_error("warm-up get: " + r.error());
  }
  // Blocks go in batches of `inflight` (put_many / get_many: every block of a batch in flight).
  int put_failed = 0, get_failed = 0, mismatches = 0;
  double t0 = now_s();
  for (int b0 = 0; b0 < a.blocks; b0 += a.inflight) {
    std::vector<actors::kv_client::put_item> items;
    for (int b = b0; b < std::min(a.blocks, b0 + a.inflight); ++b) items.push_back({key_of(b), blocks[b], runtime::traffic_class::agent});
    auto rs = client->put_many(items);
    for (size_t i = 0; i < rs.size(); ++i)
      if (!rs[i] && put_failed++ == 0) fmt::print(stderr, "put {}: {}\n", b0 + static_cast<int>(i), rs[i].error());
  }
  double put_s = now_s() - t0;
  t0 = now_s();
  for (int b0 = 0; b0 < a.blocks; b0 += a.inflight) {
    std::vector<runtime::block_key> keys;
    for (int b = b0; b < std::min(a.blocks, b0 + a.inflight); ++b) keys.push_back(key_of(b));
    auto rs = client->get_many(keys);
    for (size_t i = 0; i < rs.size(); ++i) {
      int b = b0 + static_cast<int>(i);
      if (!rs[i]) {
        if (get_failed++ == 0) fmt::print(stderr, "get {}: {}\n", b, rs[i].error());
      } else if (*rs[i] != blocks[b]) {
        ++mismatches;
      }
    }
  }
  double get_s = now_s() - t0;
  double total = static_cast<double>(bytes) * a.blocks;
  double put_gbps = total / put_s / 1e9, get_gbps = total / get_s / 1e9;
  double put_ratio = put_gbps / ec.encode_gbps, get_ratio = get_gbps / lb.gbps;

  auto kv_points = measure_kv_blocks(sys, nodes, 64);

  // 4. Single-block get latency with 0, 1, 2 nodes down. Every node is in every block's group
  // (12 nodes, groups of 12); killing the nodes of data chunks 0 and 1 of block 0 forces decodes.
  struct lat_point {
    int down;
    double p50, p99;
    int gets, failed, mismatches;
  };
  std::vector<lat_point> lat;
  auto group0 = client->placement(key_of(0));
  for (int down = 0; down <= 2; ++down) {
    if (down > 0) {
      caf::anon_send_exit(nodes[group0[static_cast<size_t>(down - 1)]].actor, caf::exit_reason::kill);
      std::this_thread::sleep_for(200ms);  // let the exit reach the child and the down reach us
    }
    lat_point p{down, 0, 0, std::max(a.latency_gets, 50), 0, 0};
    std::vector<double> v;
    for (int i = 0; i < p.gets; ++i) {
      int b = i % a.blocks;
      double s = now_s();
      auto r = client->get(key_of(b));
      v.push_back((now_s() - s) * 1e3);
      if (!r) {
        if (p.failed++ == 0) fmt::print(stderr, "get with {} down: {}\n", down, r.error());
      } else if (*r != blocks[b]) {
        ++p.mismatches;
      }
    }
    p.p50 = pct(v, 0.5);
    p.p99 = pct(v, 0.99);
    lat.push_back(p);
  }

  // Table.
  fmt::print("shoal bench storage: ec 10+2, block {} KiB, {} reps, {} blocks in flight, fsync {}, stores in {}\n",
             a.block_kib, a.reps, a.inflight, a.fsync ? "always" : "never", a.dir);
  fmt::print("{:<34} {:>10} {:>21}\n", "measure", "GB/s", "min-max / note");
  fmt::print("{:<34} {:>10.2f} {:>10.2f}-{:<10.2f}\n", "raw ISA-L encode (64 blocks)", ec.encode_gbps, ec.encode_min,
             ec.encode_max);
  fmt::print("{:<34} {:>10.2f} {:>10.2f}-{:<10.2f}\n", "raw ISA-L decode, 2 lost", ec.decode_gbps, ec.decode_min,
             ec.decode_max);
  fmt::print("{:<34} {:>10.2f} {:>10.2f}-{:<10.2f}\n", fmt::format("loopback TCP ({} MiB)", a.loopback_mib), lb.gbps,
             lb.min, lb.max);
  fmt::print("{:<34} {:>10.3f} {:>21}\n", "one chunk store put (file/chunk)", st.put_gbps, "(block bytes)");
  fmt::print("{:<34} {:>10.3f} {:>21}\n", "one chunk store get (11 chunks)", st.get_gbps, "(block bytes)");
  fmt::print("{:<34} {:>10.3f} {:>21}\n", fmt::format("cluster put ({} blocks)", a.blocks), put_gbps,
             fmt::format("{} failed", put_failed));
  fmt::print("{:<34} {:>10.3f} {:>21}\n", fmt::format("cluster get ({} blocks)", a.blocks), get_gbps,
             fmt::format("{} failed, {} mismatch", get_failed, mismatches));
  fmt::print("{:<34} {:>10.3f} {:>21}\n", "ratio put / raw encode", put_ratio, "(target >= 0.8)");
  fmt::print("{:<34} {:>10.3f} {:>21}\n", "ratio get / loopback", get_ratio, "(target >= 0.5)");
  fmt::print("{:<34} {:>10.3f} {:>21}\n", "ratio put / one chunk store put", put_gbps / st.put_gbps, "");
  fmt::print("\n{:>10} {:>6} {:>10} {:>10} {:>7} {:>9}\n", "nodes down", "gets", "p50 ms", "p99 ms", "failed", "mismatch");
  for (const auto& p : lat)
    fmt::print("{:>10} {:>6} {:>10.3f} {:>10.3f} {:>7} {:>9}\n", p.down, p.gets, p.p50, p.p99, p.failed, p.mismatches);
  if (ec.mismatches) fmt::print("raw decode mismatches: {}\n", ec.mismatches);
  print_kv_blocks(kv_points, base, a.out);

  json r = base;
  r["point"] = "ec_raw";
  r["blocks"] = ec.blocks;
  r["encode_gbps"] = ec.encode_gbps;
  r["encode_gbps_min"] = ec.encode_min;
  r["encode_gbps_max"] = ec.encode_max;
  r["decode2_gbps"] = ec.decode_gbps;
  r["decode2_gbps_min"] = ec.decode_min;
  r["decode2_gbps_max"] = ec.decode_max;
  r["decode_mismatches"] = ec.mismatches;
  append_jsonl(a.out, r);
  r = base;
  r["point"] = "chunk_store";
  r["put_gbps"] = st.put_gbps;
  r["get_gbps"] = st.get_gbps;
  append_jsonl(a.out, r);
  r = base;
  r["point"] = "loopback";
  r["bytes"] = lb.bytes;
  r["write_bytes"] = 1 << 20;
  r["gbps"] = lb.gbps;
  r["gbps_min"] = lb.min;
  r["gbps_max"] = lb.max;
  append_jsonl(a.out, r);
  r = base;
  r["point"] = "cluster";
  r["nodes"] = storage_nodes;
  r["blocks"] = a.blocks;
  r["put_s"] = put_s;
  r["get_s"] = get_s;
  r["put_gbps"] = put_gbps;
  r["get_gbps"] = get_gbps;
  r["put_failed"] = put_failed;
  r["get_failed"] = get_failed;
  r["get_mismatches"] = mismatches;
  r["put_over_raw_encode"] = put_ratio;
  r["get_over_loopback"] = get_ratio;
  r["put_over_chunk_store"] = put_gbps / st.put_gbps;
  append_jsonl(a.out, r);
  for (const auto& p : lat) {
    r = base;
    r["point"] = "get_latency";
    r["nodes_down"] = p.down;
    r["gets"] = p.gets;
    r["p50_ms"] = p.p50;
    r["p99_ms"] = p.p99;
    r["failed"] = p.failed;
    r["mismatches"] = p.mismatches;
    append_jsonl(a.out, r);
  }
  return (mismatches || ec.mismatches || put_failed || get_failed) ? 1 : 0;
}

}  // namespace

void add_storage_bench(CLI::App& bench) {
  auto* b = bench.add_subcommand("storage", "storage cluster put/get vs raw ISA-L and loopback TCP; get latency "
                                            "with 0-2 nodes down (12 nodes in a child process)");
  auto a = std::make_shared<storage_args>();
  b->add_option("--blocks", a->blocks, "blocks put then got through the cluster")->capture_default_str()->check(
    CLI::PositiveNumber);
  b->add_option("--block-kib", a->block_kib, "block size in KiB")->capture_default_str()->check(CLI::PositiveNumber);
  b->add_option("--reps", a->reps, "repetitions of the raw and loopback measures (median)")
    ->capture_default_str()
    ->check(CLI::Range(5, 1000));
  b->add_option("--loopback-mib", a->loopback_mib, "bytes per loopback transfer, MiB")->capture_default_str()->check(
    CLI::Range(256, 1 << 16));
  b->add_option("--latency-gets", a->latency_gets, "single-block gets per nodes-down point (>= 50)")
    ->capture_default_str()
    ->check(CLI::Range(50, 1 << 20));
  b->add_option("--inflight", a->inflight, "blocks in flight at once for put and get (put_many / get_many batches)")
    ->capture_default_str()
    ->check(CLI::Range(1, 1024));
  b->add_option("--dir", a->dir, "parent directory of the storage nodes' directories (a tmpfs such as /dev/shm "
                                 "takes the disk out of the measure)")
    ->capture_default_str();
  b->add_flag("--fsync", a->fsync, "storage nodes fsync every chunk (sync_policy always)");
  b->add_option("--out", a->out, "JSONL output")->capture_default_str();
  b->callback([a] { run_then_exit("storage", [&] { return run_storage_bench(*a); }); });
}

}  // namespace shoal::tools
