// In-memory weights of one model, fp32, laid out for the CPU forward pass (expert gate and up
// projections fused). visit_tensors() enumerates every checkpoint tensor with its shape and
// destination, so the loader and the checkpoint generator share one list of names.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/config.hpp"
#include "model/error.hpp"

namespace shoal::model {

// A projection kept FP8 as the checkpoint stores it: e4m3fn codes with fp32 block scales
// (kernels::fp8_matrix over these vectors).
struct fp8_weights {
  std::vector<uint8_t> codes;        // (out, in)
  std::vector<float> scales;         // the scale rows of every stacked tensor, in order
  std::vector<int32_t> row_scales;   // (out): offset in scales of each output row's scale row
  int64_t block_in = 128;            // columns per scale
};

// A projection's weights in one of three storages: fp32, or as the checkpoint stores them,
// bf16 or FP8 with block scales (the loader keeps the large projections of the layers and
// the vocabulary heads and kv_b in their checkpoint precision; the router, the confidence head
// and the vision encoder stay fp32: small, or read in slices).
struct linear {
  std::vector<float> w;          // (out, in)
  std::vector<uint16_t> w_bf16;  // (out, in) when kept bf16 instead (then w is empty)
  fp8_weights w_fp8;             // codes non-empty when kept FP8 instead (then w is empty)
  int64_t out = 0, in = 0;
  bool empty() const { return w.empty() && w_bf16.empty() && w_fp8.codes.empty(); }
  size_t bytes() const;          // memory held by the weights (and FP8 scales)
};

// y (m, out) = x (m, in) · wᵀ, through whichever storage the layer has.
void apply(const linear& l, const float* x, float* y, int64_t m, bool batch_invariant);
// y (m, n) = x (m, in) · (rows [row0, row0 + n) of l)ᵀ, through whichever storage it has.
void apply_rows(const linear& l, int64_t row0, int64_t n, const float* x, float* y, int64_t m, bool batch_invariant);
// out (in) = row `row` of l as fp32 (embedding lookups; exact for bf16, dequantised for FP8).
void row_of(const linear& l, int64_t row, float* out);

struct attn_weights {
  linear q_proj;                 // q_lora_rank == 0
  linear q_a, q_b;               // q_lora_rank > 0
  std::vector<float> q_a_norm;   // (q_lora_rank)
  linear kv_a;                   // (r + rope, d)
  std::vector<float> kv_a_norm;  // (r)
  linear kv_b;                   // (H·(nope+v), r)
  linear o_proj;                 // (d, H·v)
  std::vector<float> kv_compress;  // (d); empty when the layer does not compress
  std::vector<float> sink;         // (H); empty without attn_sink
  // Derived at load: W_UK of each head transposed, for absorbing queries with one GEMM;
  // bf16 when kv_b is (exact), fp32 otherwise.
  linear w_uk_t;                   // (H·r, nope)
};

struct expert_weights {
  linear gate_up;  // (2·I, d): rows 0..I−1 gate, I..2I−1 up
  linear down;     // (d, I)
};

struct ffn_weights {
  bool moe = false;
  expert_weights dense;                // dense layers
  linear router;                       // (E, d)
  std::vector<float> router_bias;      // (E) e_score_correction_bias
  std::vector<expert_weights> experts; // (E)
  expert_weights shared;               // width I_moe·n_shared; empty when n_shared == 0
};

struct layer_weights {
  std::vector<float> input_norm, post_norm;  // (d)
  attn_weights attn;
  ffn_weights ffn;
};

struct decoder_kv_weights {
  std::vector<float> input_norm;   // (d)
  linear kv_a;                     // (r + rope, d)
  std::vector<float> kv_a_norm;    // (r)
  std::vector<float> kv_compress;  // (d)
};

// embed and head are empty when the checkpoint shares the main model's (read w.embed and
// w.lm_head then: mtp_embed(), mtp_head()).
struct mtp_weights {
  std::vector<float> enorm, hnorm;  // (d)
  linear eh_proj;                   // (d, 2d)
  layer_weights layer;
  std::vector<float> head_norm;     // (d)
  linear head;                      // (V, d)
  linear embed;                     // (V, d): a table, read a row at a time (row_of)
};

// The vision encoder (model/vision.hpp; names in model/README.md). LayerNorms have weight
// and bias; Dv = vision.hidden, G = vision.grid().
struct vision_block_weights {
  std::vector<float> norm1_w, norm1_b;  // (Dv)
  linear qkv;                           // (3·Dv, Dv): q rows, then k, then v
  std::vector<float> qkv_b;             // (3·Dv)
  linear proj;                          // (Dv, Dv)
  std::vector<float> proj_b;
  std::vector<float> norm2_w, norm2_b;
  linear fc1;                           // (4·Dv, Dv)
  std::vector<float> fc1_b;
  linear fc2;                           // (Dv, 4·Dv)
  std::vector<float> fc2_b;
};

struct vision_weights {
  linear patch_embed;                   // (Dv, patch·patch·3): a patch's pixels in (row, column, channel) order
  std::vector<float> patch_b;           // (Dv)
  std::vector<float> pos_embed;         // (G·G, Dv): patch (r, c) of any image adds row r·G + c
  std::vector<vision_block_weights> layers;
  std::vector<float> post_norm_w, post_norm_b;  // (Dv)
  linear proj1;                         // (d, Dv)
  std::vector<float> proj1_b;           // (d)
  linear proj2;                         // (d, d)
  std::vector<float> proj2_b;           // (d)
};

struct model_weights {
  model_config config;
  linear embed;              // (V, d): a table, read a row at a time (row_of)
  std::vector<layer_weights> layers;
  std::vector<float> norm;   // (d)
  linear lm_head;            // (V, d)
  decoder_kv_weights decoder_kv;
  std::vector<mtp_weights> mtp;
  linear conf_fc1, conf_fc2;  // (hc, d), (1, hc); empty when conf_head_hidden == 0
  vision_weights vision;      // empty without config.vision
  // Derived at load: RoPE table and attention scale.
  std::vector<float> inv_freq;  // (rope/2)
  float attn_factor = 1.0f;
  float softmax_scale = 1.0f;
};

// The embedding and head an MTP layer reads: its own, or the main model's when shared.
inline const linear& mtp_embed(const model_weights& w, const mtp_weights& m) {
  return m.embed.empty() ? w.embed : m.embed;
}
inline const linear& mtp_head(const model_weights& w, const mtp_weights& m) {
  return m.head.empty() ? w.lm_head : m.head;
}

// How the generator initialises a tensor.
enum class init_kind { norm, linear, embed, bias, sink };

struct tensor_slot {
  std::string name;
  std::vector<int64_t> shape;
  init_kind init;
  // Where its values go (prod(shape) floats); null for a slot that comes unallocated (a
  // shared or a narrowable one): a caller that gives it fp32 values calls slot_storage().
  float* dest;
  // MTP embed/head: a checkpoint may omit the tensor, which then shares the main model's
  // ("embedding and head shared with the main model"); left empty, the MTP layer reads the
  // main model's tensor, no copy.
  bool shared = false;
  // The linear this tensor fills, from element `offset` of it (the up half of a fused
  // gate_up starts at width·d), when the loader keeps it in the checkpoint's precision:
  // bf16 as bf16, FP8 as codes and scales, straight from the file with no fp32 copy; fp32
  // (slot_storage) only where the checkpoint has another dtype. The linear comes unallocated.
  linear* narrowable = nullptr;
  std::vector<float>* storage = nullptr;  // what slot_storage() sizes for a non-narrowable shared slot
  int64_t offset = 0;
  // A routed expert's tensor: its MoE slot (model/forward.hpp) and expert id; −1 otherwise.
  int64_t moe_slot = -1, expert = -1;
};

// Asks the kernel to back [p, p + bytes) with 2 MiB pages where whole ones fit: a GEMV
// streams through its weights, and on 4 KiB pages every 4 KiB is a TLB miss. Drops what
// the range holds (reads then give zeros): call it on storage just sized, before writing
// it. Without transparent huge pages it changes nothing.
void back_with_huge_pages(void* p, size_t bytes);

// dest of `t`, allocating a shared slot's own storage first.
float* slot_storage(const tensor_slot& t);

// Sizes every weight of `w` from w.config and calls `fn` once per checkpoint tensor.
void visit_tensors(model_weights& w, const std::function<void(const tensor_slot&)>& fn);

// Computes what the forward pass derives from the checkpoint: inv_freq, attn_factor,
// softmax_scale from w.config, and each layer's transposed W_UK.
void derive(model_weights& w);

// A progress callback for load_weights that prints MiB loaded to stderr for checkpoints of
// 64 MiB and more (small ones load too fast to be worth a line).
void print_load_progress(size_t done, size_t total);

// Which routed experts a load reads: keep_routed_expert(moe_slot, expert); all when unset.
// An expert left out stays empty (its linears hold nothing, nothing of it is read or mapped):
// an expert-parallel rank reads its own later (expert_reader).
struct load_options {
  std::function<bool(int64_t moe_slot, int64_t expert)> keep_routed_expert;
};

// Loads config.json + safetensors from `dir`. Errors name the file and tensor.
result<model_weights> load_weights(const std::string& dir,
                                   void (*progress)(size_t done, size_t total) = nullptr,
                                   const load_options& options = {});

// The routed experts of `w` (a model loaded from `dir`) read or dropped one at a time, for
// an expert-parallel rank whose layout changes. Not thread-safe; the caller makes sure no
// forward pass reads an expert while it is read or dropped.
class expert_reader {
 public:
  static result<expert_reader> open(const std::string& dir);
  // Reads expert `expert` of `moe_slot` into w as load_weights would have (same precision).
  result<void> read(model_weights& w, int64_t moe_slot, int64_t expert) const;
  // The same weights read into a fresh expert_weights (nothing of a model_weights touched):
  // for reading on another thread while the model is in use.
  result<expert_weights> read(const model_config& c, int64_t moe_slot, int64_t expert) const;
  // Frees its memory (it becomes empty).
  static void drop(model_weights& w, int64_t moe_slot, int64_t expert);

 private:
  struct impl;
  explicit expert_reader(std::shared_ptr<const impl> p) : impl_(std::move(p)) {}
  std::shared_ptr<const impl> impl_;
};

// The weights of routed expert `expert` of `moe_slot` (model/forward.hpp's numbering).
expert_weights& routed_expert_weights(model_weights& w, int64_t moe_slot, int64_t expert);

}  // namespace shoal::model
