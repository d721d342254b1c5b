// The AVX-512 (F, BW, VL, DQ) variant of the row kernels (kernels/cpu/variants.hpp), built
// with -mavx512f -mavx512bw -mavx512vl -mavx512dq and run only where CPUID reports them.
// Deliberately includes nothing but the intrinsics and variants.hpp, and keeps every
// function file-local: no inline function of a shared header is compiled with these flags.
#include <immintrin.h>

// GCC 12 warns inside its own AVX-512 headers (the _mm512_undefined_* seeds of the
// conversion intrinsics, the reductions) at -O2; nothing here is uninitialised. (clang has no such warning.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
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

// e4m3fn codes → floats: each code sign-extended to 32 bits and shifted so its seven
// magnitude bits sit at the top of an fp32 exponent and mantissa (bits 20-26) and its sign,
// repeated by the extension, at bit 31 (bits 27-30 masked off); × 2^120 rebiases the
// exponent, subnormal codes included. Exact.
__m512 fp8_from(__m128i bytes) {
  const __m512i v = _mm512_slli_epi32(_mm512_cvtepi8_epi32(bytes), 20);
  const __m512 f = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0x87F00000u))));
  return _mm512_mul_ps(f, _mm512_set1_ps(0x1p120f));
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

// bf16 products in this variant, one order for every path (dot_bf16, gemv_bf16, gemm_bf16):
// per output one 16-lane sum over k in steps of 16 values (the last step masked), then
// _mm512_reduce_add_ps. A tile of outputs keeps one chain each, so any tiling gives the same
// bits (batch invariance).
void dot_bf16(const float* const* a, int rows, const uint16_t* b, int64_t n, float* out) {
  __m512 acc[4];
  for (auto& v : acc) v = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 bv = bf16_16(b + i);
    for (int r = 0; r < rows; ++r) acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(a[r] + i), bv, acc[r]);
  }
  if (i < n) {
    const __mmask16 m = lanes(n - i);
    const __m512 bv = bf16_masked(b + i, m);
    for (int r = 0; r < rows; ++r) acc[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a[r] + i), bv, acc[r]);
  }
  for (int r = 0; r < rows; ++r) out[r] = _mm512_reduce_add_ps(acc[r]);
}

// FP8 products in this variant, one order for dot_fp8 and gemv_fp8: per output and scale
// block one 16-lane partial sum in steps of 16 values (the block's last step masked), × the
// block's scale into one running sum, reduced at the end.
void dot_fp8(const float* const* a, int rows, const uint8_t* b, const float* scales, int64_t block, int64_t n,
             float* out) {
  __m512 tot[4];
  for (auto& v : tot) v = _mm512_setzero_ps();
  for (int64_t b0 = 0, bi = 0; b0 < n; b0 += block, ++bi) {
    const int64_t b1 = n < b0 + block ? n : b0 + block;
    __m512 acc[4];
    for (auto& v : acc) v = _mm512_setzero_ps();
    int64_t i = b0;
    for (; i + 16 <= b1; i += 16) {
      const __m512 wv = fp8_16(b + i);
      for (int r = 0; r < rows; ++r) acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(a[r] + i), wv, acc[r]);
    }
    if (i < b1) {
      const __mmask16 m = lanes(b1 - i);
      const __m512 wv = fp8_masked(b + i, m);
      for (int r = 0; r < rows; ++r) acc[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a[r] + i), wv, acc[r]);
    }
    const __m512 sv = _mm512_set1_ps(scales[bi]);
    for (int r = 0; r < rows; ++r) tot[r] = _mm512_fmadd_ps(acc[r], sv, tot[r]);
  }
  for (int r = 0; r < rows; ++r) out[r] = _mm512_reduce_add_ps(tot[r]);
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
  for (int64_t b0 = 0, bi = 0; b0 < n; b0 += block, ++bi) {
    const int64_t b1 = n < b0 + block ? n : b0 + block;
    const __m512 s = _mm512_set1_ps(scales[bi]);
    int64_t i = b0;
    for (; i + 16 <= b1; i += 16) _mm512_storeu_ps(dst + i, _mm512_mul_ps(fp8_16(src + i), s));
    if (i < b1) {
      const __mmask16 m = lanes(b1 - i);
      _mm512_mask_storeu_ps(dst + i, m, _mm512_mul_ps(fp8_masked(src + i, m), s));
    }
  }
}

// y[j] = x · row j of w for j < cols, eight rows at a time (eight accumulator chains, x
// loaded once for eight rows), each in dot_bf16's order. The eight rows are taken from eight
// far-apart parts of [0, cols), each part walked row after row: eight long sequential streams
// that the hardware prefetchers follow (eight adjacent rows read together reached 26 GB/s of
// the 33 the machine reads; see bench engine's read loop), each stream's next row prefetched
// a cache line per 32 values ahead of its use.
void gemv_bf16(const float* x, const uint16_t* w, int64_t k, int64_t cols, float* y) {
  constexpr int rows = 8;
  const int64_t part = cols / rows;  // rows per stream
  // Stream c starts c rows into its part (and wraps once): parts a multiple of 4 KiB apart
  // would otherwise put all eight reads in one cache set (3 of the 8 streams' rate, measured
  // at k = 384).
  int64_t row[rows];
  for (int64_t j = 0; j < part; ++j) {
    for (int c = 0; c < rows; ++c) row[c] = c * part + (j + c) % part;
    const bool ahead = j + 1 < part;
    __m512 acc[rows];
    for (auto& v : acc) v = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
      const __m512 xv = _mm512_loadu_ps(x + i);
      if (ahead && (i & 31) == 0)
        for (int c = 0; c < rows; ++c)
          _mm_prefetch(reinterpret_cast<const char*>(w + (c * part + (j + 1 + c) % part) * k + i), _MM_HINT_T0);
      for (int c = 0; c < rows; ++c) acc[c] = _mm512_fmadd_ps(xv, bf16_16(w + row[c] * k + i), acc[c]);
    }
    if (i < k) {
      const __mmask16 m = lanes(k - i);
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
      for (int c = 0; c < rows; ++c) acc[c] = _mm512_fmadd_ps(xv, bf16_masked(w + row[c] * k + i, m), acc[c]);
    }
    for (int c = 0; c < rows; ++c) y[row[c]] = _mm512_reduce_add_ps(acc[c]);
  }
  for (int64_t j = rows * part; j < cols; ++j) dot_bf16(&x, 1, w + j * k, k, y + j);
}

// A tile of MR rows of x (ldx apart) against NR bf16 weight rows (k values each, k apart),
// in dot_bf16's order: MR × NR chains (24 of the 32 registers at 4 × 6), the weights widened
// in registers, one cache line of each of the next NR rows prefetched per 32 values.
template <int MR, int NR>
void tile(const float* x, int64_t ldx, const uint16_t* w, int64_t k, float* y, int64_t ldy) {
  __m512 acc[MR][NR];
#pragma GCC unroll 4
  for (auto& r : acc)
#pragma GCC unroll 8
    for (auto& v : r) v = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    if ((i & 31) == 0)
#pragma GCC unroll 8
      for (int c = 0; c < NR; ++c) _mm_prefetch(reinterpret_cast<const char*>(w + (NR + c) * k + i), _MM_HINT_T0);
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int c = 0; c < NR; ++c) wv[c] = bf16_16(w + c * k + i);
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      const __m512 xv = _mm512_loadu_ps(x + r * ldx + i);
#pragma GCC unroll 8
      for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  if (i < k) {
    const __mmask16 m = lanes(k - i);
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int c = 0; c < NR; ++c) wv[c] = bf16_masked(w + c * k + i, m);
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + r * ldx + i);
#pragma GCC unroll 8
      for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < NR; ++c) y[r * ldy + c] = _mm512_reduce_add_ps(acc[r][c]);
}

using tile_fn = void (*)(const float*, int64_t, const uint16_t*, int64_t, float*, int64_t);
template <int MR, int... NR>
constexpr tile_fn tile_row[] = {tile<MR, NR>...};
constexpr int tile_m = 4, tile_n = 6;
// tiles[mr - 1][nr - 1]
constexpr const tile_fn* tiles[tile_m] = {tile_row<1, 1, 2, 3, 4, 5, 6>, tile_row<2, 1, 2, 3, 4, 5, 6>,
                                          tile_row<3, 1, 2, 3, 4, 5, 6>, tile_row<4, 1, 2, 3, 4, 5, 6>};

// y (m × cols, ldy apart) = x (m × k) · wᵀ for `cols` bf16 weight rows of k values: per block
// of 64 rows of x (256 KiB at k = 1024, kept in L2), the weights six rows at a time against
// every 4-row tile of the block, widened in registers (measured: faster than widening the six
// rows once into an fp32 scratch, at every m from 5 to 64 here).
void gemm_bf16(const float* x, int64_t m, const uint16_t* w, int64_t k, int64_t cols, float* y, int64_t ldy) {
  constexpr int64_t x_block = 64;
  for (int64_t m0 = 0; m0 < m; m0 += x_block) {
    const int64_t m1 = m < m0 + x_block ? m : m0 + x_block;
    for (int64_t j = 0; j < cols; j += tile_n) {
      const int nr = static_cast<int>(cols - j < tile_n ? cols - j : tile_n);
      for (int64_t i = m0; i < m1; i += tile_m) {
        const int mr = static_cast<int>(m1 - i < tile_m ? m1 - i : tile_m);
        tiles[mr - 1][nr - 1](x + i * k, k, w + j * k, k, y + i * ldy + j, ldy);
      }
    }
  }
}

// As gemv_bf16 for FP8 rows (row_scales[j]: offset in scales of row j's scale row), each row
// in dot_fp8's order: eight streams as in gemv_bf16, a cache line of each stream's next row
// prefetched per 64 values.
void gemv_fp8(const float* x, const uint8_t* w, const float* scales, const int32_t* row_scales, int64_t block,
              int64_t k, int64_t cols, float* y) {
  constexpr int rows = 8;
  const int64_t part = cols / rows;
  for (int64_t j = 0; j < part; ++j) {
    const uint8_t* b[rows];
    const float* s[rows];
    const uint8_t* next[rows];
    for (int c = 0; c < rows; ++c) {
      const int64_t row = c * part + (j + c) % part;
      b[c] = w + row * k;
      s[c] = scales + row_scales[row];
      next[c] = w + (c * part + (j + 1 + c) % part) * k;
    }
    const bool ahead = j + 1 < part;
    __m512 tot[rows];
    for (auto& v : tot) v = _mm512_setzero_ps();
    for (int64_t b0 = 0, bi = 0; b0 < k; b0 += block, ++bi) {
      const int64_t b1 = k < b0 + block ? k : b0 + block;
      __m512 acc[rows];
      for (auto& v : acc) v = _mm512_setzero_ps();
      int64_t i = b0;
      for (; i + 16 <= b1; i += 16) {
        const __m512 xv = _mm512_loadu_ps(x + i);
        if (ahead && (i & 63) == 0)
          for (int c = 0; c < rows; ++c) _mm_prefetch(reinterpret_cast<const char*>(next[c] + i), _MM_HINT_T0);
        for (int c = 0; c < rows; ++c) acc[c] = _mm512_fmadd_ps(xv, fp8_16(b[c] + i), acc[c]);
      }
      if (i < b1) {
        const __mmask16 m = lanes(b1 - i);
        const __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
        for (int c = 0; c < rows; ++c) acc[c] = _mm512_fmadd_ps(xv, fp8_masked(b[c] + i, m), acc[c]);
      }
      for (int c = 0; c < rows; ++c) tot[c] = _mm512_fmadd_ps(acc[c], _mm512_set1_ps(s[c][bi]), tot[c]);
    }
    for (int c = 0; c < rows; ++c) y[(b[c] - w) / k] = _mm512_reduce_add_ps(tot[c]);
  }
  for (int64_t j = rows * part; j < cols; ++j) dot_fp8(&x, 1, w + j * k, scales + row_scales[j], block, k, y + j);
}

}  // namespace

const row_kernels& table() {
  static const row_kernels k{dot_f32, dot_bf16, dot_fp8, widen_bf16, widen_fp8, gemv_bf16, gemv_fp8, gemm_bf16};
  return k;
}

}  // namespace shoal::kernels::detail::avx512

namespace shoal::kernels::detail {
const row_kernels& avx512_kernels() { return avx512::table(); }
}  // namespace shoal::kernels::detail
