// CPU compute ops of the forward pass. Each op has a plain reference in reference.hpp that
// tests compare against. Threads come from one pool (thread_pool.hpp); large GEMMs split
// their output columns over it and run single-threaded OpenBLAS in each part, so threads
// never oversubscribe the cores.
#pragma once

#include <cstdint>

#include "kernels/cpu/kv_codec.hpp"

namespace shoal::kernels {

// y (m, n) = x (m, k) · w (n, k)ᵀ. With batch_invariant, each output row is computed by the
// same fixed-order dot products whatever m is (no BLAS, no m-dependent split), so a row's
// values do not depend on the other rows in the batch. Otherwise large products go to
// OpenBLAS sgemm.
void matmul(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
            bool batch_invariant);

// y (m, n) = x (m, k) · w (n, k)ᵀ with w stored bf16 (upper halves of fp32): for the
// vocabulary heads, where small-batch decode is bound by reading w. Few rows (or
// batch_invariant): fixed-order dot products straight from bf16. Many rows: w is widened
// block by block and multiplied by OpenBLAS.
void matmul_bf16(const float* x, const uint16_t* w, float* y, int64_t m, int64_t n, int64_t k,
                 bool batch_invariant);

// A weight matrix (n, k) stored FP8 e4m3fn with fp32 block scales: element (j, i) is
// e4m3(codes[j·k + i]) · scales[row_scales[j] + i / block_k]. row_scales gives each output
// row the offset of its scale row, so two FP8 tensors stacked along n (gate and up) keep
// their own block grids. Codes 0x7F and 0xFF (NaN) are not allowed (the loader rejects them).
struct fp8_matrix {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  const int32_t* row_scales = nullptr;  // (n)
  int64_t block_k = 128;
};

// y (m, n) = x (m, k) · wᵀ with w FP8. Few rows (or batch_invariant): fixed-order dot products
// that widen the codes in registers, each block's partial sum × its scale. Many rows: rows of
// w are dequantised block by block into fp32 and multiplied by OpenBLAS.
void matmul_fp8(const float* x, const fp8_matrix& w, float* y, int64_t m, int64_t n, int64_t k,
                bool batch_invariant);

// y (m, n) = x (m, k) · w (k, n), w rows `ldw` floats apart (ldw ≥ n). Not batch-invariant
// (OpenBLAS when large); callers on the invariant path use matmul.
void matmul_nn(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
               int64_t ldw);

// y (rows, dim) = x · rsqrt(mean(x²) + eps) ⊙ w. In place allowed (y == x).
void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps);

// Rotates interleaved pairs (x[2i], x[2i+1]) of `heads` vectors of rope_dim values per row:
// x points at the first rope value of head 0 of row 0; row r starts at x + r·row_stride,
// head h at + h·head_stride. Angle = positions[r] · inv_freq[i]; results × attn_factor.
void rope(float* x, int64_t rows, int64_t row_stride, int64_t heads, int64_t head_stride,
          const int32_t* positions, const float* inv_freq, int64_t rope_dim, float attn_factor);

// out (n) = silu(gate) ⊙ up.
void silu_mul(const float* gate, const float* up, float* out, int64_t n);

// In-place softmax of n values (max-subtracted, fp32).
void softmax(float* x, int64_t n);

// noaux_tc MoE routing of one token: s = sigmoid(logits) (E); selection on s + bias with
// group-limited top-k; writes top_k expert ids (descending selection score, ties to the lower
// id) and their weights (s normalised when norm_topk_prob, × scaling).
struct gate_params {
  int64_t n_experts = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  int64_t top_k = 0;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
};
void moe_gate(const float* logits, const float* bias, const gate_params& p, int32_t* ids,
              float* weights);

// A run of latent entries: `count` entries of entry_dim values, consecutive entries
// `stride` floats apart (stride ≥ entry_dim). Paged blocks and ring buffers are lists of runs.
struct kv_segment {
  const float* data = nullptr;
  int64_t count = 0;
  int64_t stride = 0;
};

// A run of stored cache entries (kv_codec.hpp forms): `count` entries, consecutive entries
// `stride` bytes apart. A sequence's visible set is a list of runs (paged blocks in the
// cache's form, fp32 ring and chunk entries).
struct kv_run {
  const uint8_t* data = nullptr;
  int64_t count = 0;
  int64_t stride = 0;  // bytes
  kv_elem elem = kv_elem::f32;
};

// Absorbed MLA attention of one query over the union of `runs`, in one softmax.
// q_lat (heads, r), q_pe (heads, rope): entry j = (c_j (r) ‖ k_pe_j (rope));
// score = (q_lat·c + q_pe·k_pe)·scale; `sink` (heads) joins the denominator when non-null.
// o_lat (heads, r) = Σ p_j c_j. Each entry is widened once into a buffer of r + rope floats
// and used by every head. `scratch` holds ≥ heads · total + r + rope floats. Each head's
// scores and sums run in entry order, so o_lat does not depend on how the runs are split.
void mla_attend(const float* q_lat, const float* q_pe, const kv_run* runs, int n_runs, int64_t heads,
                int64_t r, int64_t rope, float scale, const float* sink, float* o_lat, float* scratch);
size_t mla_attend_scratch(int64_t heads, int64_t total, int64_t r, int64_t rope);

// Fixed-order dot product (8 lanes × 4 accumulators, combined in a fixed order).
float dot(const float* a, const float* b, int64_t n);
// y (n) += alpha · x.
void axpy(float alpha, const float* x, float* y, int64_t n);

}  // namespace shoal::kernels
