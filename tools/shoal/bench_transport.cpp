// shoal bench transport: the bulk path of a prefill → decode handoff (runtime::transport over
// libfabric) against a raw fi_read loop on the same provider in the same run (MEASURE.md:
// ratios against a reference measured beside the figure). Owner and reader are two endpoints
// of this process; every transport read is checked (crc32c) and compared to the source bytes.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <cstring>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/shoal/bench_util.hpp"
#include "tools/shoal/commands.hpp"
#include "transport/fabric_transport.hpp"

namespace shoal::tools {

namespace {

struct transport_args {
  std::vector<std::string> providers{"shm", "tcp;ofi_rxm"};
  int mib = 128;
  int block_kib = 512;
  int inflight = 16;
  int reps = 5;
  std::string out = "bench-results/transport.jsonl";
};

// Seconds for every range through `reader`, `inflight` at a time; -1 on a failed read.
double transport_seconds(runtime::transport& reader, const std::vector<runtime::remote_memory>& ranges,
                         std::vector<std::byte>& dst, size_t inflight) {
  std::vector<std::shared_ptr<runtime::transfer>> out;
  const double t0 = now_s();
  size_t off = 0, next = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    while (i - next >= inflight) out[next++]->wait();
    out.push_back(reader.read(ranges[i], {dst.data() + off, ranges[i].length}, std::chrono::seconds(30)));
    off += ranges[i].length;
  }
  for (auto& t : out) t->wait();
  const double t1 = now_s();
  for (auto& t : out)
    if (!t->ok()) {
      fmt::print(stderr, "transport read failed: {}\n", t->error());
      return -1;
    }
  return t1 - t0;
}

int run_transport_bench(const transport_args& a) {
  nlohmann::json base = machine_facts();
  const size_t bytes = static_cast<size_t>(a.mib) << 20, block = static_cast<size_t>(a.block_kib) << 10;
  std::vector<std::byte> src(bytes);
  std::mt19937_64 rng(7);
  for (auto& b : src) b = static_cast<std::byte>(rng());
  int failed = 0;
  for (const auto& provider : a.providers) {
    transport::fabric_config cfg{provider, provider == "shm" ? "" : "127.0.0.1"};
    auto owner = transport::fabric_transport::create(cfg);
    auto reader = transport::fabric_transport::create(cfg);
    if (!owner || !reader) {
      fmt::print("{}: {}\n", provider, owner ? reader.error() : owner.error());
      ++failed;
      continue;
    }
    auto reg = (*owner)->register_memory(src);
    if (!reg) {
      fmt::print("{}: {}\n", provider, reg.error());
      ++failed;
      continue;
    }
    std::vector<runtime::remote_memory> ranges;
    for (size_t off = 0; off < bytes; off += block) ranges.push_back((*reg)->describe(off, std::min(block, bytes - off)));
    std::vector<std::byte> dst(bytes);
    std::vector<double> ours, raw;
    bool exact = true;
    for (int r = 0; r < a.reps; ++r) {
      std::memset(dst.data(), 0, dst.size());
      double t = transport_seconds(**reader, ranges, dst, static_cast<size_t>(a.inflight));
      exact = exact && t > 0 && std::memcmp(dst.data(), src.data(), bytes) == 0;
      ours.push_back(t);
      auto rt = transport::raw_read_seconds(cfg, ranges, dst, static_cast<size_t>(a.inflight));
      if (!rt) {
        fmt::print("{}: raw loop: {}\n", provider, rt.error());
        exact = false;
        break;
      }
      raw.push_back(*rt);
    }
    if (!exact || ours.empty() || raw.empty()) {
      fmt::print("{}: reads failed or differ from the source\n", provider);
      ++failed;
      continue;
    }
    const double gb = static_cast<double>(bytes) / 1e9;
    const double ours_gbps = gb / median(ours), raw_gbps = gb / median(raw);
    fmt::print("{:12s} {} MiB in {} KiB reads, {} in flight: transport {:.2f} GB/s, raw fi_read {:.2f} GB/s, "
               "ratio {:.2f} (median of {})\n",
               provider, a.mib, a.block_kib, a.inflight, ours_gbps, raw_gbps, ours_gbps / raw_gbps, a.reps);
    nlohmann::json r = base;
    r["bench"] = "transport";
    r["provider"] = provider;
    r["bytes"] = bytes;
    r["block_bytes"] = block;
    r["inflight"] = a.inflight;
    r["transport_gbps"] = ours_gbps;
    r["raw_fi_read_gbps"] = raw_gbps;
    r["ratio"] = ours_gbps / raw_gbps;
    r["bit_exact"] = exact;
    append_jsonl(a.out, r);
  }
  return failed ? 1 : 0;
}

}  // namespace

void add_transport_bench(CLI::App& bench) {
  auto* b = bench.add_subcommand("transport", "handoff bulk path (libfabric RMA reads through runtime::transport) vs a "
                                              "raw fi_read loop on the same provider");
  auto a = std::make_shared<transport_args>();
  b->add_option("--provider", a->providers, "libfabric providers (shm, tcp;ofi_rxm on loopback)")->capture_default_str();
  b->add_option("--mib", a->mib, "bytes read per repetition, MiB")->capture_default_str()->check(CLI::Range(1, 4096));
  b->add_option("--block-kib", a->block_kib, "bytes per read, KiB (a KV block)")->capture_default_str()->check(
    CLI::Range(4, 65536));
  b->add_option("--inflight", a->inflight, "reads in flight at once")->capture_default_str()->check(CLI::Range(1, 512));
  b->add_option("--reps", a->reps, "repetitions (median)")->capture_default_str()->check(CLI::Range(1, 100));
  b->add_option("--out", a->out, "JSONL output")->capture_default_str();
  b->callback([a] { std::exit(run_transport_bench(*a)); });
}

}  // namespace shoal::tools
