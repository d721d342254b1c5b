// `shoal mkmodel` and `shoal logits`.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "model/forward.hpp"
#include "model/generate.hpp"
#include "model/weights.hpp"
#include "tools/shoal/commands.hpp"

#ifndef SHOAL_DEFAULT_TOKENIZER_DIR
#define SHOAL_DEFAULT_TOKENIZER_DIR ""
#endif

namespace shoal::tools {
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
  mk->add_option("--preset", opts->preset, "tiny | small | v3-tiny")->required();
  mk->add_option("--seed", opts->seed, "random seed");
  mk->add_option("--out", opts->out_dir, "output directory")->required();
  mk->add_option("--tokenizer", opts->tokenizer_dir, "directory with the DeepSeek-V3 tokenizer.json (small)");
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
  lg->add_option("--model", *model_dir, "checkpoint directory")->required();
  lg->add_option("--tokens", *tokens, "comma-separated token ids")->required();
  lg->add_option("--out", *out, "output file (float32 little-endian, vocab_size values)")->required();
  lg->add_option("--mtp-out", *mtp_out, "MTP draft logits at the last position");
  lg->add_flag("--naive", *naive, "naive (expanded) attention instead of absorbed");
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
    model::forward_options fo;
    fo.naive_attention = *naive;
    auto res = model::forward_full(*w, ids, fo);
    bool ok = write_floats(*out, res.logits);
    if (!mtp_out->empty()) ok = ok && !res.mtp.logits.empty() && write_floats(*mtp_out, res.mtp.logits);
    if (!ok) {
      fmt::print(stderr, "shoal logits: cannot write output (or no MTP output for this model/prompt)\n");
      set_exit_code(1);
    }
  });
}

}  // namespace shoal::tools
