// Plain scalar references of the CPU ops (double accumulation, no threads, no SIMD). They
// define what each op computes; tests compare the optimised ops against them.
#pragma once

#include <cstdint>

#include "kernels/cpu/ops.hpp"

namespace shoal::kernels::ref {

void matmul(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k);
void matmul_bf16(const float* x, const uint16_t* w, float* y, int64_t m, int64_t n, int64_t k);
void matmul_fp8(const float* x, const fp8_matrix& w, float* y, int64_t m, int64_t n, int64_t k);
// The e4m3fn value of a code, exactly (NaN for 0x7F / 0xFF).
double e4m3_value(uint8_t code);
void matmul_nn(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
               int64_t ldw);
void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps);
void rope(float* x, int64_t rows, int64_t row_stride, int64_t heads, int64_t head_stride,
          const int32_t* positions, const float* inv_freq, int64_t rope_dim, float attn_factor);
void silu_mul(const float* gate, const float* up, float* out, int64_t n);
void softmax(float* x, int64_t n);
void moe_gate(const float* logits, const float* bias, const gate_params& p, int32_t* ids,
              float* weights);
void mla_attend(const float* q_lat, const float* q_pe, const kv_segment* segments,
                int n_segments, int64_t heads, int64_t r, int64_t rope, float scale,
                const float* sink, float* o_lat);

}  // namespace shoal::kernels::ref
