// Every CUDA op (kernels/cuda/ops.cuh) against the scalar CPU reference on random inputs, with
// the normalised error max|gpu − ref| / max|ref| < 1e-5 for all float outputs (the CPU suite's
// bound; fp32 on both devices, the reference accumulates in double) and exact expert ids for
// moe_gate. Labelled gpu: without a CUDA device every case prints a message and passes.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/cpu/reference.hpp"
#include "tests/support/random.hpp"
#include "tests/support/skip.hpp"
#include "kernels/cuda/ops.cuh"

using shoal::kernels::gate_params;
using shoal::kernels::kv_segment;
using shoal::kernels::cuda::device_buffer;
namespace cu = shoal::kernels::cuda;
namespace ref = shoal::kernels::ref;

using shoal::test::randn;
using shoal::test::rel_err;

namespace {

constexpr double tolerance = 1e-5;

}  // namespace

TEST_CASE("cuda matmul equals the reference, rel err < 1e-5, and is batch invariant") {
  if (shoal::kernels::cuda::cuda_device_count() == 0) SHOAL_SKIP("no CUDA device on this machine");
  for (auto [m, n, k] : {std::tuple{1, 7, 5}, {3, 33, 70}, {17, 64, 129}, {64, 256, 256},
                         {130, 96, 300}, {65, 129, 17}}) {
    auto x = randn(size_t(m) * k, 1), w = randn(size_t(n) * k, 2);
    std::vector<float> want(size_t(m) * n);
    ref::matmul(x.data(), w.data(), want.data(), m, n, k);
    auto dx = device_buffer::of(x), dw = device_buffer::of(w);
    device_buffer dy(want.size() * sizeof(float));
    cu::matmul(dx.data<float>(), dw.data<float>(), dy.data<float>(), m, n, k);
    CHECK(rel_err(dy.download<float>(), want) < tolerance);
  }
  // a row's bits do not depend on how many rows share the launch
  int64_t m = 37, n = 96, k = 200;
  auto dx = device_buffer::of(randn(m * k, 3)), dw = device_buffer::of(randn(n * k, 4));
  device_buffer all(m * n * sizeof(float)), one(n * sizeof(float));
  cu::matmul(dx.data<float>(), dw.data<float>(), all.data<float>(), m, n, k);
  auto all_h = all.download<float>();
  for (int64_t row : {0, 5, 36}) {
    cu::matmul(dx.data<float>() + row * k, dw.data<float>(), one.data<float>(), 1, n, k);
    auto one_h = one.download<float>();
    for (int64_t j = 0; j < n; ++j) REQUIRE(one_h[j] == all_h[row * n + j]);
  }
}

TEST_CASE("cuda rmsnorm equals the reference (also in place), rel err < 1e-5") {
  if (shoal::kernels::cuda::cuda_device_count() == 0) SHOAL_SKIP("no CUDA device on this machine");
  for (auto [rows, dim] : {std::pair{5, 67}, {3, 7168}, {1, 1}}) {
    auto x = randn(size_t(rows) * dim, 5), w = randn(dim, 6);
    std::vector<float> want(x.size());
    ref::rmsnorm(x.data(), w.data(), want.data(), rows, dim, 1e-6f);
    auto dx = device_buffer::of(x), dw = device_buffer::of(w);
    device_buffer dy(x.size() * sizeof(float));
    cu::rmsnorm(dx.data<float>(), dw.data<float>(), dy.data<float>(), rows, dim, 1e-6f);
    CHECK(rel_err(dy.download<float>(), want) < tolerance);
    cu::rmsnorm(dx.data<float>(), dw.data<float>(), dx.data<float>(), rows, dim, 1e-6f);
    CHECK(rel_err(dx.download<float>(), want) < tolerance);
  }
}

TEST_CASE("cuda rope equals the reference on strided heads and large positions, rel err < 1e-5") {
  if (shoal::kernels::cuda::cuda_device_count() == 0) SHOAL_SKIP("no CUDA device on this machine");
  // DeepSeek-like q: per head 128 nope values then 64 rope values; x points at the rope part.
  const int64_t rows = 4, heads = 3, nope = 128, rope_dim = 64, head_stride = nope + rope_dim;
  const int64_t row_stride = heads * head_stride + 8;  // padded rows
  std::vector<int32_t> positions = {0, 7, 4095, 163839};
  std::vector<float> inv_freq(rope_dim / 2);
  for (int64_t i = 0; i < rope_dim / 2; ++i)
    inv_freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * double(i) / double(rope_dim)));
  auto x = randn(size_t(rows * row_stride), 7), want = x;
  ref::rope(want.data() + nope, rows, row_stride, heads, head_stride, positions.data(),
            inv_freq.data(), rope_dim, 1.25f);
  auto dx = device_buffer::of(x), dpos = device_buffer::of(positions), dfreq = device_buffer::of(inv_freq);
  cu::rope(dx.data<float>() + nope, rows, row_stride, heads, head_stride, dpos.data<int32_t>(),
           dfreq.data<float>(), rope_dim, 1.25f);
  auto got = dx.download<float>();
  CHECK(rel_err(got, want) < tolerance);
  for (int64_t r = 0; r < rows; ++r)  // values outside the rope parts are untouched
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < nope; ++i) {
        size_t at = size_t(r * row_stride + h * head_stride + i);
        REQUIRE(got[at] == x[at]);
      }
}

TEST_CASE("cuda silu_mul and row-wise softmax equal the reference, rel err < 1e-5") {
  if (shoal::kernels::cuda::cuda_device_count() == 0) SHOAL_SKIP("no CUDA device on this machine");
  auto g = randn(10000, 8, 3.0f), u = randn(10000, 9);
  std::vector<float> want(g.size());
  ref::silu_mul(g.data(), u.data(), want.data(), int64_t(g.size()));
  auto dg = device_buffer::of(g), du = device_buffer::of(u);
  device_buffer dout(g.size() * sizeof(float));
  cu::silu_mul(dg.data<float>(), du.data<float>(), dout.data<float>(), int64_t(g.size()));
  CHECK(rel_err(dout.download<float>(), want) < tolerance);

  for (auto [rows, n] : {std::pair{7, 1000}, {1, 50}, {3, 3000}}) {
    auto x = randn(size_t(rows) * n, 10, 4.0f), expect = x;
    for (int r = 0; r < rows; ++r) ref::softmax(expect.data() + size_t(r) * n, n);
    auto dx = device_buffer::of(x);
    cu::softmax(dx.data<float>(), rows, n);
    CHECK(rel_err(dx.download<float>(), expect) < tolerance);
  }
}

namespace {

// Runs cuda moe_gate on n_tokens tokens and checks ids exactly and weights (rel err) against
// the reference token by token. Returns the GPU ids.
std::vector<int32_t> check_gate(const std::vector<float>& logits, const std::vector<float>* bias,
                                const gate_params& p, int64_t n_tokens) {
  auto dl = device_buffer::of(logits);
  device_buffer db = bias ? device_buffer::of(*bias) : device_buffer();
  device_buffer dids(size_t(n_tokens * p.top_k) * sizeof(int32_t));
  device_buffer dw(size_t(n_tokens * p.top_k) * sizeof(float));
  cu::moe_gate(dl.data<float>(), bias ? db.data<float>() : nullptr, p, dids.data<int32_t>(),
               dw.data<float>(), n_tokens);
  auto ids = dids.download<int32_t>();
  auto weights = dw.download<float>();
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::vector<int32_t> want_ids(p.top_k);
    std::vector<float> want_w(p.top_k);
    ref::moe_gate(logits.data() + t * p.n_experts, bias ? bias->data() : nullptr, p,
                  want_ids.data(), want_w.data());
    std::vector<int32_t> got_ids(ids.begin() + t * p.top_k, ids.begin() + (t + 1) * p.top_k);
    std::vector<float> got_w(weights.begin() + t * p.top_k, weights.begin() + (t + 1) * p.top_k);
    CAPTURE(t);
    CHECK(got_ids == want_ids);
    CHECK(rel_err(got_w, want_w) < tolerance);
  }
  return ids;
}

}  // namespace

TEST_CASE("cuda moe_gate picks the reference's experts and weights") {
  if (shoal::kernels::cuda::cuda_device_count() == 0) SHOAL_SKIP("no CUDA device on this machine");
  SUBCASE("DeepSeek-V3 routing: 256 experts, 8 groups, keep 4, top 8, bias") {
    gate_params p{.n_experts = 256, .n_group = 8, .topk_group = 4, .top_k = 8,
                  .norm_topk_prob = true, .routed_scaling_factor = 2.5f};
    auto logits = randn(size_t(16 * p.n_experts), 11, 2.0f), bias = randn(p.n_experts, 12, 0.1f);
    check_gate(logits, &bias, p, 16);
  }
  SUBCASE("one group, no bias, unnormalised weights") {
    gate_params p{.n_experts = 64, .n_group = 1, .topk_group = 1, .top_k = 6,
                  .norm_topk_prob = false, .routed_scaling_factor = 1.0f};
    check_gate(randn(size_t(5 * p.n_experts), 13), nullptr, p, 5);
  }
  SUBCASE("many exact ties: logits from {0, 0.5, 1, 1.5}") {
    gate_params p{.n_experts = 64, .n_group = 8, .topk_group = 3, .top_k = 6,
                  .norm_topk_prob = true, .routed_scaling_factor = 1.0f};
    std::mt19937 rng(14);
    std::vector<float> logits(size_t(9 * p.n_experts));
    for (auto& v : logits) v = 0.5f * float(rng() % 4);
    check_gate(logits, nullptr, p, 9);
  }
  SUBCASE("all groups tie: the lower groups and the lower experts win") {
    gate_params p{.n_experts = 32, .n_group = 4, .topk_group = 2, .top_k = 4,
                  .norm_topk_prob = true, .routed_scaling_factor = 2.0f};
    std::vector<float> logits(32, 0.0f);
    for (int e = 0; e < 32; ++e)
      if (e % 8 == 3 || e % 8 == 5) logits[e] = 1.0f;
    CHECK(check_gate(logits, nullptr, p, 1) == std::vector<int32_t>{3, 5, 11, 13});
  }
}

TEST_CASE("cuda mla_attend over strided segments equals the reference, rel err < 1e-5") {
  if (shoal::kernels::cuda::cuda_device_count() == 0) SHOAL_SKIP("no CUDA device on this machine");
  const int64_t heads = 16, r = 512, rope = 64;
  const float scale = 1.0f / std::sqrt(float(r + rope));
  // (count, stride) per segment, laid out one after another in one arena; an empty one too.
  const std::vector<std::pair<int64_t, int64_t>> shape = {{5, 576}, {70, 600}, {0, 576}, {1, 576}, {33, 640}};
  std::vector<int64_t> offsets;
  int64_t arena_size = 0;
  for (auto [count, stride] : shape) {
    offsets.push_back(arena_size);
    arena_size += count * stride;
  }
  auto arena = randn(size_t(arena_size), 15, 2.0f);
  auto q_lat = randn(size_t(heads * r), 16), q_pe = randn(size_t(heads * rope), 17);
  auto sink = randn(size_t(heads), 18, 3.0f);
  auto d_arena = device_buffer::of(arena), d_lat = device_buffer::of(q_lat);
  auto d_pe = device_buffer::of(q_pe), d_sink = device_buffer::of(sink);
  std::vector<kv_segment> host_segs, dev_segs;
  for (size_t s = 0; s < shape.size(); ++s) {
    host_segs.push_back({arena.data() + offsets[s], shape[s].first, shape[s].second});
    dev_segs.push_back({d_arena.data<float>() + offsets[s], shape[s].first, shape[s].second});
  }
  auto d_segs = device_buffer::of(dev_segs);
  device_buffer d_out(size_t(heads * r) * sizeof(float));
  for (int n_segments : {int(shape.size()), 1, 3})
    for (bool with_sink : {false, true}) {
      CAPTURE(n_segments);
      CAPTURE(with_sink);
      std::vector<float> want(size_t(heads * r));
      ref::mla_attend(q_lat.data(), q_pe.data(), host_segs.data(), n_segments, heads, r, rope,
                      scale, with_sink ? sink.data() : nullptr, want.data());
      cu::mla_attend(d_lat.data<float>(), d_pe.data<float>(), d_segs.data<kv_segment>(),
                     n_segments, heads, r, rope, scale,
                     with_sink ? d_sink.data<float>() : nullptr, d_out.data<float>());
      CHECK(rel_err(d_out.download<float>(), want) < tolerance);
    }
  // only an empty segment and a sink: the sink takes all the mass, the output is zero
  cu::mla_attend(d_lat.data<float>(), d_pe.data<float>(), d_segs.data<kv_segment>() + 2, 1, heads,
                 r, rope, scale, d_sink.data<float>(), d_out.data<float>());
  for (float v : d_out.download<float>()) REQUIRE(v == 0.0f);
}
