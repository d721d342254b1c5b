// Model directory loading and engine sizing.
#include "runtime/engine/engine_setup.hpp"

namespace shoal::runtime {
model::result<loaded_model> load_model_dir(const std::string& dir, bool show_progress,
                                          const model::load_options& options) {
  auto w = model::load_weights(dir, show_progress ? model::print_load_progress : nullptr, options);
  if (!w) return std::unexpected(w.error());
  auto tok = model::tokenizer::load(dir + "/tokenizer.json");
  if (!tok) return std::unexpected(tok.error());
  return loaded_model{std::make_shared<const model::model_weights>(std::move(*w)),
                      std::make_shared<const model::tokenizer>(std::move(*tok))};
}

engine_config default_engine_config(const model::model_config& c, double cache_mib, model::kv_dtype kv) {
  engine_config e;
  e.cache.kv_dtype = kv;
  double block_bytes = static_cast<double>(model::kv_format_of(c, kv).block_bytes());
  int64_t blocks = static_cast<int64_t>(cache_mib * 1024 * 1024 / block_bytes);
  e.cache.num_blocks = std::max<int64_t>(blocks, (4096 + c.block_size - 1) / c.block_size);
  e.cache.exact_swa = c.swa_mode == "exact";
  e.cache.swa_slots = e.sched.max_running;
  return e;
}

std::vector<int32_t> encode_prompt(const model::tokenizer& tok, const std::string& text) {
  std::vector<int32_t> ids;
  if (tok.bos_id() >= 0) ids.push_back(tok.bos_id());
  auto body = tok.encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

}  // namespace shoal::runtime
