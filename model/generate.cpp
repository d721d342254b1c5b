// Checkpoint generator: preset configs, a seeded per-tensor normal initialiser (each tensor's
// stream is keyed by its name, so values do not depend on enumeration order), and writing
// through the same safetensors writer and tensor list the loader reads back.
#include "model/generate.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "model/safetensors.hpp"
#include "model/tokenizer.hpp"
#include "model/weights.hpp"

namespace shoal::model {
namespace {

namespace fs = std::filesystem;

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t name_hash(const std::string& s) {  // FNV-1a
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

void fill(const tensor_slot& t, uint64_t seed) {
  float* dest = slot_storage(t);
  uint64_t state = seed ^ name_hash(t.name);
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  float scale = 1.0f, offset = 0.0f;
  switch (t.init) {
    case init_kind::norm: scale = 0.1f, offset = 1.0f; break;
    case init_kind::linear: scale = 1.0f / std::sqrt(static_cast<float>(t.shape.back())); break;
    case init_kind::embed: scale = 1.0f; break;
    case init_kind::bias: scale = 0.05f; break;
    case init_kind::sink: scale = 0.5f; break;
  }
  for (int64_t i = 0; i < n; i += 2) {  // Box-Muller pairs
    double u1 = (static_cast<double>(splitmix(state) >> 11) + 1.0) * 0x1.0p-53;
    double u2 = static_cast<double>(splitmix(state) >> 11) * 0x1.0p-53;
    double r = std::sqrt(-2.0 * std::log(u1));
    dest[i] = offset + scale * static_cast<float>(r * std::cos(2 * M_PI * u2));
    if (i + 1 < n) dest[i + 1] = offset + scale * static_cast<float>(r * std::sin(2 * M_PI * u2));
  }
}

model_config tiny_base(arch a) {
  model_config c;
  c.architecture = a;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.kv_lora_rank = 16;
  c.qk_nope_head_dim = 16;
  c.qk_rope_head_dim = 8;
  c.v_head_dim = 16;
  c.intermediate_size = 128;
  c.moe_intermediate_size = 32;
  c.n_routed_experts = 16;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 4;
  c.n_group = 4;
  c.topk_group = 2;
  c.routed_scaling_factor = 2.5;
  c.first_k_dense_replace = 1;
  c.rope_scaling = {true, 4.0, 128, 32.0, 1.0, 1.0, 1.0};
  c.max_position_embeddings = 512;
  c.num_nextn_predict_layers = 1;
  return c;
}

}  // namespace

void init_random(model_weights& w, uint64_t seed) {
  visit_tensors(w, [&](const tensor_slot& t) { fill(t, seed); });
  derive(w);
}

std::vector<std::string> preset_names() { return {"tiny", "small", "v3-tiny", "v3-small"}; }

result<model_config> preset_config(const std::string& preset) {
  if (preset == "tiny") {
    model_config c = tiny_base(arch::shoal_flash);
    c.num_hidden_layers = 4, c.n_encoder_layers = 2, c.n_decoder_layers = 2;
    c.sliding_window = 16, c.compress_ratio = 4, c.block_size = 16;
    c.swa_mode = "compact", c.retained_tokens = 20, c.replay_tokens = 16;
    c.conf_head_hidden = 16;
    c.attn_sink = true;
    return c;
  }
  if (preset == "v3-tiny") {
    model_config c = tiny_base(arch::deepseek_v3);
    c.num_hidden_layers = 4;
    c.q_lora_rank = 32;
    c.block_size = 16;
    return c;
  }
  if (preset == "small") {
    model_config c;
    c.architecture = arch::shoal_flash;
    c.hidden_size = 1024, c.num_attention_heads = 8, c.q_lora_rank = 384;
    c.kv_lora_rank = 256, c.qk_nope_head_dim = 64, c.qk_rope_head_dim = 32, c.v_head_dim = 64;
    c.intermediate_size = 2048, c.moe_intermediate_size = 160;
    c.n_routed_experts = 32, c.n_shared_experts = 1, c.num_experts_per_tok = 4;
    c.n_group = 4, c.topk_group = 2, c.routed_scaling_factor = 2.5, c.first_k_dense_replace = 1;
    c.num_hidden_layers = 12, c.n_encoder_layers = 6, c.n_decoder_layers = 6;
    c.sliding_window = 128, c.compress_ratio = 4, c.block_size = 64;
    c.swa_mode = "compact", c.retained_tokens = 140, c.replay_tokens = 128;
    c.rope_scaling = {true, 4.0, 4096, 32.0, 1.0, 1.0, 1.0};
    c.max_position_embeddings = 16384;
    c.num_nextn_predict_layers = 1, c.conf_head_hidden = 64, c.attn_sink = true;
    return c;
  }
  if (preset == "v3-small") {
    // deepseek_v3 at about 563 M parameters (1.13 GB in bf16): the attention and expert shapes
    // of DeepSeek-V3 scaled down, the real vocabulary. Decode reads ≈ 420 MB per token.
    model_config c;
    c.architecture = arch::deepseek_v3;
    c.hidden_size = 1024, c.num_hidden_layers = 6, c.first_k_dense_replace = 1, c.intermediate_size = 2816;
    c.num_attention_heads = 16, c.q_lora_rank = 384, c.kv_lora_rank = 256;
    c.qk_nope_head_dim = 128, c.qk_rope_head_dim = 64, c.v_head_dim = 128;
    c.n_routed_experts = 32, c.moe_intermediate_size = 512, c.num_experts_per_tok = 4;
    c.n_group = 4, c.topk_group = 2, c.n_shared_experts = 1, c.routed_scaling_factor = 2.5;
    c.rope_scaling = {true, 4.0, 4096, 32.0, 1.0, 1.0, 1.0};
    c.max_position_embeddings = 16384;
    c.num_nextn_predict_layers = 0;
    return c;
  }
  return fail(errc::bad_value, "unknown preset '" + preset + "' (tiny, small, v3-tiny, v3-small)");
}

result<vision_config> vision_preset(const std::string& preset) {
  vision_config v;
  v.present = true;
  if (preset == "tiny" || preset == "v3-tiny") {
    v.image_size = 56, v.patch_size = 14, v.layers = 2, v.hidden = 32, v.heads = 2;
    return v;
  }
  if (preset == "small") {
    v.image_size = 224, v.patch_size = 14, v.layers = 4, v.hidden = 384, v.heads = 6;
    return v;
  }
  return fail(errc::bad_value, "unknown preset '" + preset + "' (tiny, small, v3-tiny, v3-small)");
}

namespace {
bool uses_v3_tokenizer(const std::string& preset) { return preset == "small" || preset == "v3-small"; }
}  // namespace

std::string image_token_text(const std::string& preset) {
  return uses_v3_tokenizer(preset) ? "<｜place▁holder▁no▁0｜>" : "<image>";
}

namespace {

// Special tokens of the tiny presets, named as in the DeepSeek-V3 tokenizer.
const std::vector<std::string> tiny_specials = {"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                                                "<｜User｜>", "<｜Assistant｜>"};
// DeepSeek-V3's tool-call tokens, so tool calling works on the tiny presets too.
constexpr const char* tiny_tool_specials[] = {"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                                              "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"};

const char* chat_template =
    "{% for message in messages %}{% if message['role'] == 'user' %}<｜User｜>{{ message['content'] }}"
    "{% elif message['role'] == 'assistant' %}<｜Assistant｜>{{ message['content'] }}<｜end▁of▁sentence｜>"
    "{% else %}{{ message['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜>{% endif %}";

result<void> write_text(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  if (!f) return fail(errc::io, "cannot write " + path.string());
  return {};
}

// tokenizer.json + tokenizer_config.json into out; returns the tokenizer's vocab size, bos, eos
// and image token (−1 without vision).
result<std::tuple<int64_t, int64_t, int64_t, int64_t>> write_tokenizer(const generate_options& o,
                                                               const fs::path& out) {
  std::string text;
  nlohmann::json tcfg;
  if (uses_v3_tokenizer(o.preset)) {
    fs::path src = fs::path(o.tokenizer_dir) / "tokenizer.json";
    std::ifstream f(src, std::ios::binary);
    if (!f) return fail(errc::io, "cannot read tokenizer " + src.string() + " (set --tokenizer DIR)");
    text.assign(std::istreambuf_iterator<char>(f), {});
    std::ifstream fc(fs::path(o.tokenizer_dir) / "tokenizer_config.json", std::ios::binary);
    if (fc) tcfg = nlohmann::json::parse(fc, nullptr, false);
  } else {
    auto specials = tiny_specials;
    if (o.vision) specials.push_back(image_token_text(o.preset));
    for (const char* t : tiny_tool_specials) specials.emplace_back(t);  // last: the ids before them stay
    text = byte_level_tokenizer_json(specials);
  }
  if (tcfg.is_discarded() || tcfg.is_null())
    tcfg = {{"add_bos_token", true}, {"bos_token", tiny_specials[0]}, {"eos_token", tiny_specials[1]},
            {"chat_template", chat_template}, {"model_max_length", 512}};
  if (auto r = write_text(out / "tokenizer.json", text); !r) return std::unexpected(r.error());
  if (auto r = write_text(out / "tokenizer_config.json", tcfg.dump(2)); !r) return std::unexpected(r.error());
  auto tok = tokenizer::load((out / "tokenizer.json").string());
  if (!tok) return std::unexpected(tok.error());
  const int64_t image = o.vision ? tok->token_id(image_token_text(o.preset)) : -1;
  if (o.vision && image < 0) return fail(errc::bad_value, "the tokenizer has no " + image_token_text(o.preset) + " token");
  return std::tuple<int64_t, int64_t, int64_t, int64_t>{tok->vocab_size(), tok->bos_id(), tok->eos_id(), image};
}

dtype dtype_for(bool fp8, const tensor_slot& t) {
  if (t.shape.size() < 2) return dtype::f32;
  if (!fp8) return dtype::bf16;
  // As published: FP8 linears inside the layers; embeddings, heads, the router and the vision
  // encoder stay bf16.
  bool keep = t.name.rfind("vision.", 0) == 0 || t.name.find("embed_tokens") != std::string::npos || t.name == "lm_head.weight" ||
              t.name.find("shared_head.head") != std::string::npos ||
              t.name.find("mlp.gate.weight") != std::string::npos || t.init == init_kind::embed;
  return keep ? dtype::bf16 : dtype::f8_e4m3;
}

}  // namespace

result<void> generate_checkpoint(const generate_options& o) {
  auto cfg = preset_config(o.preset);
  if (!cfg) return std::unexpected(cfg.error());
  fs::path out(o.out_dir);
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) return fail(errc::io, "cannot create " + out.string() + ": " + ec.message());
  if (!o.dtype.empty() && o.dtype != "bf16" && o.dtype != "fp8")
    return fail(errc::bad_value, "unknown dtype '" + o.dtype + "' (bf16, fp8)");
  const bool fp8 = o.dtype.empty() ? o.preset == "v3-tiny" : o.dtype == "fp8";
  cfg->quantization.present = fp8;
  if (o.hot_experts < 0 || o.hot_experts > cfg->n_routed_experts)
    return fail(errc::bad_value, "hot experts " + std::to_string(o.hot_experts) + " outside [0, " +
                                   std::to_string(cfg->n_routed_experts) + "] (the preset's routed experts)");
  auto tok = write_tokenizer(o, out);
  if (!tok) return std::unexpected(tok.error());
  auto [tok_vocab, bos, eos, image_token] = *tok;
  if (o.vision) {
    auto v = vision_preset(o.preset);
    if (!v) return std::unexpected(v.error());
    cfg->vision = *v;
    cfg->vision.image_token_id = image_token;
  }
  // The embedding is at least as large as the tokenizer (DeepSeek-V3 pads 128,815 to 129,280).
  cfg->vocab_size = uses_v3_tokenizer(o.preset) ? std::max<int64_t>(tok_vocab, 129280) : tok_vocab;
  cfg->bos_token_id = bos, cfg->eos_token_id = eos;
  model_weights w;
  w.config = *cfg;
  std::vector<tensor_to_write> tensors;
  visit_tensors(w, [&](const tensor_slot& t) {
    if (t.shared && o.preset == "small") return;  // MTP shares embedding and head
    fill(t, o.seed);
    if (t.init == init_kind::bias && t.name.ends_with("e_score_correction_bias"))
      for (int64_t e = 0; e < o.hot_experts; ++e) slot_storage(t)[e] += o.hot_bias;
    tensors.push_back({t.name, t.shape, slot_storage(t), dtype_for(fp8, t)});
  });
  if (o.preset == "v3-tiny" || fp8) {  // sharded, with an index, as published checkpoints are
    std::vector<tensor_to_write> shard[2];
    nlohmann::json map = nlohmann::json::object();
    for (size_t i = 0; i < tensors.size(); ++i) {
      int s = i < tensors.size() / 2 ? 0 : 1;
      std::string file = "model-0000" + std::to_string(s + 1) + "-of-00002.safetensors";
      shard[s].push_back(tensors[i]);
      map[tensors[i].name] = file;
      if (tensors[i].type == dtype::f8_e4m3) map[tensors[i].name + "_scale_inv"] = file;
    }
    for (int s = 0; s < 2; ++s) {
      std::string file = "model-0000" + std::to_string(s + 1) + "-of-00002.safetensors";
      if (auto r = write_safetensors((out / file).string(), shard[s]); !r) return r;
    }
    nlohmann::json index = {{"metadata", {{"format", "pt"}}}, {"weight_map", map}};
    if (auto r = write_text(out / "model.safetensors.index.json", index.dump(2)); !r) return r;
  } else {
    if (auto r = write_safetensors((out / "model.safetensors").string(), tensors, {{"format", "pt"}}); !r)
      return r;
  }
  return write_text(out / "config.json", to_json(*cfg));
}

}  // namespace shoal::model
