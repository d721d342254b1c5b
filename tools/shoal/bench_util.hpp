// Helpers shared by the benchmarks: timing, medians, machine facts, the GEMM peak measured in
// the same run, and JSONL output (one record per point, MEASURE.md).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/base/metrics.hpp"

namespace shoal::tools {

double now_s();
// The Mooncake conversation trace in ../shared/traces (the benches' default load).
std::string conversation_trace_path();
double median(std::vector<double> v);
using runtime::percentile;  // runtime/base/metrics.hpp
// splitmix64's finaliser: seeded synthetic token ids for trace replays.
uint64_t splitmix64(uint64_t x);
// OpenBLAS sgemm GFLOP/s at (m, n, k) with OpenBLAS's own threading over `threads`: median of `reps`.
double gemm_gflops(int64_t m, int64_t n, int64_t k, int threads, int reps = 5);
// bf16 GEMM GFLOP/s at (m, n, k), x (m, k) · w (n, k)ᵀ through the engine's matmul_bf16 (x
// fp32, w bf16; the pool's threads).
double engine_bf16_gemm_gflops(int64_t m, int64_t n, int64_t k, int reps = 5);
// A library's bf16 GEMM at the same shape: Debian's OpenBLAS 0.3.21 is built without
// BUILD_BFLOAT16 (no cblas_sbgemm), so oneDNN's matmul (bf16 x bf16 -> fp32) on `threads`
// OpenMP threads; its implementation's name in `impl`. Nothing when the build has no oneDNN.
struct library_gemm {
  double gflops = 0;
  std::string impl;
};
std::optional<library_gemm> onednn_bf16_gemm_gflops(int64_t m, int64_t n, int64_t k, int threads, int reps = 5);
// Memory bandwidth on the pool's threads over buffers far larger than the caches, GB/s
// (10^9 bytes): a read-only streaming sum, and a triad a = b + s·c counted as 12 bytes per
// element (STREAM's convention: the write-allocate read is not counted). Medians of `reps`.
struct memory_bandwidth {
  double read_gbs = 0, triad_gbs = 0;
};
memory_bandwidth measure_bandwidth(int64_t bytes = int64_t{512} << 20, int reps = 5);
// Bytes of the checkpoint's *.safetensors files in `dir` (0 without a directory).
int64_t checkpoint_bytes(const std::string& dir);
// Runs `fn` in a forked child process (its own memory and threads: a peak RSS of its own, a
// library's threads that outlive the call) and returns the text it returned, written back
// over a pipe; nothing when the child died first.
std::optional<std::string> run_in_child(const std::function<std::string()>& fn);
// The process's peak resident set so far, bytes (getrusage).
int64_t peak_rss_bytes();
// cores, ISA, BLAS core, git commit.
nlohmann::json machine_facts();
// Sum of a Prometheus counter in exposition text over its label sets; `name` may include one
// label set (`x_total{path="bulk"}`) to read that series only.
double counter_sum(std::string_view text, std::string_view name);
// Appends one JSON record per line to `path` (directories created).
void append_jsonl(const std::string& path, const nlohmann::json& record);
// Runs a bench that joined remote CAF nodes, prints "shoal bench NAME: what" for an exception,
// flushes and ends the process with its exit code (CAF 0.17's teardown can block once a
// remote node was connected).
[[noreturn]] void run_then_exit(const char* name, const std::function<int()>& bench);

}  // namespace shoal::tools
