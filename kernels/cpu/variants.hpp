// The inner loops that differ per instruction set (kernels/cpu/isa.hpp): one table of them
// per variant, each defined in its own file compiled with that variant's target flags
// (rows_avx2.cpp, rows_avx512.cpp). Internal to kernels/cpu. This header stays free of
// other includes: a file built with AVX-512 flags must not instantiate an inline function
// that the linker could then pick for the whole program (it would fault on an AVX2 CPU).
#pragma once

#include <cstdint>

namespace shoal::kernels::detail {

struct row_kernels {
  // out[r] = a[r] · b (n values) for r < rows ≤ 4, in one fixed order per variant.
  void (*dot_f32)(const float* const* a, int rows, const float* b, int64_t n, float* out);
  void (*dot_bf16)(const float* const* a, int rows, const uint16_t* b, int64_t n, float* out);
  // b: FP8 e4m3 codes, scales[i / block] the scale of element i: per block the partial
  // sums × its scale.
  void (*dot_fp8)(const float* const* a, int rows, const uint8_t* b, const float* scales, int64_t block,
                  int64_t n, float* out);
  // dst = widened src (n values); for FP8 × scales[i / block].
  void (*widen_bf16)(const uint16_t* src, float* dst, int64_t n);
  void (*widen_fp8)(const uint8_t* src, const float* scales, int64_t block, float* dst, int64_t n);
  // One activation row against `cols` weight rows of k values: y[j] = x · w row j, each
  // bit for bit what dot_bf16 / dot_fp8 give for that row (batch invariance). For FP8 row j's
  // scales start at scales + row_scales[j].
  void (*gemv_bf16)(const float* x, const uint16_t* w, int64_t k, int64_t cols, float* y);
  void (*gemv_fp8)(const float* x, const uint8_t* w, const float* scales, const int32_t* row_scales, int64_t block,
                   int64_t k, int64_t cols, float* y);
  // y (m × cols, rows ldy apart) = x (m × k) · wᵀ for `cols` bf16 weight rows of k values, each
  // output bit for bit dot_bf16's for its row (batch invariance). Null where the variant has
  // none (matmul_bf16 then goes through dot_bf16, four rows of x at a time).
  void (*gemm_bf16)(const float* x, int64_t m, const uint16_t* w, int64_t k, int64_t cols, float* y, int64_t ldy);
};

const row_kernels& avx2_kernels();
const row_kernels& avx512_kernels();
// The table of the active variant.
const row_kernels& active_kernels();

}  // namespace shoal::kernels::detail
