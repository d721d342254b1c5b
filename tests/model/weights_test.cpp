// Generated checkpoints load through the real loader (both presets, sharded FP8 for v3-tiny),
// and broken checkpoints fail with errors that name the file and the tensor or field.
#include <doctest/doctest.h>

#include <filesystem>
#include <functional>
#include <fstream>

#include <nlohmann/json.hpp>

#include "model/forward.hpp"
#include "model/generate.hpp"
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
