// config.json → model_config for both architectures (deepseek_v3, shoal_flash), and back.
// Parsing is strict: a field of the wrong JSON type, a missing required field or a value
// outside its domain is an error naming the file and the field, because a silently wrong
// dimension would only surface later as a shape error deep in the weight loader.
#include "model/config.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <nlohmann/json.hpp>

namespace shoal::model {

namespace {

using json = nlohmann::json;

bool extract(const json& j, int64_t& out) {
  if (!j.is_number_integer()) return false;
  if (j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return false;
  out = j.get<int64_t>();
  return true;
}
bool extract(const json& j, double& out) {
  if (!j.is_number()) return false;
  out = j.get<double>();
  return std::isfinite(out);
}
bool extract(const json& j, bool& out) {
  if (!j.is_boolean()) return false;
  out = j.get<bool>();
  return true;
}
bool extract(const json& j, std::string& out) {
  if (!j.is_string()) return false;
  out = j.get<std::string>();
  return true;
}

const char* type_name(const int64_t&) { return "an integer"; }
const char* type_name(const double&) { return "a number"; }
const char* type_name(const bool&) { return "a boolean"; }
const char* type_name(const std::string&) { return "a string"; }

// Reads and checks fields, keeping the first error so the parse reads as a flat list of
// fields; later reads after an error are no-ops.
class config_parser {
 public:
  explicit config_parser(const std::string& file) : file_(file) {}

  // A JSON null counts as absent (HF writes e.g. "q_lora_rank": null).
  const json* lookup(const json& obj, const std::string& name) const {
    auto it = obj.find(name);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }

  template <class T>
  void read(const json& obj, const std::string& prefix, const std::string& name, T& out,
            bool required = false) {
    if (err_) return;
    const json* j = lookup(obj, name);
    if (!j) {
      if (required) set(errc::missing_field, "missing required field '" + prefix + name + "'");
      return;
    }
    if (!extract(*j, out)) {
      set(errc::bad_json, "field '" + prefix + name + "' must be " + type_name(out));
    }
  }

  // Optional string field that, when present, must equal `only`.
  void read_fixed(const json& obj, const std::string& name, const std::string& only) {
    std::string value = only;
    read(obj, "", name, value);
    if (!err_ && value != only) {
      set(errc::unsupported, "field '" + name + "' is '" + value + "'; only '" + only + "' is supported");
    }
  }

  void require(bool ok, const std::string& field, const std::string& what, const std::string& got) {
    if (!ok) set(errc::bad_value, "field '" + field + "' " + what + " (got " + got + ")");
  }
  void positive(int64_t v, const std::string& field) { require(v > 0, field, "must be positive", std::to_string(v)); }
  void non_negative(int64_t v, const std::string& field) {
    require(v >= 0, field, "must not be negative", std::to_string(v));
  }
  void positive(double v, const std::string& field) {
    std::ostringstream s;
    s << v;
    require(v > 0, field, "must be positive", s.str());
  }

  void set(errc code, const std::string& what) {
    if (!err_) err_ = error{code, file_ + ": " + what};
  }
  bool failed() const { return err_.has_value(); }
  const error& err() const { return *err_; }

 private:
  const std::string& file_;
  std::optional<error> err_;
};

void read_common(config_parser& p, const json& j, model_config& c) {
  p.read(j, "", "vocab_size", c.vocab_size, true);
  p.read(j, "", "hidden_size", c.hidden_size, true);
  p.read(j, "", "num_hidden_layers", c.num_hidden_layers, true);
  p.read(j, "", "intermediate_size", c.intermediate_size, true);
  p.read(j, "", "num_attention_heads", c.num_attention_heads, true);
  p.read(j, "", "kv_lora_rank", c.kv_lora_rank, true);
  p.read(j, "", "qk_nope_head_dim", c.qk_nope_head_dim, true);
  p.read(j, "", "qk_rope_head_dim", c.qk_rope_head_dim, true);
  p.read(j, "", "v_head_dim", c.v_head_dim, true);
  p.read(j, "", "rms_norm_eps", c.rms_norm_eps, true);
  p.read(j, "", "first_k_dense_replace", c.first_k_dense_replace);
  p.read(j, "", "q_lora_rank", c.q_lora_rank);
  p.read(j, "", "rope_theta", c.rope_theta);
  p.read(j, "", "max_position_embeddings", c.max_position_embeddings);
  p.read(j, "", "num_nextn_predict_layers", c.num_nextn_predict_layers);
  p.read(j, "", "bos_token_id", c.bos_token_id);
  p.read(j, "", "eos_token_id", c.eos_token_id);
  p.read(j, "", "block_size", c.block_size);
  p.read(j, "", "conf_head_hidden", c.conf_head_hidden);
  p.read(j, "", "attn_sink", c.attn_sink);
}

void read_moe(config_parser& p, const json& j, model_config& c) {
  p.read(j, "", "n_routed_experts", c.n_routed_experts);
  const bool moe = c.n_routed_experts > 0;
  p.read(j, "", "moe_intermediate_size", c.moe_intermediate_size, moe);
  p.read(j, "", "num_experts_per_tok", c.num_experts_per_tok, moe);
  p.read(j, "", "n_group", c.n_group, moe);
  p.read(j, "", "topk_group", c.topk_group, moe);
  p.read(j, "", "n_shared_experts", c.n_shared_experts);
  p.read(j, "", "routed_scaling_factor", c.routed_scaling_factor);
  p.read(j, "", "norm_topk_prob", c.norm_topk_prob);
  p.read_fixed(j, "topk_method", "noaux_tc");
  p.read_fixed(j, "scoring_func", "sigmoid");
}

void read_rope_scaling(config_parser& p, const json& j, rope_scaling_config& r) {
  const json* rs = p.lookup(j, "rope_scaling");
  if (!rs || p.failed()) return;
  if (!rs->is_object()) return p.set(errc::bad_json, "field 'rope_scaling' must be an object or null");
  std::string type;
  const std::string type_key = rs->contains("type") ? "type" : "rope_type";  // newer HF: rope_type
  p.read(*rs, "rope_scaling.", type_key, type, true);
  if (p.failed()) return;
  if (type != "yarn") {
    return p.set(errc::unsupported, "field 'rope_scaling." + type_key + "' is '" + type + "'; only 'yarn' is supported");
  }
  r.yarn = true;
  p.read(*rs, "rope_scaling.", "factor", r.factor, true);
  p.read(*rs, "rope_scaling.", "original_max_position_embeddings", r.original_max_position_embeddings);
  p.read(*rs, "rope_scaling.", "beta_fast", r.beta_fast);
  p.read(*rs, "rope_scaling.", "beta_slow", r.beta_slow);
  p.read(*rs, "rope_scaling.", "mscale", r.mscale);
  p.read(*rs, "rope_scaling.", "mscale_all_dim", r.mscale_all_dim);
  if (p.failed()) return;
  p.require(r.factor >= 1.0, "rope_scaling.factor", "must be at least 1", std::to_string(r.factor));
  p.positive(r.original_max_position_embeddings, "rope_scaling.original_max_position_embeddings");
  p.positive(r.beta_fast, "rope_scaling.beta_fast");
  p.positive(r.beta_slow, "rope_scaling.beta_slow");
}

void read_quantization(config_parser& p, const json& j, quantization_config& q) {
  const json* qj = p.lookup(j, "quantization_config");
  if (!qj) return;
  if (!qj->is_object()) return p.set(errc::bad_json, "field 'quantization_config' must be an object or null");
  q.present = true;
  std::string method, fmt = "e4m3", activations = "dynamic";
  p.read(*qj, "quantization_config.", "quant_method", method, true);
  if (!p.failed() && method != "fp8")
    return p.set(errc::unsupported, "field 'quantization_config.quant_method' is '" + method + "'; only 'fp8' is supported");
  p.read(*qj, "quantization_config.", "fmt", fmt);
  if (!p.failed() && fmt != "e4m3")
    return p.set(errc::unsupported, "field 'quantization_config.fmt' is '" + fmt + "'; only 'e4m3' is supported");
  p.read(*qj, "quantization_config.", "activation_scheme", activations);
  if (!p.failed() && activations != "dynamic")
    return p.set(errc::unsupported, "field 'quantization_config.activation_scheme' is '" + activations +
                                         "'; only 'dynamic' is supported (static activation scales are not read)");
  if (const json* b = p.lookup(*qj, "weight_block_size")) {
    if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number_integer() || !(*b)[1].is_number_integer())
      return p.set(errc::bad_json, "field 'quantization_config.weight_block_size' must be two integers [rows, cols]");
    q.block_rows = (*b)[0].get<int64_t>(), q.block_cols = (*b)[1].get<int64_t>();
    p.positive(q.block_rows, "quantization_config.weight_block_size[0]");
    p.positive(q.block_cols, "quantization_config.weight_block_size[1]");
  }
  for (const auto& [key, value] : qj->items())
    if (key != "quant_method" && key != "fmt" && key != "activation_scheme" && key != "weight_block_size")
      return p.set(errc::unsupported, "field 'quantization_config." + key + "' is not supported");
}

void read_vision(config_parser& p, const json& j, vision_config& v) {
  const json* vj = p.lookup(j, "vision");
  if (!vj || p.failed()) return;
  if (!vj->is_object()) return p.set(errc::bad_json, "field 'vision' must be an object");
  v.present = true;
  p.read(*vj, "vision.", "image_size", v.image_size, true);
  p.read(*vj, "vision.", "patch_size", v.patch_size, true);
  p.read(*vj, "vision.", "layers", v.layers, true);
  p.read(*vj, "vision.", "hidden", v.hidden, true);
  p.read(*vj, "vision.", "heads", v.heads, true);
  p.read(*vj, "vision.", "image_token_id", v.image_token_id, true);
  if (p.failed()) return;
  p.positive(v.image_size, "vision.image_size");
  p.positive(v.patch_size, "vision.patch_size");
  p.positive(v.layers, "vision.layers");
  p.positive(v.hidden, "vision.hidden");
  p.positive(v.heads, "vision.heads");
  if (p.failed()) return;
  p.require(v.image_size % v.patch_size == 0, "vision.image_size", "must be a multiple of vision.patch_size",
            std::to_string(v.image_size));
  p.require(v.hidden % v.heads == 0, "vision.hidden", "must be a multiple of vision.heads",
            std::to_string(v.hidden));
  p.require(v.image_token_id >= 0, "vision.image_token_id", "must be a token id", std::to_string(v.image_token_id));
}

void read_flash(config_parser& p, const json& j, model_config& c) {
  p.read(j, "", "n_encoder_layers", c.n_encoder_layers, true);
  p.read(j, "", "n_decoder_layers", c.n_decoder_layers, true);
  p.read(j, "", "sliding_window", c.sliding_window, true);
  p.read(j, "", "compress_ratio", c.compress_ratio, true);
  p.read(j, "", "block_size", c.block_size, true);
  p.read(j, "", "swa_mode", c.swa_mode, true);
  p.read(j, "", "retained_tokens", c.retained_tokens, true);
  p.read(j, "", "replay_tokens", c.replay_tokens, true);
}

void validate_common(config_parser& p, const model_config& c) {
  p.positive(c.vocab_size, "vocab_size");
  p.positive(c.hidden_size, "hidden_size");
  p.positive(c.num_hidden_layers, "num_hidden_layers");
  p.positive(c.intermediate_size, "intermediate_size");
  p.positive(c.num_attention_heads, "num_attention_heads");
  p.positive(c.kv_lora_rank, "kv_lora_rank");
  p.positive(c.qk_nope_head_dim, "qk_nope_head_dim");
  p.positive(c.qk_rope_head_dim, "qk_rope_head_dim");
  p.positive(c.v_head_dim, "v_head_dim");
  p.require(c.qk_rope_head_dim % 2 == 0, "qk_rope_head_dim", "must be even (RoPE rotates pairs)",
            std::to_string(c.qk_rope_head_dim));
  p.positive(c.rms_norm_eps, "rms_norm_eps");
  p.positive(c.rope_theta, "rope_theta");
  p.non_negative(c.first_k_dense_replace, "first_k_dense_replace");
  p.require(c.first_k_dense_replace <= c.num_hidden_layers, "first_k_dense_replace",
            "must not exceed num_hidden_layers", std::to_string(c.first_k_dense_replace));
  p.non_negative(c.q_lora_rank, "q_lora_rank");
  p.non_negative(c.max_position_embeddings, "max_position_embeddings");
  p.non_negative(c.num_nextn_predict_layers, "num_nextn_predict_layers");
  p.non_negative(c.bos_token_id, "bos_token_id");
  p.non_negative(c.eos_token_id, "eos_token_id");
  p.positive(c.block_size, "block_size");
  p.non_negative(c.conf_head_hidden, "conf_head_hidden");
  p.non_negative(c.n_routed_experts, "n_routed_experts");
  p.non_negative(c.n_shared_experts, "n_shared_experts");
}

void validate_moe(config_parser& p, const model_config& c) {
  if (c.n_routed_experts <= 0) return;
  p.positive(c.moe_intermediate_size, "moe_intermediate_size");
  p.positive(c.num_experts_per_tok, "num_experts_per_tok");
  p.require(c.num_experts_per_tok <= c.n_routed_experts, "num_experts_per_tok",
            "must not exceed n_routed_experts", std::to_string(c.num_experts_per_tok));
  p.positive(c.n_group, "n_group");
  p.positive(c.topk_group, "topk_group");
  p.positive(c.routed_scaling_factor, "routed_scaling_factor");
  if (p.failed()) return;
  p.require(c.n_routed_experts % c.n_group == 0, "n_routed_experts", "must be a multiple of n_group",
            std::to_string(c.n_routed_experts));
  p.require(c.topk_group <= c.n_group, "topk_group", "must not exceed n_group", std::to_string(c.topk_group));
  const int64_t per_group = c.n_routed_experts / c.n_group;
  // noaux_tc scores a group by its two best experts, then picks top-k inside the kept groups.
  p.require(per_group >= 2, "n_group", "must leave at least 2 experts per group", std::to_string(c.n_group));
  p.require(c.num_experts_per_tok <= c.topk_group * per_group, "num_experts_per_tok",
            "must not exceed the experts in topk_group groups", std::to_string(c.num_experts_per_tok));
}

void validate_flash(config_parser& p, const model_config& c) {
  p.positive(c.n_encoder_layers, "n_encoder_layers");
  p.non_negative(c.n_decoder_layers, "n_decoder_layers");
  if (c.n_encoder_layers + c.n_decoder_layers != c.num_hidden_layers) {
    p.set(errc::bad_value, "fields 'n_encoder_layers' + 'n_decoder_layers' (" + std::to_string(c.n_encoder_layers) +
                               " + " + std::to_string(c.n_decoder_layers) + ") must equal 'num_hidden_layers' (" +
                               std::to_string(c.num_hidden_layers) + ")");
  }
  p.positive(c.sliding_window, "sliding_window");
  p.positive(c.compress_ratio, "compress_ratio");
  if (p.failed()) return;
  p.require(c.block_size % c.compress_ratio == 0, "block_size",
            "must be a multiple of compress_ratio (" + std::to_string(c.compress_ratio) + ")",
            std::to_string(c.block_size));
  p.require(c.swa_mode == "exact" || c.swa_mode == "compact", "swa_mode", "must be 'exact' or 'compact'",
            "'" + c.swa_mode + "'");
  p.require(c.retained_tokens >= c.sliding_window, "retained_tokens",
            "must be at least sliding_window (" + std::to_string(c.sliding_window) + ")",
            std::to_string(c.retained_tokens));
  p.positive(c.replay_tokens, "replay_tokens");
}

}  // namespace

double model_config::softmax_scale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (rope_scaling.yarn && rope_scaling.factor > 1.0) {
    const double m = 0.1 * rope_scaling.mscale_all_dim * std::log(rope_scaling.factor) + 1.0;
    scale *= m * m;
  }
  return scale;
}

result<model_config> parse_config(std::string_view json_text, const std::string& file) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::parse_error& e) {
    return fail(errc::bad_json, file + ": not valid JSON at byte " + std::to_string(e.byte) + ": " + e.what());
  } catch (const json::exception& e) {
    return fail(errc::bad_json, file + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) return fail(errc::bad_json, file + ": top level must be a JSON object");

  config_parser p(file);
  std::string model_type;
  p.read(j, "", "model_type", model_type, true);
  if (p.failed()) return std::unexpected(p.err());
  model_config c;
  if (model_type == "deepseek_v3") {
    c.architecture = arch::deepseek_v3;
  } else if (model_type == "shoal_flash") {
    c.architecture = arch::shoal_flash;
  } else {
    return fail(errc::unsupported, file + ": model_type '" + model_type +
                                       "' is not supported (expected 'deepseek_v3' or 'shoal_flash')");
  }
  read_common(p, j, c);
  read_moe(p, j, c);
  read_rope_scaling(p, j, c.rope_scaling);
  read_vision(p, j, c.vision);
  read_quantization(p, j, c.quantization);
  if (c.is_flash()) read_flash(p, j, c);
  if (!p.failed()) validate_common(p, c);
  if (!p.failed()) validate_moe(p, c);
  if (!p.failed() && c.is_flash()) validate_flash(p, c);
  if (!p.failed() && c.vision.present)
    p.require(c.vision.image_token_id < c.vocab_size, "vision.image_token_id", "must be below vocab_size",
              std::to_string(c.vision.image_token_id));
  if (p.failed()) return std::unexpected(p.err());
  return c;
}

result<model_config> load_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(errc::io, "cannot read " + path + ": " + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return fail(errc::io, "cannot read " + path + ": " + std::strerror(errno));
  return parse_config(text.str(), path);
}

std::string to_json(const model_config& c) {
  nlohmann::ordered_json j;  // keeps HF's familiar field order
  j["architectures"] = {c.is_flash() ? "ShoalFlashForCausalLM" : "DeepseekV3ForCausalLM"};
  j["model_type"] = c.is_flash() ? "shoal_flash" : "deepseek_v3";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["intermediate_size"] = c.intermediate_size;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["num_attention_heads"] = c.num_attention_heads;
  j["q_lora_rank"] = c.q_lora_rank;
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["n_routed_experts"] = c.n_routed_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["n_group"] = c.n_group;
  j["topk_group"] = c.topk_group;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["topk_method"] = "noaux_tc";
  j["scoring_func"] = "sigmoid";
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.yarn) {
    const rope_scaling_config& r = c.rope_scaling;
    j["rope_scaling"] = {{"type", "yarn"}, {"factor", r.factor},
                         {"original_max_position_embeddings", r.original_max_position_embeddings},
                         {"beta_fast", r.beta_fast}, {"beta_slow", r.beta_slow},
                         {"mscale", r.mscale}, {"mscale_all_dim", r.mscale_all_dim}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
  j["block_size"] = c.block_size;
  j["conf_head_hidden"] = c.conf_head_hidden;
  j["attn_sink"] = c.attn_sink;
  if (c.is_flash()) {
    j["n_encoder_layers"] = c.n_encoder_layers;
    j["n_decoder_layers"] = c.n_decoder_layers;
    j["sliding_window"] = c.sliding_window;
    j["compress_ratio"] = c.compress_ratio;
    j["swa_mode"] = c.swa_mode;
    j["retained_tokens"] = c.retained_tokens;
    j["replay_tokens"] = c.replay_tokens;
  }
  if (c.quantization.present) {
    j["quantization_config"] = {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"},
                                {"weight_block_size", {c.quantization.block_rows, c.quantization.block_cols}}};
  }
  if (c.vision.present) {
    j["vision"] = {{"image_size", c.vision.image_size}, {"patch_size", c.vision.patch_size},
                   {"layers", c.vision.layers}, {"hidden", c.vision.hidden}, {"heads", c.vision.heads},
                   {"image_token_id", c.vision.image_token_id}};
  }
  return j.dump(2) + "\n";
}

}  // namespace shoal::model
