// The AVX2 + FMA variant of the row kernels (kernels/cpu/variants.hpp), built with the
// project's baseline flags (-mavx2 -mfma -mf16c).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/variants.hpp"

namespace shoal::kernels::detail {
namespace {

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// Dot products of up to 4 rows a[r] with b: per row 4 accumulators of 8 lanes over 32
// values, combined (0+1)+(2+3), then the scalar tail.
void dot_f32(const float* const* a, int rows, const float* b, int64_t n, float* out) {
  __m256 acc[4][4];
  for (auto& r : acc)
    for (auto& v : r) v = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 b0 = _mm256_loadu_ps(b + i), b1 = _mm256_loadu_ps(b + i + 8);
    __m256 b2 = _mm256_loadu_ps(b + i + 16), b3 = _mm256_loadu_ps(b + i + 24);
    for (int r = 0; r < rows; ++r) {
      acc[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + i), b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + i + 8), b1, acc[r][1]);
      acc[r][2] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + i + 16), b2, acc[r][2]);
      acc[r][3] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + i + 24), b3, acc[r][3]);
    }
  }
  for (int r = 0; r < rows; ++r) {
    __m256 s = _mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]),
                             _mm256_add_ps(acc[r][2], acc[r][3]));
    float t = hsum(s);
    for (int64_t j = i; j < n; ++j) t += a[r][j] * b[j];
    out[r] = t;
  }
}

// 8 bf16 values → 8 floats (bf16 is the upper half of an fp32).
inline __m256 load_bf16(const uint16_t* p) {
  __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

inline float bf16_value(uint16_t v) {
  uint32_t bits = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// dst[i] = the fp32 value of bf16 src[i] (exact: bf16 is the upper half of an fp32).
void widen_bf16(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  }
  for (; i < n; ++i) dst[i] = bf16_value(src[i]);
}

// Dot products of up to 4 fp32 rows with one bf16 row, fixed order (as dot4).
void dot_bf16(const float* const* a, int rows, const uint16_t* b, int64_t n, float* out) {
  __m256 acc[4][2];
  for (auto& r : acc) r[0] = r[1] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 b0 = load_bf16(b + i), b1 = load_bf16(b + i + 8);
    for (int r = 0; r < rows; ++r) {
      acc[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + i), b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + i + 8), b1, acc[r][1]);
    }
  }
  for (int r = 0; r < rows; ++r) {
    float t = hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
    for (int64_t j = i; j < n; ++j) t += a[r][j] * bf16_value(b[j]);
    out[r] = t;
  }
}

// 8 e4m3fn codes → 8 floats. The 7 magnitude bits shifted to the top of an fp32's exponent
// and mantissa read as 2^(e − 127)·(1 + m/8) (e > 0) or m/8 · 2^-126 (e = 0, an fp32
// subnormal); × 2^120 moves both to e4m3's bias of 7, exactly. NaN codes are excluded.
inline __m256 load_fp8(const uint8_t* p) {
  const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i mag = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x7f)), 20);
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x80)), 24);
  const __m256 f = _mm256_mul_ps(_mm256_castsi256_ps(mag), _mm256_set1_ps(0x1p120f));
  return _mm256_or_ps(f, _mm256_castsi256_ps(sign));
}

// 16 e4m3fn codes → their values / 2^8, through fp16 (F16C): a code shifted left by 8 and
// arithmetically right by 1 is the sign at bit 15 (and a copy at 14, masked off) and the 7
// magnitude bits at 13..7, i.e. an fp16 of the same mantissa whose exponent has bias 15
// instead of 7 (subnormals included). Callers fold the 2^8 into the block scale
// (fp8_scale_fold): exact, as the products stay far above fp32's subnormals.
constexpr float fp8_scale_fold = 256.0f;
inline void load_fp8x16(const uint8_t* p, __m256& lo, __m256& hi) {
  const __m256i h = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i f16 = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(h, 8), 1), _mm256_set1_epi16(-16385));
  lo = _mm256_cvtph_ps(_mm256_castsi256_si128(f16));
  hi = _mm256_cvtph_ps(_mm256_extracti128_si256(f16, 1));
}

inline float fp8_value(uint8_t c) {
  uint32_t bits = uint32_t(c & 0x7f) << 20;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  f *= 0x1p120f;
  return c & 0x80 ? -f : f;
}

// dst[i] = value of code src[i] · scales[i / block] (a row of an fp8_matrix, n values).
void widen_fp8(const uint8_t* src, const float* scales, int64_t block, float* dst, int64_t n) {
  for (int64_t b0 = 0, bi = 0; b0 < n; b0 += block, ++bi) {
    const int64_t b1 = std::min(n, b0 + block);
    const float s = scales[bi];
    const __m256 sv = _mm256_set1_ps(s);
    int64_t i = b0;
    const __m256 sv16 = _mm256_set1_ps(s * fp8_scale_fold);
    for (; i + 16 <= b1; i += 16) {
      __m256 lo, hi;
      load_fp8x16(src + i, lo, hi);
      _mm256_storeu_ps(dst + i, _mm256_mul_ps(lo, sv16));
      _mm256_storeu_ps(dst + i + 8, _mm256_mul_ps(hi, sv16));
    }
    for (; i + 8 <= b1; i += 8) _mm256_storeu_ps(dst + i, _mm256_mul_ps(load_fp8(src + i), sv));
    for (; i < b1; ++i) dst[i] = fp8_value(src[i]) * s;
  }
}

// Dot products of up to 4 fp32 rows with one FP8 row, fixed order: per scale block, two
// 8-lane partial sums (×) the block's scale into two running sums; the scalar tail of each
// block likewise.
void dot_fp8(const float* const* a, int rows, const uint8_t* b, const float* scales, int64_t block,
                     int64_t n, float* out) {
  __m256 tot[4][2];
  float tail[4] = {0, 0, 0, 0};
  for (auto& r : tot) r[0] = r[1] = _mm256_setzero_ps();
  for (int64_t b0 = 0, bi = 0; b0 < n; b0 += block, ++bi) {
    const int64_t b1 = std::min(n, b0 + block);
    const float s = scales[bi];
    __m256 acc[4][2];
    for (auto& r : acc) r[0] = r[1] = _mm256_setzero_ps();
    int64_t i = b0;
    for (; i + 16 <= b1; i += 16) {
      __m256 w0, w1;
      load_fp8x16(b + i, w0, w1);
      for (int r = 0; r < rows; ++r) {
        acc[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + i), w0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + i + 8), w1, acc[r][1]);
      }
    }
    const __m256 sv = _mm256_set1_ps(s * fp8_scale_fold);
    for (int r = 0; r < rows; ++r) {
      tot[r][0] = _mm256_fmadd_ps(acc[r][0], sv, tot[r][0]);
      tot[r][1] = _mm256_fmadd_ps(acc[r][1], sv, tot[r][1]);
      float t = 0;
      for (int64_t j = i; j < b1; ++j) t += a[r][j] * fp8_value(b[j]);
      tail[r] += t * s;
    }
  }
  for (int r = 0; r < rows; ++r) out[r] = hsum(_mm256_add_ps(tot[r][0], tot[r][1])) + tail[r];
}

// The GEMVs read four rows at a time from four far-apart parts of [0, cols) (`part` rows
// each), each part walked row after row, stream c starting c rows in (and wrapping once):
// long sequential streams the prefetchers follow, not all in one cache set when parts are a
// multiple of 4 KiB apart (as the avx512 variant's eight). Row pointers of step j, and of
// step j + 1 to prefetch.
template <class T>
void rows_of_streams(const T* w, int64_t k, int64_t part, int64_t j, const T** rows, const T** next) {
  for (int c = 0; c < 4; ++c) {
    rows[c] = w + (c * part + (j + c) % part) * k;
    next[c] = w + (c * part + (j + 1 + c) % part) * k;
  }
}

// y[j] = x · row j of w (k values) for j < cols, four rows at a time (eight independent
// accumulator chains, x loaded once for four rows); each row in dot_bf16's exact order.
void gemv_bf16(const float* x, const uint16_t* w, int64_t k, int64_t cols, float* y) {
  const int64_t part = cols / 4;
  for (int64_t j = 0; j < part; ++j) {
    const uint16_t* b[4];
    const uint16_t* next[4];
    rows_of_streams(w, k, part, j, b, next);
    const bool ahead = j + 1 < part;
    __m256 acc[4][2];
    for (auto& r : acc) r[0] = r[1] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
      const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
      // each stream's next row, one cache line per 32 values, ahead of its use
      if ((i & 31) == 0 && ahead)
        for (int c = 0; c < 4; ++c) _mm_prefetch(reinterpret_cast<const char*>(next[c] + i), _MM_HINT_T0);
      for (int c = 0; c < 4; ++c) {
        acc[c][0] = _mm256_fmadd_ps(x0, load_bf16(b[c] + i), acc[c][0]);
        acc[c][1] = _mm256_fmadd_ps(x1, load_bf16(b[c] + i + 8), acc[c][1]);
      }
    }
    for (int c = 0; c < 4; ++c) {
      float t = hsum(_mm256_add_ps(acc[c][0], acc[c][1]));
      for (int64_t q = i; q < k; ++q) t += x[q] * bf16_value(b[c][q]);
      y[(b[c] - w) / k] = t;
    }
  }
  for (int64_t j = 4 * part; j < cols; ++j) dot_bf16(&x, 1, w + j * k, k, y + j);
}

// As gemv_bf16 for FP8 rows (row_scales[j]: offset in scales of row j's scale row); each row
// in dot_fp8's exact order.
void gemv_fp8(const float* x, const uint8_t* w, const float* scales, const int32_t* row_scales, int64_t block,
              int64_t k, int64_t cols, float* y) {
  const int64_t part = cols / 4;
  for (int64_t j = 0; j < part; ++j) {
    const uint8_t* b[4];
    const uint8_t* next[4];
    rows_of_streams(w, k, part, j, b, next);
    const float* s[4];
    for (int c = 0; c < 4; ++c) s[c] = scales + row_scales[(b[c] - w) / k];
    const bool ahead = j + 1 < part;
    __m256 tot[4][2];
    float tail[4] = {0, 0, 0, 0};
    for (auto& r : tot) r[0] = r[1] = _mm256_setzero_ps();
    for (int64_t b0 = 0, bi = 0; b0 < k; b0 += block, ++bi) {
      const int64_t b1 = std::min(k, b0 + block);
      __m256 acc[4][2];
      for (auto& r : acc) r[0] = r[1] = _mm256_setzero_ps();
      int64_t i = b0;
      for (; i + 16 <= b1; i += 16) {
        const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
        if (ahead && (i & 63) == 0)
          for (int c = 0; c < 4; ++c) _mm_prefetch(reinterpret_cast<const char*>(next[c] + i), _MM_HINT_T0);
        for (int c = 0; c < 4; ++c) {
          __m256 w0, w1;
          load_fp8x16(b[c] + i, w0, w1);
          acc[c][0] = _mm256_fmadd_ps(x0, w0, acc[c][0]);
          acc[c][1] = _mm256_fmadd_ps(x1, w1, acc[c][1]);
        }
      }
      for (int c = 0; c < 4; ++c) {
        const float sc = s[c][bi];
        const __m256 sv = _mm256_set1_ps(sc * fp8_scale_fold);
        tot[c][0] = _mm256_fmadd_ps(acc[c][0], sv, tot[c][0]);
        tot[c][1] = _mm256_fmadd_ps(acc[c][1], sv, tot[c][1]);
        float t = 0;
        for (int64_t q = i; q < b1; ++q) t += x[q] * fp8_value(b[c][q]);
        tail[c] += t * sc;
      }
    }
    for (int c = 0; c < 4; ++c) y[(b[c] - w) / k] = hsum(_mm256_add_ps(tot[c][0], tot[c][1])) + tail[c];
  }
  for (int64_t j = 4 * part; j < cols; ++j) dot_fp8(&x, 1, w + j * k, scales + row_scales[j], block, k, y + j);
}

}  // namespace

const row_kernels& avx2_kernels() {
  static const row_kernels k{dot_f32, dot_bf16, dot_fp8, widen_bf16, widen_fp8, gemv_bf16, gemv_fp8, nullptr};
  return k;
}

}  // namespace shoal::kernels::detail
