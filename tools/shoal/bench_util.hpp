// Helpers shared by the benchmarks: timing, medians, machine facts, the GEMM peak measured in
// the same run, and JSONL output (one record per point, MEASURE.md).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/metrics.hpp"

namespace shoal::tools {

double now_s();
// The Mooncake conversation trace in ../shared/traces (the benches' default load).
std::string conversation_trace_path();
double median(std::vector<double> v);
using runtime::percentile;  // runtime/metrics.hpp
// splitmix64's finaliser: seeded synthetic token ids for trace replays.
uint64_t splitmix64(uint64_t x);
// OpenBLAS sgemm GFLOP/s at (m, n, k) with OpenBLAS's own threading over `threads`: median of `reps`.
double gemm_gflops(int64_t m, int64_t n, int64_t k, int threads, int reps = 5);
// cores, ISA, BLAS core, git commit.
nlohmann::json machine_facts();
// Appends one JSON record per line to `path` (directories created).
void append_jsonl(const std::string& path, const nlohmann::json& record);
// Runs a bench that joined remote CAF nodes, prints "shoal bench NAME: what" for an exception,
// flushes and ends the process with its exit code (CAF 0.17's teardown can block once a
// remote node was connected).
[[noreturn]] void run_then_exit(const char* name, const std::function<int()>& bench);

}  // namespace shoal::tools
