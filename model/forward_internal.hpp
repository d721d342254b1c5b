// Pieces of the forward pass shared between forward.cpp, attention.cpp, ffn.cpp and mtp.cpp.
// Not part of the model's public interface.
#pragma once

#include <span>
#include <vector>

#include "kernels/cpu/kv_codec.hpp"
#include "model/forward.hpp"

namespace shoal::model::detail {

// Rows [row, row + p1 − p0) of a batch buffer hold positions [p0, p1) of one item.
struct row_span {
  int64_t row = 0, p0 = 0, p1 = 0;
};

inline kernels::kv_elem elem_of(kv_dtype d) {
  return d == kv_dtype::bf16 ? kernels::kv_elem::bf16 : d == kv_dtype::fp8 ? kernels::kv_elem::e4m3_mx : kernels::kv_elem::f32;
}
// The cache format of a batch (every item's pages are one engine's); fp32 when there are none.
kv_format batch_format(std::span<const forward_item> items);

struct layer_io {
  int64_t stream;          // ring this layer's raw entries go to
  int64_t comp_layer;      // cache layer whose compressed entries it attends to (−1: none)
  bool writes_comp;        // encoder layers write their own compressed runs
  const int32_t* positions;  // (rows)
  int64_t window = 0;        // 0 = the model's window; MTP of deepseek_v3 sees all its rows
  int64_t moe_slot = -1;     // this layer's MoE slot (moe_slot_of_layer), −1 when dense
};

// Entries (rows, entry_dim + 1): latent ‖ rope, rounded to `f`'s stored values, ‖ compress logit.
void compute_entries(const model_weights& w, const linear& kv_a, const std::vector<float>& kv_a_norm,
                     const std::vector<float>& kv_compress, const float* xn, int64_t rows,
                     const int32_t* positions, bool invariant, const kv_format& f, float* entries);
void write_runs(const model_config& c, sequence_cache& cache, int64_t stream, int64_t cache_layer,
                const float* chunk_entries, int64_t p0, int64_t p1, int64_t valid_until);
void store_ring(sequence_cache& cache, int64_t stream, const float* chunk_entries, int64_t p0,
                int64_t p1, int64_t dim);

// out (rows, d) = attention of layer l over x (rows, d); writes entries/runs/rings.
void attention(const model_weights& w, const layer_weights& l, std::span<forward_item> items,
               const std::vector<row_span>& spans, const layer_io& io, const float* x,
               int64_t rows, const forward_options& o, float* out);
// x (rows, d) += attn(x); x += ffn(x).
void run_layer(const model_weights& w, const layer_weights& l, std::span<forward_item> items,
               const std::vector<row_span>& spans, const layer_io& io, float* x, int64_t rows,
               const forward_options& o);
// out (rows, d) = ffn(post_norm(x)); routed experts through o.moe when set (slot moe_slot).
void ffn(const model_weights& w, const layer_weights& l, const float* x, int64_t rows,
         const forward_options& o, int64_t moe_slot, float* out);
// out (rows, d) = SwiGLU_e(xn (rows, d)).
void swiglu(const expert_weights& e, const float* xn, int64_t rows, int64_t d, bool invariant,
            float* out);
// The confidence head (DSpark) on an MTP depth's head-normed last row (d): the predicted
// probability that its draft is accepted; NaN when the model has no confidence head.
float draft_confidence(const model_weights& w, const float* head_row);
// Projects the shoal_flash shared decoder cache from the encoder output h_E (rows, d).
void decoder_cache(const model_weights& w, std::span<forward_item> items,
                   const std::vector<row_span>& spans, const float* h_e, int64_t rows,
                   const int32_t* positions, const forward_options& o);

}  // namespace shoal::model::detail
