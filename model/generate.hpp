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

struct generate_options {
  std::string preset = "tiny";
  uint64_t seed = 0;
  std::string out_dir;
  std::string tokenizer_dir;  // holds the DeepSeek-V3 tokenizer.json (small preset)
  bool verbose = false;
};

// Fills every weight of `w` (sized from w.config) with the seeded initialiser and derives the
// RoPE tables and transposed W_UK: an in-memory model for tests that tweak a config without writing files.
void init_random(model_weights& w, uint64_t seed);

// Writes the checkpoint into out_dir (created). Same preset + seed → byte-identical files.
result<void> generate_checkpoint(const generate_options& options);

}  // namespace shoal::model
