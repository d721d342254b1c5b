// Deterministic random checkpoints of the presets (tiny, small, v3-tiny), written in the exact
// on-disk format the loader reads: config.json, safetensors (v3-tiny: FP8 linears with block
// scales, sharded with an index, as published), tokenizer.json and tokenizer_config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.hpp"
#include "model/error.hpp"
#include "model/weights.hpp"

namespace shoal::model {

std::vector<std::string> preset_names();

// The preset's config; `vocab_size` is set from its tokenizer when the checkpoint is written.
result<model_config> preset_config(const std::string& preset);

// The vision encoder of a preset (`shoal mkmodel --vision`): tiny and v3-tiny 56-pixel
// images in 14-pixel patches (at most 16 tokens), 2 blocks of width 32; small 224 pixels
// (at most 256 tokens), 4 blocks of width 384. image_token_id is set from the tokenizer.
result<vision_config> vision_preset(const std::string& preset);
// The placeholder token of images: "<image>" (a special of the tiny tokenizers) or, in the
// DeepSeek-V3 tokenizer, its first reserved placeholder.
std::string image_token_text(const std::string& preset);

struct generate_options {
  std::string preset = "tiny";
  uint64_t seed = 0;
  std::string out_dir;
  std::string tokenizer_dir;  // holds the DeepSeek-V3 tokenizer.json (small preset)
  bool vision = false;        // with the vision encoder (vision_preset) and its image token
  // "bf16" or "fp8" (the layers' linears FP8 e4m3 with 128×128 block scales, as DeepSeek-V3
  // publishes them); empty: the preset's own (fp8 for v3-tiny, bf16 for the others).
  std::string dtype;
  // A skewed routing for balancer tests and benches: every MoE layer's gate bias
  // (e_score_correction_bias) raised by hot_bias for experts [0, hot_experts), so those
  // experts take most tokens, as a narrow domain's hot experts do. 0: no skew.
  int64_t hot_experts = 0;
  float hot_bias = 0.25f;
  bool verbose = false;
};

// Fills every weight of `w` (sized from w.config) with the seeded initialiser and derives the
// RoPE tables and transposed W_UK: an in-memory model for tests that tweak a config without writing files.
void init_random(model_weights& w, uint64_t seed);

// Writes the checkpoint into out_dir (created). Same preset + seed → byte-identical files.
result<void> generate_checkpoint(const generate_options& options);

}  // namespace shoal::model
