// Benchmark helpers: clocks, medians, GEMM peak, machine facts, JSONL.
#include "tools/shoal/bench_util.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <cblas.h>
#include "kernels/cpu/isa.hpp"
#include <fmt/core.h>

namespace shoal::tools {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

#ifndef SHOAL_DEFAULT_TRACES_DIR
#define SHOAL_DEFAULT_TRACES_DIR ""
#endif

std::string conversation_trace_path() {
  return std::string(SHOAL_DEFAULT_TRACES_DIR) + "/mooncake/conversation_trace.jsonl";
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double gemm_gflops(int64_t m, int64_t n, int64_t k, int threads, int reps) {
  std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(n * k)), c(static_cast<size_t>(m * n));
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1, 1);
  for (auto& x : a) x = d(rng);
  for (auto& x : b) x = d(rng);
  std::vector<double> rates;
  // OpenBLAS with its own threads at the engine's thread count: the peer to compare with.
  int saved = openblas_get_num_threads();
  openblas_set_num_threads(threads);
  for (int r = 0; r < reps + 1; ++r) {
    double t0 = now_s();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, a.data(), static_cast<int>(k), b.data(), static_cast<int>(k), 0.0f,
                c.data(), static_cast<int>(n));
    double t = now_s() - t0;
    if (r > 0) rates.push_back(2.0 * m * n * k / t / 1e9);  // first run warms up
  }
  openblas_set_num_threads(saved);
  return median(rates);
}

namespace {

// /proc/cpuinfo's first "model name", and whether its first "flags" line lists `flag`.
std::string cpuinfo_field(const std::string& key) {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) {
      auto colon = line.find(':');
      return colon == std::string::npos ? "" : line.substr(colon + 2);
    }
  return "";
}
std::string cpu_model_name() {
  std::string m = cpuinfo_field("model name");
  return m.empty() ? "unknown" : m;
}
bool cpu_has_flag(const std::string& flag) {
  const std::string flags = " " + cpuinfo_field("flags") + " ";
  return flags.find(" " + flag + " ") != std::string::npos;
}

}  // namespace

nlohmann::json machine_facts() {
  nlohmann::json j;
  j["cores"] = std::thread::hardware_concurrency();
  j["cpu"] = cpu_model_name();
  j["isa"] = std::string(kernels::to_string(kernels::active_isa()));  // the kernels' variant in use
  j["isa_best"] = std::string(kernels::to_string(kernels::supported_isas().back()));
  j["cpu_flags"] = {{"avx512f", bool(__builtin_cpu_supports("avx512f"))},
                    {"avx512bf16", cpu_has_flag("avx512_bf16")},
                    {"amx_bf16", cpu_has_flag("amx_bf16")}};
  j["blas_core"] = openblas_get_corename();
  j["blas_threads"] = openblas_get_num_threads();
  std::string commit = "unknown";
  if (FILE* p = popen("git rev-parse --short HEAD 2>/dev/null", "r")) {
    char buf[64] = {};
    if (fgets(buf, sizeof buf, p)) commit = std::string(buf, strcspn(buf, "\n"));
    pclose(p);
  }
  j["commit"] = commit;
  return j;
}

void append_jsonl(const std::string& path, const nlohmann::json& record) {
  std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  std::ofstream f(path, std::ios::app);
  f << record.dump() << "\n";
}

void run_then_exit(const char* name, const std::function<int()>& bench) {
  int rc = 1;
  try {
    rc = bench();
  } catch (const std::exception& e) {
    fmt::print(stderr, "shoal bench {}: {}\n", name, e.what());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(rc);
}

}  // namespace shoal::tools
