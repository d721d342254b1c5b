// Tests of config.json parsing: the published DeepSeek-V3 config (values from MODEL.md) and a
// tiny shoal_flash config parse to the right fields and softmax scale, to_json round-trips,
// and each malformed input fails with the right errc and a message naming file and field.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/config.hpp"

namespace sm = shoal::model;
using sm::errc;
using json = nlohmann::json;

namespace {

// DeepSeek-V3 as published, including HF fields shoal ignores.
json deepseek_v3_json() {
  return json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": false, "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"},
    "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
    "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02,
    "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "model_type": "deepseek_v3", "moe_intermediate_size": 2048, "moe_layer_freq": 1,
    "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                            "quant_method": "fp8", "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06, "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
    "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": false,
    "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1", "use_cache": true, "v_head_dim": 128, "vocab_size": 129280
  })");
}

// The `tiny` preset's shape (MODEL.md §3) as a shoal_flash config.
json tiny_flash_json() {
  return json::parse(R"({
    "model_type": "shoal_flash", "vocab_size": 260, "hidden_size": 64, "num_hidden_layers": 4,
    "first_k_dense_replace": 1, "intermediate_size": 128, "moe_intermediate_size": 32,
    "num_attention_heads": 4, "q_lora_rank": 0, "kv_lora_rank": 16, "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8, "v_head_dim": 16, "n_routed_experts": 16, "n_shared_experts": 1,
    "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 1.5,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": null,
    "max_position_embeddings": 4096, "num_nextn_predict_layers": 2,
    "n_encoder_layers": 2, "n_decoder_layers": 2, "sliding_window": 16, "compress_ratio": 4,
    "block_size": 16, "swa_mode": "compact", "retained_tokens": 20, "replay_tokens": 16,
    "conf_head_hidden": 32, "attn_sink": true,
    "vision": {"image_size": 56, "patch_size": 14, "layers": 2, "hidden": 32, "heads": 2, "image_token_id": 5}
  })");
}

sm::result<sm::model_config> parse(const json& j) { return sm::parse_config(j.dump(), "config.json"); }

bool contains(const std::string& message, const std::string& part) {
  return message.find(part) != std::string::npos;
}

// Parses `j`, expects failure with `code`, and that the message names the file and `part`.
void check_fails(const json& j, errc code, const std::string& part) {
  auto c = parse(j);
  REQUIRE_FALSE(c);
  INFO(c.error().message);
  CHECK(c.error().code == code);
  CHECK(contains(c.error().message, "config.json"));
  CHECK(contains(c.error().message, part));
}

}  // namespace

TEST_CASE("DeepSeek-V3 config.json parses to the published values") {
  auto c = parse(deepseek_v3_json());
  REQUIRE_MESSAGE(c, c.error().message);
  CHECK(c->architecture == sm::arch::deepseek_v3);
  CHECK(c->vocab_size == 129280);
  CHECK(c->hidden_size == 7168);
  CHECK(c->num_hidden_layers == 61);
  CHECK(c->first_k_dense_replace == 3);
  CHECK(c->intermediate_size == 18432);
  CHECK(c->moe_intermediate_size == 2048);
  CHECK(c->num_attention_heads == 128);
  CHECK(c->q_lora_rank == 1536);
  CHECK(c->kv_lora_rank == 512);
  CHECK(c->qk_nope_head_dim == 128);
  CHECK(c->qk_rope_head_dim == 64);
  CHECK(c->v_head_dim == 128);
  CHECK(c->n_routed_experts == 256);
  CHECK(c->n_shared_experts == 1);
  CHECK(c->num_experts_per_tok == 8);
  CHECK(c->n_group == 8);
  CHECK(c->topk_group == 4);
  CHECK(c->routed_scaling_factor == 2.5);
  CHECK(c->norm_topk_prob);
  CHECK(c->rms_norm_eps == 1e-6);
  CHECK(c->rope_theta == 10000.0);
  CHECK(c->rope_scaling.yarn);
  CHECK(c->rope_scaling.factor == 40.0);
  CHECK(c->rope_scaling.original_max_position_embeddings == 4096);
  CHECK(c->rope_scaling.beta_fast == 32.0);
  CHECK(c->rope_scaling.beta_slow == 1.0);
  CHECK(c->rope_scaling.mscale == 1.0);
  CHECK(c->rope_scaling.mscale_all_dim == 1.0);
  CHECK(c->max_position_embeddings == 163840);
  CHECK(c->num_nextn_predict_layers == 1);
  CHECK(c->bos_token_id == 0);
  CHECK(c->eos_token_id == 1);
  CHECK_FALSE(c->attn_sink);
  CHECK_FALSE(c->vision.present);
  CHECK(c->qk_head_dim() == 192);
  CHECK(c->entry_dim() == 576);
  CHECK(c->encoder_layers() == 61);
  CHECK(c->cache_layers() == 61);
  CHECK_FALSE(c->is_moe_layer(2));
  CHECK(c->is_moe_layer(3));
  const double mscale = 0.1 * std::log(40.0) + 1.0;
  CHECK(c->softmax_scale() == doctest::Approx(mscale * mscale / std::sqrt(192.0)).epsilon(1e-12));
  CHECK(c->softmax_scale() == doctest::Approx(0.1352337788608801).epsilon(1e-12));
}

TEST_CASE("softmax_scale without YaRN, and with factor 1") {
  json j = deepseek_v3_json();
  j["rope_scaling"] = nullptr;
  auto c = parse(j);
  REQUIRE(c);
  CHECK_FALSE(c->rope_scaling.yarn);
  CHECK(c->softmax_scale() == doctest::Approx(1.0 / std::sqrt(192.0)).epsilon(1e-12));
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 1.0}};
  c = parse(j);
  REQUIRE(c);
  CHECK(c->rope_scaling.yarn);
  CHECK(c->softmax_scale() == doctest::Approx(1.0 / std::sqrt(192.0)).epsilon(1e-12));
}

TEST_CASE("tiny shoal_flash config parses with flash fields and vision") {
  auto c = parse(tiny_flash_json());
  REQUIRE_MESSAGE(c, c.error().message);
  CHECK(c->is_flash());
  CHECK(c->n_encoder_layers == 2);
  CHECK(c->n_decoder_layers == 2);
  CHECK(c->sliding_window == 16);
  CHECK(c->compress_ratio == 4);
  CHECK(c->block_size == 16);
  CHECK(c->swa_mode == "compact");
  CHECK(c->retained_tokens == 20);
  CHECK(c->replay_tokens == 16);
  CHECK(c->conf_head_hidden == 32);
  CHECK(c->attn_sink);
  CHECK(c->q_lora_rank == 0);
  CHECK_FALSE(c->rope_scaling.yarn);
  CHECK(c->vision.present);
  CHECK(c->vision.image_size == 56);
  CHECK(c->vision.patch_size == 14);
  CHECK(c->vision.layers == 2);
  CHECK(c->vision.hidden == 32);
  CHECK(c->vision.heads == 2);
  CHECK(c->cache_layers() == 3);
  CHECK(c->window() == 16);
  CHECK(c->ratio() == 4);
}

TEST_CASE("to_json round-trips through parse_config") {
  for (const json& source : {deepseek_v3_json(), tiny_flash_json()}) {
    auto c = parse(source);
    REQUIRE(c);
    const std::string text = sm::to_json(*c);
    auto again = sm::parse_config(text, "roundtrip.json");
    REQUIRE_MESSAGE(again, again.error().message);
    CHECK(sm::to_json(*again) == text);
    CHECK(again->softmax_scale() == c->softmax_scale());
    CHECK(again->rms_norm_eps == c->rms_norm_eps);
    CHECK(again->routed_scaling_factor == c->routed_scaling_factor);
    CHECK(again->rope_scaling.factor == c->rope_scaling.factor);
    CHECK(again->vision.present == c->vision.present);
    CHECK(again->attn_sink == c->attn_sink);
    CHECK(again->swa_mode == c->swa_mode);
    CHECK(again->n_decoder_layers == c->n_decoder_layers);
    const json emitted = json::parse(text);
    CHECK(emitted["model_type"] == source["model_type"]);
    CHECK(emitted["architectures"].is_array());
  }
  auto v3 = parse(deepseek_v3_json());
  CHECK(json::parse(sm::to_json(*v3))["architectures"] == json::array({"DeepseekV3ForCausalLM"}));
}

TEST_CASE("load_config reads DIR/config.json and names the path when it cannot") {
  std::string dir = "/tmp/shoal_cfg_test_XXXXXX";
  REQUIRE(::mkdtemp(dir.data()) != nullptr);
  auto missing = sm::load_config(dir);
  REQUIRE_FALSE(missing);
  CHECK(missing.error().code == errc::io);
  CHECK(contains(missing.error().message, dir + "/config.json"));
  std::ofstream(dir + "/config.json") << deepseek_v3_json().dump(2);
  auto c = sm::load_config(dir);
  REQUIRE_MESSAGE(c, c.error().message);
  CHECK(c->hidden_size == 7168);
  std::ofstream(dir + "/config.json") << "{\"model_type\": 3}";
  auto bad = sm::load_config(dir);
  REQUIRE_FALSE(bad);
  CHECK(contains(bad.error().message, dir + "/config.json"));
  CHECK(contains(bad.error().message, "model_type"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("malformed: not JSON reports the byte offset") {
  auto c = sm::parse_config("{\"model_type\": \"deepseek_v3\",, }", "config.json");
  REQUIRE_FALSE(c);
  INFO(c.error().message);
  CHECK(c.error().code == errc::bad_json);
  CHECK(contains(c.error().message, "config.json"));
  CHECK(contains(c.error().message, "at byte 30"));
  auto array = sm::parse_config("[1, 2]", "config.json");
  REQUIRE_FALSE(array);
  CHECK(array.error().code == errc::bad_json);
}

TEST_CASE("malformed: unknown model_type") {
  json j = deepseek_v3_json();
  j["model_type"] = "llama";
  check_fails(j, errc::unsupported, "'llama'");
  j.erase("model_type");
  check_fails(j, errc::missing_field, "model_type");
}

TEST_CASE("malformed: missing required fields") {
  json j = deepseek_v3_json();
  j.erase("hidden_size");
  check_fails(j, errc::missing_field, "'hidden_size'");
  j = deepseek_v3_json();
  j["kv_lora_rank"] = nullptr;  // null counts as absent
  check_fails(j, errc::missing_field, "'kv_lora_rank'");
  j = deepseek_v3_json();
  j.erase("n_group");  // required for MoE
  check_fails(j, errc::missing_field, "'n_group'");
  j = deepseek_v3_json();
  j["rope_scaling"].erase("factor");
  check_fails(j, errc::missing_field, "'rope_scaling.factor'");
  j = tiny_flash_json();
  j.erase("sliding_window");
  check_fails(j, errc::missing_field, "'sliding_window'");
  j = tiny_flash_json();
  j["vision"].erase("heads");
  check_fails(j, errc::missing_field, "'vision.heads'");
}

TEST_CASE("malformed: field of the wrong type") {
  json j = deepseek_v3_json();
  j["hidden_size"] = "7168";
  auto c = parse(j);
  REQUIRE_FALSE(c);
  CHECK(c.error().code == errc::bad_json);
  CHECK(c.error().message == "config.json: field 'hidden_size' must be an integer");
  j = deepseek_v3_json();
  j["hidden_size"] = 7168.5;
  check_fails(j, errc::bad_json, "'hidden_size' must be an integer");
  j = deepseek_v3_json();
  j["rms_norm_eps"] = "tiny";
  check_fails(j, errc::bad_json, "'rms_norm_eps' must be a number");
  j = deepseek_v3_json();
  j["norm_topk_prob"] = 1;
  check_fails(j, errc::bad_json, "'norm_topk_prob' must be a boolean");
  j = deepseek_v3_json();
  j["rope_scaling"]["beta_fast"] = "32";
  check_fails(j, errc::bad_json, "'rope_scaling.beta_fast'");
  j = deepseek_v3_json();
  j["rope_scaling"] = 40;
  check_fails(j, errc::bad_json, "'rope_scaling'");
}

TEST_CASE("malformed: unsupported methods and rope types") {
  json j = deepseek_v3_json();
  j["topk_method"] = "greedy";
  check_fails(j, errc::unsupported, "'topk_method'");
  j = deepseek_v3_json();
  j["scoring_func"] = "softmax";
  check_fails(j, errc::unsupported, "'scoring_func'");
  j = deepseek_v3_json();
  j["rope_scaling"]["type"] = "linear";
  check_fails(j, errc::unsupported, "'rope_scaling.type'");
}

TEST_CASE("malformed: values outside their domain") {
  const std::vector<std::tuple<const char*, json, const char*>> cases = {
      {"hidden_size", 0, "'hidden_size'"},
      {"num_attention_heads", -4, "'num_attention_heads'"},
      {"rms_norm_eps", 0.0, "'rms_norm_eps'"},
      {"qk_rope_head_dim", 63, "'qk_rope_head_dim'"},
      {"num_experts_per_tok", 300, "'num_experts_per_tok'"},
      {"n_group", 7, "'n_routed_experts'"},
      {"topk_group", 9, "'topk_group'"},
      {"first_k_dense_replace", 62, "'first_k_dense_replace'"},
      {"q_lora_rank", -1, "'q_lora_rank'"},
  };
  for (const auto& [field, value, part] : cases) {
    CAPTURE(field);
    json j = deepseek_v3_json();
    j[field] = value;
    check_fails(j, errc::bad_value, part);
  }
  json j = deepseek_v3_json();  // 8 experts cannot come from 1 group of 32 when topk_group = 1
  j["topk_group"] = 1;
  j["num_experts_per_tok"] = 33;
  check_fails(j, errc::bad_value, "'num_experts_per_tok'");
}

TEST_CASE("malformed: shoal_flash cache parameters") {
  json j = tiny_flash_json();
  j["block_size"] = 18;  // not a multiple of compress_ratio 4
  check_fails(j, errc::bad_value, "'block_size'");
  j = tiny_flash_json();
  j["n_decoder_layers"] = 3;  // 2 + 3 != 4
  check_fails(j, errc::bad_value, "num_hidden_layers");
  check_fails(j, errc::bad_value, "'n_encoder_layers'");
  j = tiny_flash_json();
  j["swa_mode"] = "fast";
  check_fails(j, errc::bad_value, "'swa_mode'");
  j = tiny_flash_json();
  j["retained_tokens"] = 15;
  check_fails(j, errc::bad_value, "'retained_tokens'");
  j = tiny_flash_json();
  j["replay_tokens"] = 0;
  check_fails(j, errc::bad_value, "'replay_tokens'");
  j = tiny_flash_json();
  j["compress_ratio"] = 0;
  check_fails(j, errc::bad_value, "'compress_ratio'");
  j = tiny_flash_json();
  j["vision"]["patch_size"] = 15;
  check_fails(j, errc::bad_value, "'vision.image_size'");
}
