// The AVX-512 (F, BW, VL, DQ) variant of the row kernels (kernels/cpu/variants.hpp), built
// with -mavx512f -mavx512bw -mavx512vl -mavx512dq and run only where CPUID reports them.
// Deliberately includes nothing but the intrinsics and variants.hpp, and keeps every
// function file-local: no inline function of a shared header is compiled with these flags.
#include <immintrin.h>

// GCC 12 warns inside its own AVX-512 headers (the _mm512_undefined_* seeds of the
// conversion intrinsics) at -O2; nothing here is uninitialised. (clang has no such warning.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "kernels/cpu/variants.hpp"

// Named namespace: tests/isa_isolation_test.sh finds these functions by it in the binaries.
namespace shoal::kernels::detail::avx512 {
namespace {

// The first min(left, 16) lanes.
__mmask16 lanes(int64_t left) { return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1u); }

__m512 bf16_16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
__m512 bf16_masked(const uint16_t* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// e4m3fn codes → floats as in rows_avx2.cpp: magnitude bits placed at the top of an fp32
// exponent and mantissa, × 2^120, sign OR-ed in.
__m512 fp8_from(__m128i bytes) {
  const __m512i v = _mm512_cvtepu8_epi32(bytes);
  const __m512i mag = _mm512_slli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0x7f)), 20);
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0x80)), 24);
  const __m512 f = _mm512_mul_ps(_mm512_castsi512_ps(mag), _mm512_set1_ps(0x1p120f));
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(f), sign));
}
__m512 fp8_16(const uint8_t* p) { return fp8_from(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
__m512 fp8_masked(const uint8_t* p, __mmask16 m) { return fp8_from(_mm_maskz_loadu_epi8(m, p)); }

// Per row two 16-lane accumulators over 32 values, then masked 16-lane steps for the tail
// into the first; the two summed and reduced.
void dot_f32(const float* const* a, int rows, const float* b, int64_t n, float* out) {
  __m512 acc[4][2];
  for (int r = 0; r < 4; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 b0 = _mm512_loadu_ps(b + i), b1 = _mm512_loadu_ps(b + i + 16);
    for (int r = 0; r < rows; ++r) {
      acc[r][0] = _mm512_fmadd_ps(_mm512_loadu_ps(a[r] + i), b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(_mm512_loadu_ps(a[r] + i + 16), b1, acc[r][1]);
    }
  }
  for (; i < n; i += 16) {
    const __mmask16 m = lanes(n - i);
    const __m512 bv = _mm512_maskz_loadu_ps(m, b + i);
    for (int r = 0; r < rows; ++r) acc[r][0] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a[r] + i), bv, acc[r][0]);
  }
  for (int r = 0; r < rows; ++r) out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
}

void dot_bf16(const float* const* a, int rows, const uint16_t* b, int64_t n, float* out) {
  __m512 acc[4][2];
  for (int r = 0; r < 4; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 b0 = bf16_16(b + i), b1 = bf16_16(b + i + 16);
    for (int r = 0; r < rows; ++r) {
      acc[r][0] = _mm512_fmadd_ps(_mm512_loadu_ps(a[r] + i), b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(_mm512_loadu_ps(a[r] + i + 16), b1, acc[r][1]);
    }
  }
  for (; i < n; i += 16) {
    const __mmask16 m = lanes(n - i);
    const __m512 bv = bf16_masked(b + i, m);
    for (int r = 0; r < rows; ++r) acc[r][0] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a[r] + i), bv, acc[r][0]);
  }
  for (int r = 0; r < rows; ++r) out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
}

// Per scale block: two 16-lane partial sums (masked steps for the block's tail into the
// first), × the block's scale into two running sums; reduced at the end.
void dot_fp8(const float* const* a, int rows, const uint8_t* b, const float* scales, int64_t block, int64_t n,
             float* out) {
  __m512 tot[4][2];
  for (int r = 0; r < 4; ++r) tot[r][0] = tot[r][1] = _mm512_setzero_ps();
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    const int64_t b1 = n < b0 + block ? n : b0 + block;
    __m512 acc[4][2];
    for (int r = 0; r < 4; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    int64_t i = b0;
    for (; i + 32 <= b1; i += 32) {
      const __m512 w0 = fp8_16(b + i), w1 = fp8_16(b + i + 16);
      for (int r = 0; r < rows; ++r) {
        acc[r][0] = _mm512_fmadd_ps(_mm512_loadu_ps(a[r] + i), w0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(_mm512_loadu_ps(a[r] + i + 16), w1, acc[r][1]);
      }
    }
    for (; i < b1; i += 16) {
      const __mmask16 m = lanes(b1 - i);
      const __m512 wv = fp8_masked(b + i, m);
      for (int r = 0; r < rows; ++r) acc[r][0] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a[r] + i), wv, acc[r][0]);
    }
    const __m512 s = _mm512_set1_ps(scales[b0 / block]);
    for (int r = 0; r < rows; ++r) {
      tot[r][0] = _mm512_fmadd_ps(acc[r][0], s, tot[r][0]);
      tot[r][1] = _mm512_fmadd_ps(acc[r][1], s, tot[r][1]);
    }
  }
  for (int r = 0; r < rows; ++r) out[r] = _mm512_reduce_add_ps(_mm512_add_ps(tot[r][0], tot[r][1]));
}

void widen_bf16(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, bf16_16(src + i));
  if (i < n) {
    const __mmask16 m = lanes(n - i);
    _mm512_mask_storeu_ps(dst + i, m, bf16_masked(src + i, m));
  }
}

void widen_fp8(const uint8_t* src, const float* scales, int64_t block, float* dst, int64_t n) {
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    const int64_t b1 = n < b0 + block ? n : b0 + block;
    const __m512 s = _mm512_set1_ps(scales[b0 / block]);
    int64_t i = b0;
    for (; i + 16 <= b1; i += 16) _mm512_storeu_ps(dst + i, _mm512_mul_ps(fp8_16(src + i), s));
    if (i < b1) {
      const __mmask16 m = lanes(b1 - i);
      _mm512_mask_storeu_ps(dst + i, m, _mm512_mul_ps(fp8_masked(src + i, m), s));
    }
  }
}

// y[j] = x · row j of w for j < cols, four rows at a time (eight accumulator chains, x loaded
// once for four rows), each row in dot_bf16's exact order (two 16-lane sums over 32 values,
// masked 16-lane steps for the tail into the first, the two added and reduced); the next
// four rows are prefetched a cache line per 32 values ahead of their use.
void gemv_bf16(const float* x, const uint16_t* w, int64_t k, int64_t cols, float* y) {
  int64_t j = 0;
  for (; j + 4 <= cols; j += 4) {
    const uint16_t* b[4] = {w + j * k, w + (j + 1) * k, w + (j + 2) * k, w + (j + 3) * k};
    const bool ahead = j + 8 <= cols;
    __m512 acc[4][2];
    for (auto& r : acc) r[0] = r[1] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
      const __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + 16);
      if (ahead)
        for (int c = 0; c < 4; ++c) _mm_prefetch(reinterpret_cast<const char*>(b[c] + 4 * k + i), _MM_HINT_T0);
      for (int c = 0; c < 4; ++c) {
        acc[c][0] = _mm512_fmadd_ps(x0, bf16_16(b[c] + i), acc[c][0]);
        acc[c][1] = _mm512_fmadd_ps(x1, bf16_16(b[c] + i + 16), acc[c][1]);
      }
    }
    for (; i < k; i += 16) {
      const __mmask16 m = lanes(k - i);
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
      for (int c = 0; c < 4; ++c) acc[c][0] = _mm512_fmadd_ps(xv, bf16_masked(b[c] + i, m), acc[c][0]);
    }
    for (int c = 0; c < 4; ++c) y[j + c] = _mm512_reduce_add_ps(_mm512_add_ps(acc[c][0], acc[c][1]));
  }
  for (; j < cols; ++j) dot_bf16(&x, 1, w + j * k, k, y + j);
}

// As gemv_bf16 for FP8 rows (row_scales[j]: offset in scales of row j's scale row), each row
// in dot_fp8's exact order; a cache line of each next row prefetched per 64 values.
void gemv_fp8(const float* x, const uint8_t* w, const float* scales, const int32_t* row_scales, int64_t block,
              int64_t k, int64_t cols, float* y) {
  int64_t j = 0;
  for (; j + 4 <= cols; j += 4) {
    const uint8_t* b[4] = {w + j * k, w + (j + 1) * k, w + (j + 2) * k, w + (j + 3) * k};
    const float* s[4] = {scales + row_scales[j], scales + row_scales[j + 1], scales + row_scales[j + 2],
                         scales + row_scales[j + 3]};
    const bool ahead = j + 8 <= cols;
    __m512 tot[4][2];
    for (auto& r : tot) r[0] = r[1] = _mm512_setzero_ps();
    for (int64_t b0 = 0; b0 < k; b0 += block) {
      const int64_t b1 = k < b0 + block ? k : b0 + block;
      __m512 acc[4][2];
      for (auto& r : acc) r[0] = r[1] = _mm512_setzero_ps();
      int64_t i = b0;
      for (; i + 32 <= b1; i += 32) {
        const __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + 16);
        if (ahead && ((i - b0) & 63) == 0)
          for (int c = 0; c < 4; ++c) _mm_prefetch(reinterpret_cast<const char*>(b[c] + 4 * k + i), _MM_HINT_T0);
        for (int c = 0; c < 4; ++c) {
          acc[c][0] = _mm512_fmadd_ps(x0, fp8_16(b[c] + i), acc[c][0]);
          acc[c][1] = _mm512_fmadd_ps(x1, fp8_16(b[c] + i + 16), acc[c][1]);
        }
      }
      for (; i < b1; i += 16) {
        const __mmask16 m = lanes(b1 - i);
        const __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
        for (int c = 0; c < 4; ++c) acc[c][0] = _mm512_fmadd_ps(xv, fp8_masked(b[c] + i, m), acc[c][0]);
      }
      for (int c = 0; c < 4; ++c) {
        const __m512 sv = _mm512_set1_ps(s[c][b0 / block]);
        tot[c][0] = _mm512_fmadd_ps(acc[c][0], sv, tot[c][0]);
        tot[c][1] = _mm512_fmadd_ps(acc[c][1], sv, tot[c][1]);
      }
    }
    for (int c = 0; c < 4; ++c) y[j + c] = _mm512_reduce_add_ps(_mm512_add_ps(tot[c][0], tot[c][1]));
  }
  for (; j < cols; ++j) dot_fp8(&x, 1, w + j * k, scales + row_scales[j], block, k, y + j);
}

}  // namespace

const row_kernels& table() {
  static const row_kernels k{dot_f32, dot_bf16, dot_fp8, widen_bf16, widen_fp8, gemv_bf16, gemv_fp8};
  return k;
}

}  // namespace shoal::kernels::detail::avx512

namespace shoal::kernels::detail {
const row_kernels& avx512_kernels() { return avx512::table(); }
}  // namespace shoal::kernels::detail
