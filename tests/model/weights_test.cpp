// Generated checkpoints load through the real loader (both presets, sharded FP8 for v3-tiny),
// and broken checkpoints fail with errors that name the file and the tensor or field.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "model/forward.hpp"
#include "model/generate.hpp"
#include "model/safetensors.hpp"
#include "model/weights.hpp"

using namespace shoal::model;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("shoal_weights_test_" + name);
  fs::remove_all(d);
  return d;
}

fs::path generated(const std::string& preset, const std::string& name) {
  fs::path d = fresh_dir(name);
  generate_options o;
  o.preset = preset;
  o.seed = 3;
  o.out_dir = d.string();
  REQUIRE(generate_checkpoint(o).has_value());
  return d;
}

std::string message_of(const fs::path& dir) {
  auto w = load_weights(dir.string());
  REQUIRE_FALSE(w.has_value());
  return w.error().message;
}

void edit_config(const fs::path& dir, const std::function<void(nlohmann::json&)>& fn) {
  nlohmann::json j = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  fn(j);
  std::ofstream(dir / "config.json") << j.dump(2);
}

}  // namespace

TEST_CASE("generated checkpoints load and run (tiny, and v3-tiny sharded with FP8 block scales)") {
  for (const char* preset : {"tiny", "v3-tiny"}) {
    auto dir = generated(preset, std::string("ok_") + preset);
    auto w = load_weights(dir.string());
    REQUIRE(w.has_value());
    CHECK(w->config.vocab_size > 256);
    CHECK(w->layers.size() == 4);
    auto out = forward_full(*w, std::vector<int32_t>{1, 2, 3, 4, 5});
    CHECK(out.logits.size() == static_cast<size_t>(w->config.vocab_size));
    if (std::string(preset) == "v3-tiny") CHECK(fs::exists(dir / "model.safetensors.index.json"));
  }
}

TEST_CASE("same preset and seed give byte-identical checkpoints") {
  auto a = generated("tiny", "det_a"), b = generated("tiny", "det_b");
  auto read = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  CHECK(read(a / "model.safetensors") == read(b / "model.safetensors"));
}

TEST_CASE("a config whose shapes disagree with the tensors names the tensor and both shapes") {
  auto dir = generated("tiny", "shape");
  edit_config(dir, [](nlohmann::json& j) { j["kv_lora_rank"] = 8; });
  auto msg = message_of(dir);
  CAPTURE(msg);
  CHECK(msg.find("kv_a_proj_with_mqa") != std::string::npos);
}

TEST_CASE("a config naming more layers than the checkpoint holds names the missing tensor") {
  auto dir = generated("v3-tiny", "missing");
  edit_config(dir, [](nlohmann::json& j) { j["num_hidden_layers"] = 5; });
  auto msg = message_of(dir);
  CAPTURE(msg);
  CHECK(msg.find("model.layers.5.") != std::string::npos);  // layer 4 reads the MTP layer's tensors
}

TEST_CASE("unknown model_type and bad JSON in config.json are named") {
  auto dir = generated("tiny", "type");
  edit_config(dir, [](nlohmann::json& j) { j["model_type"] = "llama"; });
  auto msg = message_of(dir);
  CHECK(msg.find("llama") != std::string::npos);
  std::ofstream(dir / "config.json") << "{ \"model_type\": ";
  msg = message_of(dir);
  CHECK(msg.find("config.json") != std::string::npos);
}

TEST_CASE("a truncated safetensors file is reported with its path") {
  auto dir = generated("tiny", "trunc");
  fs::resize_file(dir / "model.safetensors", fs::file_size(dir / "model.safetensors") / 2);
  auto msg = message_of(dir);
  CAPTURE(msg);
  CHECK(msg.find("model.safetensors") != std::string::npos);
}

TEST_CASE("a missing checkpoint directory is named") {
  auto msg = message_of(fs::temp_directory_path() / "shoal_no_such_model_dir");
  CHECK(msg.find("shoal_no_such_model_dir") != std::string::npos);
}

TEST_CASE("an MTP layer the checkpoint gives no embedding or head reads the main model's, no copy") {
  // B omits the MTP layer's embed_tokens and shared_head.head; C carries the main model's
  // values under those names. Same MTP logits, and B holds no second copy.
  const fs::path a = generated("tiny", "mtp_a");
  auto ckpt = checkpoint::open(a.string());
  REQUIRE(ckpt);
  auto wa = load_weights(a.string());
  REQUIRE(wa);
  const std::string p = "model.layers." + std::to_string(wa->config.num_hidden_layers) + ".";
  const std::string mtp_embed_name = p + "embed_tokens.weight", mtp_head_name = p + "shared_head.head.weight";
  REQUIRE(ckpt->has(mtp_embed_name));
  REQUIRE(ckpt->has(mtp_head_name));
  std::map<std::string, std::vector<float>> values;
  std::map<std::string, const tensor_info*> info;
  for (const std::string& name : ckpt->names()) {
    info[name] = ckpt->find(name);
    auto v = ckpt->read_f32(name, info[name]->shape);
    REQUIRE(v);
    values[name] = std::move(*v);
  }
  auto write = [&](const std::string& dir, bool with_copies) {
    const fs::path d = fresh_dir(dir);
    fs::copy(a, d, fs::copy_options::recursive);
    std::vector<tensor_to_write> out;
    for (const auto& [name, v] : values) {
      if (name == mtp_embed_name || name == mtp_head_name) continue;
      out.push_back({name, info[name]->shape, v.data(), info[name]->type});
    }
    if (with_copies) {
      out.push_back({mtp_embed_name, info["model.embed_tokens.weight"]->shape, values["model.embed_tokens.weight"].data(),
                     info["model.embed_tokens.weight"]->type});
      out.push_back({mtp_head_name, info["lm_head.weight"]->shape, values["lm_head.weight"].data(),
                     info["lm_head.weight"]->type});
    }
    REQUIRE(write_safetensors((d / "model.safetensors").string(), out));
    return d;
  };
  auto wb = load_weights(write("mtp_b", false).string());
  auto wc = load_weights(write("mtp_c", true).string());
  REQUIRE(wb);
  REQUIRE(wc);
  CHECK(wb->mtp[0].embed.empty());
  CHECK(wb->mtp[0].head.w.empty());
  CHECK(wb->mtp[0].head.w_bf16.empty());
  CHECK(&mtp_embed(*wb, wb->mtp[0]) == &wb->embed);
  CHECK(&mtp_head(*wb, wb->mtp[0]) == &wb->lm_head);
  CHECK_FALSE(wc->mtp[0].embed.empty());
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 20; ++i) tokens.push_back((i * 37 + 5) % 200 + 2);
  auto ob = forward_full(*wb, tokens, {true, false});
  auto oc = forward_full(*wc, tokens, {true, false});
  REQUIRE_FALSE(ob.mtp.logits.empty());
  CHECK(ob.mtp.logits == oc.mtp.logits);
  CHECK(ob.logits == oc.logits);
  auto oa = forward_full(*wa, tokens, {true, false});
  CHECK(oa.mtp.logits != ob.mtp.logits);  // A's own MTP tensors differ from the main ones
}

namespace {

// Each linear of `w` kept FP8, widened to fp32 in place (the dequantised reading).
void widen_fp8(linear& l) {
  if (l.w_fp8.codes.empty()) return;
  l.w.resize(l.w_fp8.codes.size());
  for (int64_t r = 0; r < l.out; ++r)
    for (int64_t c = 0; c < l.in; ++c)
      l.w[r * l.in + c] = fp8_e4m3_to_f32(l.w_fp8.codes[r * l.in + c]) *
                          l.w_fp8.scales[l.w_fp8.row_scales[r] + c / l.w_fp8.block_in];
  l.w_fp8 = {};
}

void widen_all(model_weights& w) {
  auto layer = [](layer_weights& l) {
    for (linear* p : {&l.attn.q_proj, &l.attn.q_a, &l.attn.q_b, &l.attn.kv_a, &l.attn.kv_b, &l.attn.o_proj, &l.ffn.dense.gate_up,
                      &l.ffn.dense.down, &l.ffn.shared.gate_up, &l.ffn.shared.down})
      widen_fp8(*p);
    for (auto& e : l.ffn.experts) widen_fp8(e.gate_up), widen_fp8(e.down);
  };
  for (auto& l : w.layers) layer(l);
  for (auto& m : w.mtp) layer(m.layer), widen_fp8(m.eh_proj);
}

// Overwrites `bytes` at byte `at` of tensor `name`'s data in safetensors file `file`.
void patch_tensor(const fs::path& file, const std::string& name, size_t at, const std::string& bytes) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header = 0;
  f.read(reinterpret_cast<char*>(&header), 8);
  std::string text(header, '\0');
  f.read(text.data(), static_cast<std::streamsize>(header));
  auto j = nlohmann::json::parse(text);
  REQUIRE(j.contains(name));
  const size_t begin = j[name]["data_offsets"][0].get<size_t>();
  f.seekp(static_cast<std::streamoff>(8 + header + begin + at));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The shard of a sharded checkpoint that holds `name`.
fs::path shard_of(const fs::path& dir, const std::string& name) {
  auto index = nlohmann::json::parse(std::ifstream(dir / "model.safetensors.index.json"));
  return dir / index["weight_map"][name].get<std::string>();
}

}  // namespace

TEST_CASE("an FP8 checkpoint stays FP8 in memory (codes and block scales) and computes as its dequantised values") {
  auto dir = generated("v3-tiny", "fp8_kept");
  auto w = load_weights(dir.string());
  REQUIRE(w.has_value());
  CHECK(w->config.quantization.present);
  const layer_weights& l0 = w->layers[0];
  CHECK(l0.attn.q_b.w.empty());
  CHECK(l0.attn.q_b.w_fp8.codes.size() == static_cast<size_t>(l0.attn.q_b.out * l0.attn.q_b.in));
  CHECK(l0.ffn.dense.gate_up.w.empty());
  CHECK(l0.ffn.dense.gate_up.w_fp8.row_scales.size() == static_cast<size_t>(l0.ffn.dense.gate_up.out));
  CHECK(w->layers[1].ffn.experts[3].down.w.empty());
  CHECK(!w->layers[1].ffn.experts[3].down.w_fp8.codes.empty());
  CHECK(!l0.attn.kv_b.w_fp8.codes.empty());  // read in slices, each row block keeps its scales
  CHECK(!l0.attn.w_uk_t.w.empty());          // derived from FP8 blocks: fp32
  CHECK(!w->lm_head.w_bf16.empty());

  const std::vector<int32_t> tokens = {1, 5, 9, 2, 7, 3, 3, 8};
  auto fp8 = forward_full(*w, tokens);
  widen_all(*w);
  CHECK(w->layers[0].attn.q_b.w_fp8.codes.empty());
  auto wide = forward_full(*w, tokens);
  double num = 0, den = 0;
  for (size_t i = 0; i < wide.logits.size(); ++i) {
    num += std::pow(double(fp8.logits[i]) - wide.logits[i], 2);
    den += std::pow(double(wide.logits[i]), 2);
  }
  CHECK(std::sqrt(num / den) < 1e-5);
}

TEST_CASE("bad FP8 input: scales of the wrong shape, bad scale values, NaN codes, unknown quantization_config") {
  const std::string q_b = "model.layers.0.self_attn.q_b_proj.weight";
  SUBCASE("a weight_block_size the scale tensors were not written with") {
    auto dir = generated("v3-tiny", "fp8_block");
    edit_config(dir, [](nlohmann::json& j) { j["quantization_config"]["weight_block_size"] = {64, 64}; });
    auto msg = message_of(dir);
    CAPTURE(msg);
    CHECK(msg.find(q_b + "_scale_inv") != std::string::npos);
    CHECK(msg.find("weight_block_size") != std::string::npos);
  }
  SUBCASE("a negative or NaN scale") {
    for (float bad : {-1.0f, std::nanf("")}) {
      auto dir = generated("v3-tiny", "fp8_scale");
      std::string bytes(4, '\0');
      std::memcpy(bytes.data(), &bad, 4);
      patch_tensor(shard_of(dir, q_b + "_scale_inv"), q_b + "_scale_inv", 0, bytes);
      auto msg = message_of(dir);
      CAPTURE(msg);
      CHECK(msg.find(q_b + "_scale_inv") != std::string::npos);
      CHECK(msg.find("finite and not negative") != std::string::npos);
    }
  }
  SUBCASE("a NaN code") {
    auto dir = generated("v3-tiny", "fp8_nan");
    patch_tensor(shard_of(dir, q_b), q_b, 17, std::string(1, '\xff'));
    auto msg = message_of(dir);
    CAPTURE(msg);
    CHECK(msg.find(q_b) != std::string::npos);
    CHECK(msg.find("NaN") != std::string::npos);
    CHECK(msg.find("element 17") != std::string::npos);
  }
  SUBCASE("quantization_config fields this loader does not know") {
    for (auto [key, value, named] :
         std::vector<std::tuple<std::string, nlohmann::json, std::string>>{{"quant_method", "awq", "quant_method"},
                                                                            {"fmt", "e5m2", "fmt"},
                                                                            {"activation_scheme", "static", "activation_scheme"},
                                                                            {"weight_block_size", {128}, "weight_block_size"},
                                                                            {"weight_block_size", {128, 0}, "weight_block_size[1]"},
                                                                            {"group_size", 64, "group_size"}}) {
      CAPTURE(key);
      auto dir = generated("v3-tiny", "fp8_qc");
      edit_config(dir, [&](nlohmann::json& j) { j["quantization_config"][key] = value; });
      auto msg = message_of(dir);
      CAPTURE(msg);
      CHECK(msg.find("quantization_config." + named) != std::string::npos);
    }
  }
}

TEST_CASE("backing with huge pages drops the whole 2 MiB pages inside the range, nothing around them") {
  // An odd size and an offset start: the range's head and tail lie outside whole pages.
  const auto value = [](size_t i) { return static_cast<uint16_t>((i * 2654435761u >> 7) | 1); };
  std::vector<uint16_t> v((size_t{5} << 20) + 777);
  for (size_t i = 0; i < v.size(); ++i) v[i] = value(i);
  const size_t first = 3, count = v.size() - 3 - 100;
  back_with_huge_pages(v.data() + first, count * sizeof(uint16_t));
  constexpr uintptr_t huge = uintptr_t{2} << 20;
  const auto addr = [&](size_t i) { return reinterpret_cast<uintptr_t>(v.data() + i); };
  size_t dropped = 0, kept = 0, wrong = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const bool inside = i >= first && i < first + count && addr(i) / huge * huge >= addr(first) &&
                        (addr(i) / huge + 1) * huge <= addr(first + count);
    if (inside) dropped += v[i] == 0;
    else kept += v[i] == value(i);
    wrong += inside ? v[i] != 0 : v[i] != value(i);
  }
  CHECK(wrong == 0);
  CHECK(dropped >= (size_t{4} << 20) / sizeof(uint16_t));  // at least two whole pages in 10 MiB
  CHECK(kept > 0);
  for (size_t i = 0; i < v.size(); ++i) v[i] = value(i);  // written again: every value holds
  for (size_t i = 0; i < v.size(); ++i) wrong += v[i] != value(i);
  CHECK(wrong == 0);
  back_with_huge_pages(v.data(), 100);  // less than a page: nothing dropped
  CHECK(v[5] == value(5));
}
