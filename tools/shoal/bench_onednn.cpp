// The library bf16 GEMM that bench engine sets beside matmul_bf16: oneDNN's matmul, bf16
// activations × bf16 weights → fp32 (Debian's OpenBLAS 0.3.21 has no sbgemm). Its own header
// stays in this file, and it runs in a child process: its OpenMP threads keep spinning after a
// call and would take the cores from the engine's pool for the rest of the bench.
#include "tools/shoal/bench_util.hpp"

#ifdef SHOAL_HAVE_DNNL
#include <algorithm>
#include <cstring>

#include <nlohmann/json.hpp>

#include <oneapi/dnnl/dnnl.hpp>

// libgomp, which Debian's oneDNN runs its threads on (declared here: no -fopenmp needed).
extern "C" void omp_set_num_threads(int n);
#endif

namespace shoal::tools {

#ifdef SHOAL_HAVE_DNNL
namespace {

library_gemm measure(int64_t m, int64_t n, int64_t k, int threads, int reps) {
  try {
    omp_set_num_threads(threads);
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream s(eng);
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    const dnnl::memory::desc x({m, k}, dt::bf16, tag::ab);
    const dnnl::memory::desc w({k, n}, dt::bf16, tag::ba);  // (n, k) rows, as the engine stores weights
    const dnnl::memory::desc y({m, n}, dt::f32, tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(x, w, y), eng);
    const dnnl::matmul mm(pd);
    dnnl::memory xm(x, eng), wm(w, eng), ym(y, eng);
    std::fill_n(static_cast<uint16_t*>(xm.get_data_handle()), m * k, uint16_t{0x3f00});
    auto* wp = static_cast<uint16_t*>(wm.get_data_handle());
    for (int64_t i = 0; i < n * k; ++i) wp[i] = static_cast<uint16_t>(0x3c00 + (i * 53 % 89));
    std::vector<double> rates;
    for (int r = 0; r < reps + 1; ++r) {
      double t0 = now_s();
      mm.execute(s, {{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, ym}});
      s.wait();
      double t = now_s() - t0;
      if (r > 0) rates.push_back(2.0 * m * n * k / t / 1e9);
    }
    return {median(rates), std::string("oneDNN ") + pd.impl_info_str()};
  } catch (const dnnl::error& e) {
    return {0, std::string("oneDNN failed: ") + e.what()};
  }
}

}  // namespace
#endif

std::optional<library_gemm> onednn_bf16_gemm_gflops(int64_t m, int64_t n, int64_t k, int threads, int reps) {
#ifdef SHOAL_HAVE_DNNL
  const auto text = run_in_child([&] {
    const library_gemm g = measure(m, n, k, threads, reps);
    return nlohmann::json{{"gflops", g.gflops}, {"impl", g.impl}}.dump();
  });
  if (!text) return library_gemm{0, "oneDNN not run: its child process failed"};
  const auto j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.contains("gflops")) return library_gemm{0, "oneDNN not run: its child process failed"};
  return library_gemm{j["gflops"].get<double>(), j["impl"].get<std::string>()};
#else
  (void)m, (void)n, (void)k, (void)threads, (void)reps;
  return std::nullopt;
#endif
}

}  // namespace shoal::tools
