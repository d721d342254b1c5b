// Benchmark helpers: clocks, medians, GEMM peak, machine facts, JSONL.
#include "tools/shoal/bench_util.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string_view>
#include <thread>

#include <immintrin.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cblas.h>
#include <fmt/core.h>

#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "model/weights.hpp"

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

double engine_bf16_gemm_gflops(int64_t m, int64_t n, int64_t k, int reps) {
  std::vector<float> x(static_cast<size_t>(m * k), 0.5f), y(static_cast<size_t>(m * n));
  std::vector<uint16_t> w(static_cast<size_t>(n * k));
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<uint16_t>(0x3c00 + (i * 53 % 89));
  std::vector<double> rates;
  for (int r = 0; r < reps + 1; ++r) {
    double t0 = now_s();
    kernels::matmul_bf16(x.data(), w.data(), y.data(), m, n, k, false);
    double t = now_s() - t0;
    if (r > 0) rates.push_back(2.0 * m * n * k / t / 1e9);
  }
  return median(rates);
}

memory_bandwidth measure_bandwidth(int64_t bytes, int reps) {
  const int64_t n = bytes / 4 / 3 / 64 * 64;  // floats per array (three arrays for the triad)
  // On 2 MiB pages like the engine's weights (model::back_with_huge_pages).
  std::vector<float> a, b, c;
  for (auto [v, x] : {std::pair{&a, 1.0f}, {&b, 2.0f}, {&c, 0.5f}}) {
    v->reserve(static_cast<size_t>(n));
    model::back_with_huge_pages(v->data(), static_cast<size_t>(n) * sizeof(float));
    v->assign(static_cast<size_t>(n), x);
  }
  const int64_t parts = int64_t{kernels::num_threads()} * 16, per = n / parts / 128 * 128;  // eight streams of 16-float steps
  std::vector<double> read, triad;
  std::vector<float> sink(static_cast<size_t>(parts));
  for (int r = 0; r < reps + 1; ++r) {
    double t0 = now_s();
    kernels::parallel_for(parts, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        // Eight places of the part read side by side: one sequential stream per thread
        // reached 19.8-22.9 GB/s on a 2-vCPU Ice Lake where eight reached 31.4 (and 12 or
        // 16 no more): the limit a kernel can reach, not what one stream gets.
        const float* src = (p % 3 == 0 ? a : p % 3 == 1 ? b : c).data() + p * per;
        constexpr int streams = 8;
        const int64_t sub = per / streams;
        __m256 s[streams];
        for (auto& v : s) v = _mm256_setzero_ps();
        for (int64_t i = 0; i < sub; i += 16)
          for (int q = 0; q < streams; ++q)
            s[q] = _mm256_add_ps(s[q], _mm256_add_ps(_mm256_loadu_ps(src + q * sub + i),
                                                     _mm256_loadu_ps(src + q * sub + i + 8)));
        for (int q = 1; q < streams; ++q) s[0] = _mm256_add_ps(s[0], s[q]);
        alignas(32) float out[8];
        _mm256_store_ps(out, s[0]);
        sink[static_cast<size_t>(p)] = out[0] + out[7];
      }
    });
    double t = now_s() - t0;
    if (r > 0) read.push_back(double(parts * per) * 4 / t / 1e9);
    t0 = now_s();
    kernels::parallel_for(parts, [&](int64_t p0, int64_t p1) {
      const __m256 s = _mm256_set1_ps(3.0f);
      for (int64_t p = p0; p < p1; ++p)
        for (int64_t i = p * per; i < (p + 1) * per; i += 8)
          _mm256_storeu_ps(a.data() + i, _mm256_fmadd_ps(s, _mm256_loadu_ps(c.data() + i), _mm256_loadu_ps(b.data() + i)));
    });
    t = now_s() - t0;
    if (r > 0) triad.push_back(double(parts * per) * 12 / t / 1e9);
  }
  if (sink[0] == 12345.0f) std::fprintf(stderr, " ");  // keeps the sums alive
  return {median(read), median(triad)};
}

int64_t checkpoint_bytes(const std::string& dir) {
  int64_t total = 0;
  std::error_code ec;
  if (dir.empty()) return 0;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") total += static_cast<int64_t>(e.file_size(ec));
  return total;
}

std::optional<std::string> run_in_child(const std::function<std::string()>& fn) {
  int fds[2];
  if (::pipe(fds) != 0) return std::nullopt;
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return std::nullopt;
  }
  if (pid == 0) {
    ::close(fds[0]);
    const std::string text = fn();
    const bool written = ::write(fds[1], text.data(), text.size()) == static_cast<ssize_t>(text.size());
    std::_Exit(written ? 0 : 1);
  }
  ::close(fds[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return text;
}

int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return int64_t{u.ru_maxrss} * 1024;
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

double counter_sum(std::string_view text, std::string_view name) {
  double sum = 0;
  std::istringstream in{std::string(text)};
  for (std::string l; std::getline(in, l);) {
    if (l.empty() || l[0] == '#' || l.compare(0, name.size(), name) != 0) continue;
    if (l.size() > name.size() && l[name.size()] != '{' && l[name.size()] != ' ') continue;
    const auto sp = l.rfind(' ');
    if (sp != std::string::npos) sum += std::strtod(l.c_str() + sp + 1, nullptr);
  }
  return sum;
}

}  // namespace shoal::tools
