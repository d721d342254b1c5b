// Model configuration as read from a Hugging Face style config.json, for both
// architectures shoal serves: `deepseek_v3` (published MLA + MoE) and `shoal_flash`
// (compressed block cache + sliding window + YOCO decoder). Field names follow the HF names.
#pragma once

#include <cstdint>
#include <string>

#include "model/error.hpp"

namespace shoal::model {

enum class arch { deepseek_v3, shoal_flash };

struct rope_scaling_config {
  bool yarn = false;                 // rope_scaling.type == "yarn"
  double factor = 1.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 1.0;
};

// The vision encoder (model/vision.hpp). An image of w × h pixels (each a multiple of
// patch_size, at most image_size) takes (w / patch) · (h / patch) placeholder tokens.
struct vision_config {
  bool present = false;
  int64_t image_size = 0;      // largest side, pixels
  int64_t patch_size = 0;
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t image_token_id = -1;  // the placeholder token the image's rows replace
  int64_t grid() const { return image_size / patch_size; }  // patches per side at most
};

// quantization_config of an FP8 checkpoint (DeepSeek-V3's: quant_method "fp8", fmt "e4m3",
// activation_scheme "dynamic", weight_block_size [rows, cols]): each FP8 weight has a
// `<name>_scale_inv` of ceil(out / rows) × ceil(in / cols) fp32 scales. Activations stay fp32
// here, so "dynamic" activation quantisation is met by not quantising them at all.
struct quantization_config {
  bool present = false;       // the field was in config.json
  int64_t block_rows = 128;   // weight_block_size[0]; 128 × 128 where the field is absent
  int64_t block_cols = 128;   // weight_block_size[1]
};

struct model_config {
  arch architecture = arch::deepseek_v3;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;      // deepseek_v3: all layers; shoal_flash: n_enc + n_dec
  int64_t first_k_dense_replace = 0;
  int64_t intermediate_size = 0;
  int64_t moe_intermediate_size = 0;
  int64_t num_attention_heads = 0;
  int64_t q_lora_rank = 0;            // 0 = single q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  double routed_scaling_factor = 1.0;
  bool norm_topk_prob = true;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  rope_scaling_config rope_scaling;
  int64_t max_position_embeddings = 0;
  int64_t num_nextn_predict_layers = 0;
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 1;

  // shoal_flash only (deepseek_v3 behaves as n_encoder_layers = all, window 1, ratio 1).
  int64_t n_encoder_layers = 0;
  int64_t n_decoder_layers = 0;
  int64_t sliding_window = 0;
  int64_t compress_ratio = 1;
  int64_t block_size = 64;
  std::string swa_mode = "compact";   // "exact" | "compact"
  int64_t retained_tokens = 0;
  int64_t replay_tokens = 0;
  int64_t conf_head_hidden = 0;
  bool attn_sink = false;
  vision_config vision;
  quantization_config quantization;

  // Derived helpers.
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t entry_dim() const { return kv_lora_rank + qk_rope_head_dim; }  // one latent entry
  bool is_flash() const { return architecture == arch::shoal_flash; }
  int64_t encoder_layers() const { return is_flash() ? n_encoder_layers : num_hidden_layers; }
  int64_t decoder_layers() const { return is_flash() ? n_decoder_layers : 0; }
  int64_t window() const { return is_flash() ? sliding_window : 1; }
  int64_t ratio() const { return is_flash() ? compress_ratio : 1; }
  // Caches of compressed entries kept in paged blocks: one per encoder layer, plus the
  // shared decoder cache for shoal_flash.
  int64_t cache_layers() const { return encoder_layers() + (is_flash() ? 1 : 0); }
  bool is_moe_layer(int64_t layer) const {
    return n_routed_experts > 0 && layer >= first_k_dense_replace;
  }
  double softmax_scale() const;       // (nope+rope)^-0.5 × mscale² (YaRN)
};

// Parses config.json text. `file` is only used in error messages.
result<model_config> parse_config(std::string_view json_text, const std::string& file);
// Reads DIR/config.json.
result<model_config> load_config(const std::string& dir);
// Serialises to config.json text (HF field names; round-trips through parse_config).
std::string to_json(const model_config& config);

}  // namespace shoal::model
