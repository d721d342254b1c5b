// Every CPU op against its scalar reference, with the tolerance stated per op; plus the
// batch-invariance property of the fixed-order GEMM (a row's bits do not depend on m).
#include <doctest/doctest.h>

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/reference.hpp"
#include "tests/support/random.hpp"
#include "tests/support/skip.hpp"
#include "kernels/cpu/thread_pool.hpp"

using namespace shoal::kernels;

using shoal::test::randn;
using shoal::test::rel_err;

namespace {

// Runs `body` once per kernel variant this CPU runs (SHOAL_CPU_ISA's choices), then
// restores the one that was active; names the variants it could not run here.
template <class Body>
void for_each_isa(const Body& body) {
  const cpu_isa before = active_isa();
  for (cpu_isa isa : supported_isas()) {
    CAPTURE(to_string(isa));
    REQUIRE(set_isa(isa));
    body();
  }
  set_isa(before);
}

}  // namespace

// The kernel cases above run every variant this CPU runs (for_each_isa); this case stands for
// the avx512 variants, which ctest reports skipped on a CPU without AVX-512.
TEST_CASE("kernel variants: the avx512 variants run on this CPU") {
  if (!cpu_supports(cpu_isa::avx512))
    SHOAL_SKIP("this CPU has no AVX-512: the avx512 variants of the kernel cases were not run");
  const auto isas = supported_isas();
  CHECK(std::find(isas.begin(), isas.end(), cpu_isa::avx512) != isas.end());
}

TEST_CASE("SHOAL_CPU_ISA picks a variant this CPU runs, and a name it lacks or does not know is an error") {
  const cpu_isa before = active_isa();
  const char* old = std::getenv("SHOAL_CPU_ISA");
  const std::string saved = old ? old : "";
  setenv("SHOAL_CPU_ISA", "avx2", 1);
  auto r = select_isa_from_env();
  REQUIRE(r.has_value());
  CHECK(*r == cpu_isa::avx2);
  CHECK(active_isa() == cpu_isa::avx2);
  CHECK(isa_summary() == "avx2 (best " + std::string(to_string(supported_isas().back())) + ", SHOAL_CPU_ISA=avx2)");
  setenv("SHOAL_CPU_ISA", "avx9", 1);
  r = select_isa_from_env();
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().find("SHOAL_CPU_ISA=avx9 is not a kernel variant") != std::string::npos);
  CHECK(active_isa() == cpu_isa::avx2);  // unchanged
  setenv("SHOAL_CPU_ISA", "avx512", 1);
  r = select_isa_from_env();
  CHECK(r.has_value() == cpu_supports(cpu_isa::avx512));
  if (!r) CHECK(r.error().find("needs AVX-512") != std::string::npos);
  unsetenv("SHOAL_CPU_ISA");
  r = select_isa_from_env();
  REQUIRE(r.has_value());
  CHECK(*r == supported_isas().back());
  if (old) setenv("SHOAL_CPU_ISA", saved.c_str(), 1);
  set_isa(before);
}

TEST_CASE("matmul equals the reference (BLAS and fixed-order paths), rel err < 1e-5") {
  for_each_isa([&] {
    for (auto [m, n, k] : {std::tuple{1, 7, 5}, {3, 33, 70}, {17, 64, 129}, {64, 256, 256}, {130, 96, 300}}) {
      auto x = randn(size_t(m) * k, 1), w = randn(size_t(n) * k, 2);
      std::vector<float> ref(size_t(m) * n), fast(ref.size()), inv(ref.size());
      ref::matmul(x.data(), w.data(), ref.data(), m, n, k);
      matmul(x.data(), w.data(), fast.data(), m, n, k, false);
      matmul(x.data(), w.data(), inv.data(), m, n, k, true);
      CHECK(rel_err(fast, ref) < 1e-5);
      CHECK(rel_err(inv, ref) < 1e-5);
    }
  });
}

TEST_CASE("matmul_nn (x · w with a leading dimension) equals the reference, rel err < 1e-5") {
  for (auto [m, n, k, ldw] : {std::tuple{1, 5, 7, 9}, {40, 24, 300, 32}, {256, 16, 700, 24}}) {
    auto x = randn(size_t(m) * k, 21), w = randn(size_t(k) * ldw, 22);
    std::vector<float> ref(size_t(m) * n), fast(ref.size());
    ref::matmul_nn(x.data(), w.data(), ref.data(), m, n, k, ldw);
    matmul_nn(x.data(), w.data(), fast.data(), m, n, k, ldw);
    CHECK(rel_err(fast, ref) < 1e-5);
  }
}

TEST_CASE("matmul_bf16 equals the reference (both paths), invariant path row-independent, rel err < 1e-5") {
  for_each_isa([&] {
    // m = 70: two blocks of x rows in the tile kernel; n = 301: a last tile of one weight row.
    for (auto [m, n, k] : {std::tuple{1, 7, 5}, {3, 130, 70}, {9, 64, 1024}, {40, 1100, 96}, {12, 301, 333}, {70, 301, 200}}) {
      auto x = randn(size_t(m) * k, 31), wf = randn(size_t(n) * k, 32);
      std::vector<uint16_t> w(wf.size());
      for (size_t i = 0; i < w.size(); ++i) {
        uint32_t bits;
        std::memcpy(&bits, &wf[i], sizeof bits);
        w[i] = static_cast<uint16_t>(bits >> 16);
      }
      std::vector<float> ref(size_t(m) * n), fast(ref.size()), one(static_cast<size_t>(n));
      ref::matmul_bf16(x.data(), w.data(), ref.data(), m, n, k);
      for (bool invariant : {true, false}) {
        matmul_bf16(x.data(), w.data(), fast.data(), m, n, k, invariant);
        CHECK(rel_err(fast, ref) < 1e-5);
      }
      matmul_bf16(x.data(), w.data(), fast.data(), m, n, k, true);
      matmul_bf16(x.data() + (m - 1) * k, w.data(), one.data(), 1, n, k, true);
      CHECK(std::equal(one.begin(), one.end(), fast.begin() + (m - 1) * n));
    }
  });
}

TEST_CASE("matmul_fp8 equals the fp64 reference (both paths, every code, stacked block grids), rel err < 1e-5") {
  for_each_isa([&] {
    // Every e4m3 code but NaN decodes as the reference says, subnormals and signs included.
    for (int c = 0; c < 256; ++c) {
      if ((c & 0x7f) == 0x7f) continue;
      const uint8_t code = static_cast<uint8_t>(c);
      const int32_t zero = 0;
      const float one = 1.0f, scale = 1.0f;
      float y = 0;
      matmul_fp8(&one, fp8_matrix{&code, &scale, &zero, 128}, &y, 1, 1, 1, true);
      REQUIRE(double(y) == ref::e4m3_value(code));
    }
    // Every code through the vector paths too: one-hot rows of x pick each code of a 256-wide
    // row (NaN codes replaced by 0), exactly, in the widening, fixed-order and GEMV paths.
    {
      std::vector<uint8_t> row(256);
      for (int c = 0; c < 256; ++c) row[c] = (c & 0x7f) == 0x7f ? 0 : static_cast<uint8_t>(c);
      std::vector<uint8_t> codes4;  // four equal rows, so the GEMV takes its four-row path
      for (int r = 0; r < 4; ++r) codes4.insert(codes4.end(), row.begin(), row.end());
      const float scale[4] = {0.5f, 0.25f, 2.0f, 1.0f};  // two blocks of 128 per row
      const int32_t row_scales[4] = {0, 0, 2, 2};
      const fp8_matrix w{codes4.data(), scale, row_scales, 128};
      std::vector<float> x(256 * 256, 0.0f), y(256 * 4), y1(4);
      for (int i = 0; i < 256; ++i) x[i * 256 + i] = 1.0f;
      for (bool invariant : {true, false}) {
        matmul_fp8(x.data(), w, y.data(), 256, 4, 256, invariant);
        for (int i = 0; i < 256; ++i)
          for (int j = 0; j < 4; ++j)
            REQUIRE(double(y[i * 4 + j]) == ref::e4m3_value(row[i]) * scale[row_scales[j] + i / 128]);
      }
      for (int i = 0; i < 256; i += 37) {
        matmul_fp8(x.data() + i * 256, w, y1.data(), 1, 4, 256, true);
        for (int j = 0; j < 4; ++j) REQUIRE(double(y1[j]) == ref::e4m3_value(row[i]) * scale[row_scales[j] + i / 128]);
      }
    }
    // (m, n, k, block): blocks that divide k, that leave a partial last block, that are not a
    // multiple of 8; n a stack of two tensors with their own scale rows (as gate and up).
    for (auto [m, n, k, block] : {std::tuple{1, 7, 5, 128}, {3, 130, 300, 128}, {9, 64, 1024, 128}, {40, 1100, 96, 32},
                                  {12, 301, 333, 20}, {1, 256, 7168 / 4, 128}}) {
      CAPTURE(m);
      CAPTURE(n);
      CAPTURE(k);
      CAPTURE(block);
      auto x = randn(size_t(m) * k, 41);
      std::vector<uint8_t> codes(size_t(n) * k);
      uint64_t s = 12345;
      for (auto& c : codes) {
        do {
          s = s * 6364136223846793005ull + 1442695040888963407ull;
          c = static_cast<uint8_t>(s >> 56);
        } while ((c & 0x7f) == 0x7f);
      }
      const int64_t block_rows = 128, scale_cols = (k + block - 1) / block;
      const int64_t first = n / 2, second = n - first;  // two stacked tensors
      const int64_t rows_a = (first + block_rows - 1) / block_rows, rows_b = (second + block_rows - 1) / block_rows;
      auto sc = randn(size_t((rows_a + rows_b) * scale_cols), 42);
      for (auto& v : sc) v = std::ldexp(std::fabs(v) + 0.1f, -6);
      std::vector<int32_t> row_scales(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j)
        row_scales[j] = static_cast<int32_t>(
          (j < first ? j / block_rows : rows_a + (j - first) / block_rows) * scale_cols);
      const fp8_matrix w{codes.data(), sc.data(), row_scales.data(), block};
      std::vector<float> reference(size_t(m) * n), fast(reference.size()), one(static_cast<size_t>(n));
      ref::matmul_fp8(x.data(), w, reference.data(), m, n, k);
      for (bool invariant : {true, false}) {
        CAPTURE(invariant);
        matmul_fp8(x.data(), w, fast.data(), m, n, k, invariant);
        CHECK(rel_err(fast, reference) < 1e-5);
      }
      matmul_fp8(x.data(), w, fast.data(), m, n, k, true);
      matmul_fp8(x.data() + (m - 1) * k, w, one.data(), 1, n, k, true);
      CHECK(std::equal(one.begin(), one.end(), fast.begin() + (m - 1) * n));
    }
  });
}

TEST_CASE("batch-invariant matmul: each row's bits are independent of the batch") {
  for_each_isa([&] {
    int64_t n = 96, k = 200;
    auto x = randn(37 * k, 3), w = randn(n * k, 4);
    std::vector<float> all(37 * n);
    matmul(x.data(), w.data(), all.data(), 37, n, k, true);
    for (int64_t row : {0, 5, 36}) {
      std::vector<float> one(n);
      matmul(x.data() + row * k, w.data(), one.data(), 1, n, k, true);
      for (int64_t j = 0; j < n; ++j) REQUIRE(one[j] == all[row * n + j]);
    }
    set_num_threads(1);
    std::vector<float> single(37 * n);
    matmul(x.data(), w.data(), single.data(), 37, n, k, true);
    set_num_threads(2);
    CHECK(single == all);
  });
}

TEST_CASE("rmsnorm, silu_mul, softmax equal the reference, rel err < 1e-5") {
  auto x = randn(5 * 67, 5), w = randn(67, 6);
  std::vector<float> a(x.size()), b(x.size());
  rmsnorm(x.data(), w.data(), a.data(), 5, 67, 1e-6f);
  ref::rmsnorm(x.data(), w.data(), b.data(), 5, 67, 1e-6f);
  CHECK(rel_err(a, b) < 1e-5);
  auto g = randn(100, 7), u = randn(100, 8);
  silu_mul(g.data(), u.data(), a.data(), 100);
  ref::silu_mul(g.data(), u.data(), b.data(), 100);
  a.resize(100), b.resize(100);
  CHECK(rel_err(a, b) < 1e-5);
  auto s1 = randn(50, 9, 4.0f), s2 = s1;
  softmax(s1.data(), 50);
  ref::softmax(s2.data(), 50);
  CHECK(rel_err(s1, s2) < 1e-5);
}

TEST_CASE("rope rotates interleaved pairs like the reference, rel err < 1e-5") {
  int64_t rows = 6, heads = 3, head_stride = 24, rope_dim = 8, row_stride = heads * head_stride;
  auto x = randn(rows * row_stride, 10), y = x;
  std::vector<int32_t> pos = {0, 1, 7, 100, 4000, 65000};
  std::vector<float> inv_freq = {1.0f, 0.1f, 0.01f, 0.001f};
  rope(x.data() + 16, rows, row_stride, heads, head_stride, pos.data(), inv_freq.data(), rope_dim, 1.3f);
  ref::rope(y.data() + 16, rows, row_stride, heads, head_stride, pos.data(), inv_freq.data(), rope_dim, 1.3f);
  CHECK(rel_err(x, y) < 1e-5);
  // position 0 with factor 1 is the identity
  auto z = randn(8, 11), z0 = z;
  int32_t p0 = 0;
  rope(z.data(), 1, 8, 1, 8, &p0, inv_freq.data(), 8, 1.0f);
  CHECK(z == z0);
}

TEST_CASE("moe_gate: noaux_tc group-limited top-k equals the reference exactly in ids") {
  gate_params p{.n_experts = 16, .n_group = 4, .topk_group = 2, .top_k = 4,
                .norm_topk_prob = true, .routed_scaling_factor = 2.5f};
  for (uint32_t seed = 0; seed < 50; ++seed) {
    auto logits = randn(16, 100 + seed), bias = randn(16, 200 + seed, 0.1f);
    int32_t ids[4], ids_ref[4];
    float w[4], w_ref[4];
    moe_gate(logits.data(), bias.data(), p, ids, w);
    ref::moe_gate(logits.data(), bias.data(), p, ids_ref, w_ref);
    float sum = 0;
    for (int k = 0; k < 4; ++k) {
      CHECK(ids[k] == ids_ref[k]);
      CHECK(w[k] == doctest::Approx(w_ref[k]).epsilon(1e-5));
      sum += w[k];
    }
    CHECK(sum == doctest::Approx(2.5f).epsilon(1e-5));
    // chosen experts lie in exactly topk_group groups at most
    int groups = 0;
    bool seen[4] = {};
    for (int k = 0; k < 4; ++k)
      if (!seen[ids[k] / 4]) seen[ids[k] / 4] = true, ++groups;
    CHECK(groups <= 2);
  }
}

TEST_CASE("moe_gate: bias changes selection but not the weights' source") {
  gate_params p{.n_experts = 4, .n_group = 1, .topk_group = 1, .top_k = 1};
  float logits[4] = {2.0f, 1.0f, 0.0f, -1.0f}, bias[4] = {0, 0, 0, 10.0f};
  int32_t id;
  float w;
  moe_gate(logits, bias, p, &id, &w);
  CHECK(id == 3);
  CHECK(w == doctest::Approx(1.0f));  // normalised over the one chosen
}

TEST_CASE("mla_attend over several runs (+sink) equals the reference, rel err < 1e-5") {
  for_each_isa([&] {
    int64_t heads = 4, r = 16, rope = 8, dim = r + rope;
    auto q_lat = randn(heads * r, 12), q_pe = randn(heads * rope, 13), sink = randn(heads, 14);
    auto a = randn(5 * 32, 15), b = randn(3 * dim, 16);
    kv_segment segs[2] = {{a.data(), 5, 32}, {b.data(), 3, dim}};
    kv_run runs[2] = {{reinterpret_cast<const uint8_t*>(a.data()), 5, 32 * 4, kv_elem::f32},
                      {reinterpret_cast<const uint8_t*>(b.data()), 3, dim * 4, kv_elem::f32}};
    std::vector<float> out(heads * r), out_ref(heads * r), scratch(mla_attend_scratch(heads, 8, r, rope));
    for (const float* s : {static_cast<const float*>(nullptr), static_cast<const float*>(sink.data())}) {
      mla_attend(q_lat.data(), q_pe.data(), runs, 2, heads, r, rope, 0.3f, s, out.data(), scratch.data());
      ref::mla_attend(q_lat.data(), q_pe.data(), segs, 2, heads, r, rope, 0.3f, s, out_ref.data());
      CHECK(rel_err(out, out_ref) < 1e-5);
    }
  });
}

TEST_CASE("mla_attend reads bf16 and MXFP8 entries as the values they decode to") {
  for_each_isa([&] {
    const int64_t heads = 4, r = 64, rope = 16, dim = r + rope, n = 9;
    auto q_lat = randn(heads * r, 22), q_pe = randn(heads * rope, 23), x = randn(n * dim, 24);
    for (kv_elem elem : {kv_elem::bf16, kv_elem::e4m3_mx}) {
      CAPTURE(static_cast<int>(elem));
      const size_t eb = kv_entry_bytes(elem, r, rope);
      std::vector<uint8_t> stored(n * eb);
      std::vector<float> widened(n * dim);
      for (int64_t e = 0; e < n; ++e) {
        kv_encode(elem, x.data() + e * dim, r, rope, stored.data() + e * eb);
        kv_decode(elem, stored.data() + e * eb, r, rope, widened.data() + e * dim);
      }
      kv_run runs[2] = {{stored.data(), 4, static_cast<int64_t>(eb), elem},
                        {stored.data() + 4 * eb, n - 4, static_cast<int64_t>(eb), elem}};
      kv_segment seg{widened.data(), n, dim};
      std::vector<float> out(heads * r), out_ref(heads * r), scratch(mla_attend_scratch(heads, n, r, rope));
      mla_attend(q_lat.data(), q_pe.data(), runs, 2, heads, r, rope, 0.2f, nullptr, out.data(), scratch.data());
      ref::mla_attend(q_lat.data(), q_pe.data(), &seg, 1, heads, r, rope, 0.2f, nullptr, out_ref.data());
      CHECK(rel_err(out, out_ref) < 1e-5);
    }
  });
}

TEST_CASE("kv entry forms: sizes, bf16 rounding to nearest even, and the error each form allows") {
  CHECK(kv_entry_bytes(kv_elem::f32, 256, 64) == 1280);
  CHECK(kv_entry_bytes(kv_elem::bf16, 256, 64) == 640);
  CHECK(kv_entry_bytes(kv_elem::e4m3_mx, 256, 64) == 256 + 8 + 128);
  CHECK(kv_entry_bytes(kv_elem::e4m3_mx, 512, 64) == 656);  // FlashMLA's size for V3's entry
  CHECK(kv_entry_bytes(kv_elem::e4m3_mx, 16, 8) == 18 + 16);  // 16 + 1 scale, padded to even
  CHECK(bf16_from_float(1.0f) == 0x3F80);
  CHECK(bf16_to_float(bf16_from_float(1.0f + 0x1p-8f)) == 1.0f);           // tie → even
  CHECK(bf16_to_float(bf16_from_float(1.0f + 3 * 0x1p-8f)) == 1.0f + 0x1p-6f);  // tie → even (up)
  CHECK(std::isnan(bf16_to_float(bf16_from_float(NAN))));
  const int64_t r = 256, rope = 64;
  auto x = randn(r + rope, 31);
  for (kv_elem elem : {kv_elem::f32, kv_elem::bf16, kv_elem::e4m3_mx}) {
    CAPTURE(static_cast<int>(elem));
    std::vector<float> y = x;
    kv_round(elem, y.data(), r, rope);
    // Per value: bf16 keeps 8 significant bits (|err| ≤ half an ulp ≤ 2^-8 |x|). e4m3 keeps 4
    // (≤ 2^-4 |x|)
    // above its block's subnormal range, whose half step 2^-10 · 2^s is ≤ 2^-18 · (block max);
    // the OCP scale rule clips values above 448 · 2^s, by at most 1/8 of |x|.
    for (int64_t i = 0; i < r + rope; ++i) {
      const bool latent_fp8 = elem == kv_elem::e4m3_mx && i < r;
      float amax = 0;
      for (int64_t k = i / 32 * 32; latent_fp8 && k < std::min<int64_t>(r, i / 32 * 32 + 32); ++k)
        amax = std::max(amax, std::fabs(x[k]));
      const double bound = elem == kv_elem::f32 ? 0.0
                           : latent_fp8         ? std::max(std::fabs(x[i]) * 0x1p-3, amax * 0x1p-18)
                                                : std::fabs(x[i]) * 0x1p-8;
      CHECK(std::fabs(double(y[i]) - x[i]) <= bound);
    }
    std::vector<float> z = y;  // rounding a rounded entry changes nothing
    kv_round(elem, z.data(), r, rope);
    CHECK(z == y);
  }
}

TEST_CASE("parallel_for covers every index exactly once") {
  std::vector<int> hits(1000, 0);
  parallel_for(1000, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[i]++;
  });
  for (int h : hits) REQUIRE(h == 1);
}

TEST_CASE("pin_to_cpus restricts the calling thread to the CPUs given, and refuses CPUs it may not use") {
  const int before = available_cpus();
  REQUIRE(before >= 1);
  std::string ok = "not run", bad_range, bad_empty;
  int inside = 0;
  std::thread t([&] {  // the test process keeps its own mask
    bad_range = pin_to_cpus({100000});
    bad_empty = pin_to_cpus({});
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return;
    int first = 0;
    while (!CPU_ISSET(first, &set)) ++first;
    ok = pin_to_cpus({first});
    inside = available_cpus();
  });
  t.join();
  CHECK(ok.empty());
  CHECK(inside == 1);
  CHECK(bad_range.find("CPU 100000") != std::string::npos);
  CHECK(bad_empty == "no CPUs given");
  CHECK(available_cpus() == before);
}
