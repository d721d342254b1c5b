// Loading a model directory into what an engine needs (weights + tokenizer), and sizing an
// engine's caches from a memory budget. Shared by the CLI, the examples and the daemons.
#pragma once

#include <memory>
#include <string>

#include "model/error.hpp"
#include "model/tokenizer.hpp"
#include "model/weights.hpp"
#include "runtime/engine/engine.hpp"

namespace shoal::runtime {

struct loaded_model {
  std::shared_ptr<const model::model_weights> weights;
  std::shared_ptr<const model::tokenizer> tokenizer;
};

// Reads DIR/config.json, the safetensors and DIR/tokenizer.json. Errors name file and field.
// `options` as model::load_weights (an expert-parallel node reads no routed experts here).
model::result<loaded_model> load_model_dir(const std::string& dir, bool show_progress,
                                          const model::load_options& options = {});

// Engine defaults for a model: cache blocks from `cache_mib` of block memory (at least
// enough for one max-length request of 4,096 tokens) in KV format `kv`, SWA slots = max_running.
engine_config default_engine_config(const model::model_config& c, double cache_mib,
                                    model::kv_dtype kv = model::kv_dtype::bf16);

// Prompt text → token ids with BOS prepended (as HF's add_bos_token does).
std::vector<int32_t> encode_prompt(const model::tokenizer& tok, const std::string& text);

}  // namespace shoal::runtime
