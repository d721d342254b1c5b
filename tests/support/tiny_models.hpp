// In-memory tiny models for tests: the preset configs with a fixed vocabulary, random
// weights from the generator's initialiser, no file I/O.
#pragma once

#include <doctest/doctest.h>

#include <memory>
#include <random>
#include <vector>

#include "model/generate.hpp"
#include "model/tokenizer.hpp"
#include "model/weights.hpp"
#include "runtime/engine/engine.hpp"

namespace shoal::test {

// The tiny preset's vision encoder; its image token is 299 (the last of the test vocabulary).
inline void with_vision(model::model_config& c) {
  c.vision = *model::vision_preset("tiny");
  c.vision.image_token_id = 299;
}

inline std::vector<uint8_t> random_rgb(int64_t width, int64_t height, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> rgb(static_cast<size_t>(width * height * 3));
  for (auto& x : rgb) x = static_cast<uint8_t>(rng());
  return rgb;
}

inline std::shared_ptr<model::model_weights> tiny_model(const std::string& preset, uint64_t seed = 1,
                                                        void (*tweak)(model::model_config&) = nullptr) {
  auto w = std::make_shared<model::model_weights>();
  w->config = *model::preset_config(preset);
  w->config.vocab_size = 300;
  w->config.bos_token_id = 256;
  w->config.eos_token_id = 257;
  if (tweak) tweak(w->config);
  model::init_random(*w, seed);
  return w;
}

// The byte-level tokenizer with one special token, <eos> (id 256 of the test vocabulary).
inline std::shared_ptr<const model::tokenizer> byte_tokenizer() {
  auto tok = model::tokenizer::parse(model::byte_level_tokenizer_json({"<eos>"}), "generated");
  REQUIRE(tok);
  return std::make_shared<const model::tokenizer>(std::move(*tok));
}

// An engine config for exact comparisons: `blocks` cache blocks in KV format `kv` (the exact
// fp32 unless asked), fp32 window snapshots, batch-invariant kernels, logits captured per event.
inline runtime::engine_config exact_engine_config(int64_t blocks, model::kv_dtype kv = model::kv_dtype::fp32) {
  runtime::engine_config c;
  c.cache.num_blocks = blocks;
  c.cache.kv_dtype = kv;
  c.cache.snapshot_storage = runtime::swa_storage::fp32;
  c.batch_invariant = true;
  c.capture_logits = true;
  return c;
}

// Runs one request alone on `e` until the engine is idle; returns its events.
inline std::vector<runtime::token_event> run_alone(runtime::engine& e, const std::vector<int32_t>& prompt,
                                                   const runtime::sampling_params& p) {
  auto id = e.add_request(prompt, p);
  REQUIRE(id.has_value());
  std::vector<runtime::token_event> events;
  while (e.has_work())
    for (auto& ev : e.step())
      if (ev.id == *id) events.push_back(std::move(ev));
  return events;
}

inline std::vector<int32_t> random_tokens(size_t n, uint32_t seed, int32_t vocab = 256) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return t;
}

// max |a − b| / max |b|
inline double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 1e-12;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, double(std::fabs(a[i] - b[i])));
    den = std::max(den, double(std::fabs(b[i])));
  }
  return num / den;
}

// A sequence cache over private paged memory of `n_blocks` blocks in format `kv`.
struct dense_cache {
  std::unique_ptr<model::kv_pages> pages;
  model::sequence_cache cache;
  dense_cache(const model::model_config& c, int64_t n_blocks, int64_t ring, model::kv_dtype kv = model::kv_dtype::fp32)
      : pages(std::make_unique<model::kv_pages>(model::kv_format_of(c, kv), static_cast<int32_t>(n_blocks))) {
    cache.init(c, ring, kv);
    cache.pages = pages.get();
    for (int64_t b = 0; b < n_blocks; ++b) cache.blocks.push_back(static_cast<int32_t>(b));
  }
};

}  // namespace shoal::test
