// `shoal mkmodel` and `shoal logits`.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <cstdio>
#include <expected>
#include <fstream>
#include <iterator>
#include <sstream>

#include "model/forward.hpp"
#include "model/generate.hpp"
#include "model/vision.hpp"
#include "model/weights.hpp"
#include "tools/shoal/commands.hpp"

#ifndef SHOAL_DEFAULT_TOKENIZER_DIR
#define SHOAL_DEFAULT_TOKENIZER_DIR ""
#endif

namespace shoal::tools {

CLI::Option* add_kv_dtype_option(CLI::App& app, model::kv_dtype& out, const std::string& help) {
  return app
      .add_option_function<std::string>(
          "--kv-dtype", [&out](const std::string& s) { out = *model::parse_kv_dtype(s); }, help)
      ->check(CLI::IsMember({"fp32", "bf16", "fp8"}));
}

namespace {

int code = 0;

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) ids.push_back(static_cast<int32_t>(std::stol(item)));
  return ids;
}

// RGB_FILE:W:H:POS → the image's encoder rows and POS, checked against the model and `ids`.
std::expected<std::pair<std::vector<float>, int64_t>, std::string> image_rows(const model::model_weights& w,
                                                                              const std::vector<int32_t>& ids,
                                                                              const std::string& spec) {
  std::vector<std::string> f;
  std::stringstream ss(spec);
  for (std::string item; std::getline(ss, item, ':');) f.push_back(item);
  if (f.size() < 4) return std::unexpected("expected RGB_FILE:W:H:POS");
  int64_t width = 0, height = 0, pos = 0;
  try {
    width = std::stoll(f[f.size() - 3]), height = std::stoll(f[f.size() - 2]), pos = std::stoll(f.back());
  } catch (const std::exception&) {
    return std::unexpected("W, H and POS must be integers");
  }
  std::string path = spec.substr(0, spec.size() - f[f.size() - 3].size() - f[f.size() - 2].size() - f.back().size() - 3);
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> rgb((std::istreambuf_iterator<char>(in)), {});
  if (!in.eof() && !in) return std::unexpected("cannot read " + path);
  if (auto e = model::check_image(w.config.vision, width, height, rgb.size()); !e.empty()) return std::unexpected(e);
  const int64_t n = model::image_tokens(w.config.vision, width, height);
  if (pos < 0 || pos + n > static_cast<int64_t>(ids.size()))
    return std::unexpected("its " + std::to_string(n) + " tokens at " + std::to_string(pos) + " run past the prompt");
  for (int64_t i = pos; i < pos + n; ++i)
    if (ids[i] != w.config.vision.image_token_id)
      return std::unexpected("token " + std::to_string(i) + " is " + std::to_string(ids[i]) + ", not the image token " +
                             std::to_string(w.config.vision.image_token_id));
  return std::pair{model::encode_image(w, rgb, width, height, false), pos};
}

bool write_floats(const std::string& path, const std::vector<float>& v) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  return static_cast<bool>(f);
}

}  // namespace

int exit_code() { return code; }
void set_exit_code(int c) { code = c; }

void add_model_commands(CLI::App& app) {
  auto* mk = app.add_subcommand("mkmodel", "write a deterministic random checkpoint of a preset");
  auto opts = std::make_shared<model::generate_options>();
  opts->tokenizer_dir = SHOAL_DEFAULT_TOKENIZER_DIR;
  mk->add_option("--preset", opts->preset, "tiny | small | v3-tiny | v3-small")->required();
  mk->add_option("--dtype", opts->dtype, "bf16 | fp8: the layers' linears (default: fp8 for v3-tiny, else bf16)");
  mk->add_option("--seed", opts->seed, "random seed");
  mk->add_option("--out", opts->out_dir, "output directory")->required();
  mk->add_option("--tokenizer", opts->tokenizer_dir, "directory with the DeepSeek-V3 tokenizer.json (small, v3-small)");
  mk->add_flag("--vision", opts->vision, "with the vision encoder and the image placeholder token");
  auto* hot = mk->add_option("--hot-experts", opts->hot_experts,
                             "skewed routing: every MoE layer's gate bias favours experts 0..N-1 (balancer tests)");
  mk->add_option("--hot-bias", opts->hot_bias, "what --hot-experts adds to those experts' gate bias (default 0.25)")
    ->needs(hot);
  mk->callback([opts] {
    auto r = model::generate_checkpoint(*opts);
    if (!r) {
      fmt::print(stderr, "shoal mkmodel: {}\n", r.error().message);
      set_exit_code(1);
      return;
    }
    fmt::print("wrote {} checkpoint (seed {}) to {}\n", opts->preset, opts->seed, opts->out_dir);
  });

  auto* lg = app.add_subcommand("logits", "last-position logits of a token list (fp32 file)");
  auto model_dir = std::make_shared<std::string>();
  auto tokens = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto mtp_out = std::make_shared<std::string>();
  auto naive = std::make_shared<bool>(false);
  auto images = std::make_shared<std::vector<std::string>>();
  auto vision_out = std::make_shared<std::string>();
  lg->add_option("--model", *model_dir, "checkpoint directory")->required();
  lg->add_option("--tokens", *tokens, "comma-separated token ids")->required();
  lg->add_option("--out", *out, "output file (float32 little-endian, vocab_size values)")->required();
  lg->add_option("--mtp-out", *mtp_out, "MTP draft logits at the last position");
  lg->add_flag("--naive", *naive, "naive (expanded) attention instead of absorbed");
  lg->add_option("--image", *images, "RGB_FILE:W:H:POS: raw RGB bytes of a W x H image whose encoder rows replace "
                                     "the image tokens at positions POS.. (repeatable)");
  auto kv = std::make_shared<model::kv_dtype>(model::kv_dtype::fp32);
  add_kv_dtype_option(*lg, *kv, "the KV cache's stored form (default fp32, the exact reference)");
  lg->add_option("--vision-out", *vision_out, "the encoder rows of every --image, in order (float32)");
  lg->callback([=] {
    auto w = model::load_weights(*model_dir, model::print_load_progress);
    if (!w) {
      fmt::print(stderr, "shoal logits: {}\n", w.error().message);
      set_exit_code(1);
      return;
    }
    std::vector<int32_t> ids;
    try {
      ids = parse_ids(*tokens);
    } catch (const std::exception&) {
      fmt::print(stderr, "shoal logits: --tokens must be comma-separated integers\n");
      set_exit_code(2);
      return;
    }
    for (int32_t t : ids)
      if (t < 0 || t >= w->config.vocab_size) {
        fmt::print(stderr, "shoal logits: token id {} outside the vocabulary [0, {})\n", t, w->config.vocab_size);
        set_exit_code(2);
        return;
      }
    if (ids.empty()) {
      fmt::print(stderr, "shoal logits: --tokens is empty\n");
      set_exit_code(2);
      return;
    }
    std::vector<std::vector<float>> rows;
    std::vector<model::input_rows> inputs;
    for (const auto& spec : *images) {
      auto image = image_rows(*w, ids, spec);
      if (!image) {
        fmt::print(stderr, "shoal logits: --image {}: {}\n", spec, image.error());
        set_exit_code(2);
        return;
      }
      rows.push_back(std::move(image->first));
      inputs.push_back({image->second, static_cast<int64_t>(rows.back().size()) / w->config.hidden_size, nullptr});
    }
    for (size_t i = 0; i < inputs.size(); ++i) inputs[i].values = rows[i].data();
    model::forward_options fo;
    fo.naive_attention = *naive;
    auto res = model::forward_full(*w, ids, fo, inputs, *kv);
    bool ok = write_floats(*out, res.logits);
    if (!vision_out->empty()) {
      std::vector<float> all;
      for (const auto& r : rows) all.insert(all.end(), r.begin(), r.end());
      ok = ok && write_floats(*vision_out, all);
    }
    if (!mtp_out->empty()) ok = ok && !res.mtp.logits.empty() && write_floats(*mtp_out, res.mtp.logits);
    if (!ok) {
      fmt::print(stderr, "shoal logits: cannot write output (or no MTP output for this model/prompt)\n");
      set_exit_code(1);
    }
  });
}

}  // namespace shoal::tools
