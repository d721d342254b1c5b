// The CPU ops, threaded through parallel_for. GEMMs above a size threshold go to OpenBLAS
// unless batch-invariant mode asks for the fixed-order kernel; the fixed-order dot products
// and the widening of bf16 / FP8 weights come from the active instruction-set variant
// (kernels/cpu/variants.hpp); the remaining ops are AVX2.
#include "kernels/cpu/ops.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include <cblas.h>

#include "kernels/assert.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "kernels/cpu/variants.hpp"

namespace shoal::kernels {
namespace {

constexpr int64_t blas_min_flops = 1 << 20;  // below this the fixed-order kernel is as fast
// With the variant's bf16 tile kernel, widening into OpenBLAS pays from this many rows of x
// (measured at n = 18,432, k = 1,024 on 2 Ice Lake threads: tiles 148 GFLOP/s at 32 and 64
// rows, widened sgemm 96 and 142; at 128 rows 143 vs 177).
constexpr int64_t bf16_blas_rows = 96;

// y (m, n) = x · wᵀ for m ≥ 8 through OpenBLAS: `widen(c0, c1, dst)` writes weight rows
// [c0, c1) as fp32 into dst; rows are widened into a per-thread buffer of at most 4 MiB, each
// block one sgemm (every sgemm packs x again, so few blocks), at least one block per thread.
template <class Widen>
void matmul_widened(const float* x, float* y, int64_t m, int64_t n, int64_t k, const Widen& widen) {
  const int64_t threads = num_threads();
  int64_t block = std::clamp<int64_t>((int64_t{1} << 20) / std::max<int64_t>(k, 1), 16, 4096);
  block = std::min(block, (n + threads - 1) / threads);
  block = std::max<int64_t>(16, (block + 15) / 16 * 16);
  parallel_for((n + block - 1) / block, [&](int64_t b0, int64_t b1) {
    thread_local std::vector<float> wide;
    if (wide.size() < static_cast<size_t>(block * k)) wide.resize(static_cast<size_t>(block * k));
    for (int64_t b = b0; b < b1; ++b) {
      int64_t c0 = b * block, c1 = std::min(n, c0 + block);
      widen(c0, c1, wide.data());
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(c1 - c0),
                  static_cast<int>(k), 1.0f, x, static_cast<int>(k), wide.data(), static_cast<int>(k), 0.0f,
                  y + c0, static_cast<int>(n));
    }
  });
}

// Fixed-order rows: y[i, j] = dot(x row i, w row j) by `dot4(a, rows, j, out)` over 4 rows of
// x at a time. Output columns go to the pool in tasks of `cols_per_task`, each worked through
// in groups of 16 columns against all of x, so a weight row is read once per 4 rows of x from
// cache and x streams once per group. Each element's dot product is the same whatever the
// split (batch invariance).
template <class Dot4>
void matmul_rows(const float* x, float* y, int64_t m, int64_t n, int64_t k, int64_t cols_per_task, const Dot4& dot4) {
  constexpr int64_t group = 16;
  parallel_for((n + cols_per_task - 1) / cols_per_task, [&](int64_t t0, int64_t t1) {
    float out[4];
    for (int64_t c0 = t0 * cols_per_task; c0 < std::min(n, t1 * cols_per_task); c0 += group) {
      const int64_t c1 = std::min({n, c0 + group, t1 * cols_per_task});
      for (int64_t i = 0; i < m; i += 4) {
        const int rows = static_cast<int>(std::min<int64_t>(4, m - i));
        const float* a[4] = {x + i * k, x + std::min(i + 1, m - 1) * k, x + std::min(i + 2, m - 1) * k,
                             x + std::min(i + 3, m - 1) * k};
        for (int64_t j = c0; j < c1; ++j) {
          dot4(a, rows, j, out);
          for (int r = 0; r < rows; ++r) y[(i + r) * n + j] = out[r];
        }
      }
    }
  });
}

// One row of x: output columns split over the pool in groups of 64, `gemv(j0, j1)` each.
template <class Gemv>
void matmul_gemv(int64_t n, const Gemv& gemv) {
  constexpr int64_t cols_per_task = 64;
  parallel_for((n + cols_per_task - 1) / cols_per_task, [&](int64_t t0, int64_t t1) {
    gemv(t0 * cols_per_task, std::min(n, t1 * cols_per_task));
  });
}

}  // namespace

void matmul_fp8(const float* x, const fp8_matrix& w, float* y, int64_t m, int64_t n, int64_t k,
                bool batch_invariant) {
  if (m == 0 || n == 0) return;
  const detail::row_kernels& kern = detail::active_kernels();
  if (!batch_invariant && m >= 8 && m * n * k >= blas_min_flops) {
    matmul_widened(x, y, m, n, k, [&](int64_t c0, int64_t c1, float* dst) {
      for (int64_t j = c0; j < c1; ++j)
        kern.widen_fp8(w.codes + j * k, w.scales + w.row_scales[j], w.block_k, dst + (j - c0) * k, k);
    });
    return;
  }
  if (m == 1) {
    matmul_gemv(n, [&](int64_t j0, int64_t j1) {
      kern.gemv_fp8(x, w.codes + j0 * k, w.scales, w.row_scales + j0, w.block_k, k, j1 - j0, y + j0);
    });
    return;
  }
  matmul_rows(x, y, m, n, k, 64, [&](const float* const* a, int rows, int64_t j, float* out) {
    kern.dot_fp8(a, rows, w.codes + j * k, w.scales + w.row_scales[j], w.block_k, k, out);
  });
}

void matmul_bf16(const float* x, const uint16_t* w, float* y, int64_t m, int64_t n, int64_t k,
                 bool batch_invariant) {
  if (m == 0 || n == 0) return;
  const detail::row_kernels& kern = detail::active_kernels();
  // Widened into OpenBLAS from this many rows of x (from 8 without a bf16 tile kernel).
  const int64_t blas_rows = kern.gemm_bf16 ? bf16_blas_rows : 8;
  if (!batch_invariant && m >= blas_rows && m * n * k >= blas_min_flops) {
    matmul_widened(x, y, m, n, k,
                   [&](int64_t c0, int64_t c1, float* dst) { kern.widen_bf16(w + c0 * k, dst, (c1 - c0) * k); });
    return;
  }
  if (m == 1) {
    matmul_gemv(n, [&](int64_t j0, int64_t j1) { kern.gemv_bf16(x, w + j0 * k, k, j1 - j0, y + j0); });
    return;
  }
  if (kern.gemm_bf16) {
    // Tasks of 48 output columns: eight tiles of six weight rows.
    constexpr int64_t cols_per_task = 48;
    parallel_for((n + cols_per_task - 1) / cols_per_task, [&](int64_t t0, int64_t t1) {
      const int64_t j0 = t0 * cols_per_task, j1 = std::min(n, t1 * cols_per_task);
      kern.gemm_bf16(x, m, w + j0 * k, k, j1 - j0, y + j0, n);
    });
    return;
  }
  matmul_rows(x, y, m, n, k, 64, [&](const float* const* a, int rows, int64_t j, float* out) {
    kern.dot_bf16(a, rows, w + j * k, k, out);
  });
}

float dot(const float* a, const float* b, int64_t n) {
  // One row of the variant's fixed-order product, so dot equals a row of matmul's.
  float out;
  detail::active_kernels().dot_f32(&a, 1, b, n, &out);
  return out;
}

void axpy(float alpha, const float* x, float* y, int64_t n) {
  __m256 a = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += alpha * x[i];
}

void matmul(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
            bool batch_invariant) {
  if (m == 0 || n == 0) return;
  if (!batch_invariant && m >= 4 && m * n * k >= blas_min_flops) {
    // One threading owner: the pool splits the output columns, each part is a
    // single-threaded sgemm (OpenBLAS threads are set to 1 by set_num_threads).
    int64_t parts = std::min<int64_t>(num_threads(), std::max<int64_t>(1, n / 64));
    parallel_for(parts, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        int64_t c0 = n * p / parts, c1 = n * (p + 1) / parts;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m),
                    static_cast<int>(c1 - c0), static_cast<int>(k), 1.0f, x, static_cast<int>(k),
                    w + c0 * k, static_cast<int>(k), 0.0f, y + c0, static_cast<int>(n));
      }
    });
    return;
  }
  const detail::row_kernels& kern = detail::active_kernels();
  matmul_rows(x, y, m, n, k, 16, [&](const float* const* a, int rows, int64_t j, float* out) {
    kern.dot_f32(a, rows, w + j * k, k, out);
  });
}

void matmul_nn(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
               int64_t ldw) {
  if (m == 0 || n == 0) return;
  if (m * n * k >= (1 << 16)) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, x, static_cast<int>(k), w, static_cast<int>(ldw), 0.0f, y,
                static_cast<int>(n));
    return;
  }
  for (int64_t i = 0; i < m; ++i) {
    float* yr = y + i * n;
    std::fill(yr, yr + n, 0.0f);
    for (int64_t t = 0; t < k; ++t) axpy(x[i * k + t], w + t * ldw, yr, n);
  }
}

void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) {
  parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * dim;
      float ss = dot(xr, xr, dim);
      float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
      float* yr = y + r * dim;
      for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * inv * w[i];
    }
  });
}

void rope(float* x, int64_t rows, int64_t row_stride, int64_t heads, int64_t head_stride,
          const int32_t* positions, const float* inv_freq, int64_t rope_dim, float attn_factor) {
  parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      double pos = positions[r];
      for (int64_t i = 0; i < rope_dim / 2; ++i) {
        // the angle in double: positions reach 1e5+, where a float angle loses its phase
        double angle = pos * inv_freq[i];
        float c = static_cast<float>(std::cos(angle) * attn_factor);
        float s = static_cast<float>(std::sin(angle) * attn_factor);
        for (int64_t h = 0; h < heads; ++h) {
          float* p = x + r * row_stride + h * head_stride + 2 * i;
          float a = p[0], b = p[1];
          p[0] = a * c - b * s;
          p[1] = b * c + a * s;
        }
      }
    }
  });
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void softmax(float* x, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += (x[i] = std::exp(x[i] - mx));
  float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void moe_gate(const float* logits, const float* bias, const gate_params& p, int32_t* ids,
              float* weights) {
  SHOAL_ASSERT(p.n_experts <= 1024 && p.n_experts % p.n_group == 0);
  float s[1024], sel[1024];
  for (int64_t e = 0; e < p.n_experts; ++e) {
    s[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    sel[e] = s[e] + (bias ? bias[e] : 0.0f);
  }
  int64_t per_group = p.n_experts / p.n_group;
  if (p.n_group > 1) {
    float group_score[256];
    SHOAL_ASSERT(p.n_group <= 256);
    for (int64_t g = 0; g < p.n_group; ++g) {
      float a = -INFINITY, b = -INFINITY;  // two largest of the group
      for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) {
        if (sel[e] > a) { b = a; a = sel[e]; } else if (sel[e] > b) b = sel[e];
      }
      group_score[g] = per_group >= 2 ? a + b : a;
    }
    bool keep[256] = {};
    for (int64_t k = 0; k < p.topk_group; ++k) {
      int64_t best = -1;
      for (int64_t g = 0; g < p.n_group; ++g)
        if (!keep[g] && (best < 0 || group_score[g] > group_score[best])) best = g;
      keep[best] = true;
    }
    for (int64_t e = 0; e < p.n_experts; ++e)
      if (!keep[e / per_group]) sel[e] = -INFINITY;
  }
  bool taken[1024] = {};
  float total = 0;
  for (int64_t k = 0; k < p.top_k; ++k) {
    int64_t best = -1;
    for (int64_t e = 0; e < p.n_experts; ++e)
      if (!taken[e] && (best < 0 || sel[e] > sel[best])) best = e;
    taken[best] = true;
    ids[k] = static_cast<int32_t>(best);
    weights[k] = s[best];
    total += s[best];
  }
  float norm = p.norm_topk_prob ? 1.0f / (total + 1e-20f) : 1.0f;
  for (int64_t k = 0; k < p.top_k; ++k) weights[k] *= norm * p.routed_scaling_factor;
}

namespace {

// The entry's values: in place for fp32, else widened into `buf`.
const float* entry_values(const kv_run& run, int64_t e, int64_t r, int64_t rope, float* buf) {
  const uint8_t* at = run.data + e * run.stride;
  if (run.elem == kv_elem::f32) return reinterpret_cast<const float*>(at);
  kv_decode(run.elem, at, r, rope, buf);
  return buf;
}

}  // namespace

size_t mla_attend_scratch(int64_t heads, int64_t total, int64_t r, int64_t rope) {
  return static_cast<size_t>(heads * total + r + rope);
}

void mla_attend(const float* q_lat, const float* q_pe, const kv_run* runs, int n_runs, int64_t heads,
                int64_t r, int64_t rope, float scale, const float* sink, float* o_lat, float* scratch) {
  int64_t total = 0;
  for (int s = 0; s < n_runs; ++s) total += runs[s].count;
  float* p = scratch;                   // (heads, total)
  float* buf = scratch + heads * total;  // one widened entry
  int64_t j = 0;
  for (int s = 0; s < n_runs; ++s)
    for (int64_t e = 0; e < runs[s].count; ++e, ++j) {
      const float* entry = entry_values(runs[s], e, r, rope, buf);
      for (int64_t h = 0; h < heads; ++h)
        p[h * total + j] = (dot(q_lat + h * r, entry, r) + dot(q_pe + h * rope, entry + r, rope)) * scale;
    }
  for (int64_t h = 0; h < heads; ++h) {
    float* ph = p + h * total;
    float mx = sink ? sink[h] : -INFINITY;
    for (int64_t i = 0; i < total; ++i) mx = std::max(mx, ph[i]);
    float sum = sink ? std::exp(sink[h] - mx) : 0.0f;
    for (int64_t i = 0; i < total; ++i) sum += (ph[i] = std::exp(ph[i] - mx));
    float inv = total > 0 || sink ? 1.0f / sum : 0.0f;
    for (int64_t i = 0; i < total; ++i) ph[i] *= inv;
    std::fill(o_lat + h * r, o_lat + (h + 1) * r, 0.0f);
  }
  j = 0;
  for (int s = 0; s < n_runs; ++s)
    for (int64_t e = 0; e < runs[s].count; ++e, ++j) {
      const float* entry = entry_values(runs[s], e, r, rope, buf);
      for (int64_t h = 0; h < heads; ++h) axpy(p[h * total + j], entry, o_lat + h * r, r);
    }
}

}  // namespace shoal::kernels
