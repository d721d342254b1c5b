// Equalities of the forward pass on the tiny presets: absorbed == naive MLA, incremental
// decode == full recompute, chunked prefill (any split) == unchunked, shoal_flash with m = 1
// and W ≥ context == full causal attention. Bit-exact where batch-invariant mode promises it.
#include <doctest/doctest.h>

#include <cmath>

#include "model/forward.hpp"
#include "tests/support/tiny_models.hpp"

using namespace shoal;
using test::dense_cache;

namespace {

// Runs `tokens` through a fresh cache in chunks of the given sizes; returns last logits.
std::vector<float> run_chunked(const model::model_weights& w, const std::vector<int32_t>& tokens,
                               const std::vector<int64_t>& chunks, bool invariant,
                               model::kv_dtype kv = model::kv_dtype::fp32) {
  const auto& c = w.config;
  int64_t n = static_cast<int64_t>(tokens.size());
  dense_cache dc(c, (n + c.block_size - 1) / c.block_size, model::min_ring_tokens(c) + 1, kv);
  int64_t dec_from = std::max<int64_t>(0, n - model::exact_decoder_tail(c));
  std::vector<float> logits;
  int64_t pos = 0;
  for (size_t i = 0; pos < n; ++i) {
    int64_t len = i < chunks.size() ? std::min(chunks[i], n - pos) : n - pos;
    model::forward_item item{&dc.cache, std::span<const int32_t>(tokens).subspan(pos, len), dec_from, 0,
                             pos + len == n, false, {}};
    auto out = model::forward(w, std::span<model::forward_item>(&item, 1), {invariant, false});
    pos += len;
    if (pos == n) logits = out.logits;
  }
  return logits;
}

}  // namespace

TEST_CASE("absorbed MLA equals naive MLA (both architectures), rel < 1e-5") {
  for (const char* preset : {"tiny", "v3-tiny"}) {
    auto w = test::tiny_model(preset);
    auto tokens = test::random_tokens(45, 3);
    auto a = model::forward_full(*w, tokens, {false, false});
    auto b = model::forward_full(*w, tokens, {false, true});
    CAPTURE(preset);
    CHECK(test::rel_diff(a.logits, b.logits) < 1e-5);
    CHECK(test::rel_diff(a.mtp.logits, b.mtp.logits) < 1e-5);
  }
}

TEST_CASE("chunked prefill with any split equals unchunked (bit-exact in batch-invariant mode, in every KV format)") {
  for (auto kv : {model::kv_dtype::fp32, model::kv_dtype::bf16, model::kv_dtype::fp8})
    for (const char* preset : {"tiny", "v3-tiny"}) {
      auto w = test::tiny_model(preset);
      auto tokens = test::random_tokens(61, 4);
      auto whole = run_chunked(*w, tokens, {61}, true, kv);
      for (auto split : std::vector<std::vector<int64_t>>{{1, 60}, {16, 16, 16, 13}, {7, 3, 29, 22}, {60, 1},
                                                           std::vector<int64_t>(61, 1)}) {
        CAPTURE(preset);
        CAPTURE(model::to_string(kv));
        CHECK(run_chunked(*w, tokens, split, true, kv) == whole);
        CHECK(test::rel_diff(run_chunked(*w, tokens, split, false, kv), whole) < 1e-4);
      }
    }
}

TEST_CASE("incremental decode with caches equals full recompute (bit-exact in batch-invariant mode, in every KV format)") {
  for (auto kv : {model::kv_dtype::fp32, model::kv_dtype::bf16, model::kv_dtype::fp8})
  for (bool invariant : {true, false})
    for (const char* preset : {"tiny", "v3-tiny"}) {
      auto w = test::tiny_model(preset);
      const auto& c = w->config;
      auto tokens = test::random_tokens(70, 5);
      int64_t prompt = 30;
      dense_cache dc(c, 70 / c.block_size + 1, model::min_ring_tokens(c) + 1, kv);
      int64_t dec_from = std::max<int64_t>(0, prompt - model::exact_decoder_tail(c));
      model::forward_item item{&dc.cache, std::span<const int32_t>(tokens).subspan(0, prompt), dec_from, 0, true, false, {}};
      model::forward(*w, std::span<model::forward_item>(&item, 1), {invariant, false});
      for (int64_t t = prompt; t < 70; ++t) {
        model::forward_item step{&dc.cache, std::span<const int32_t>(tokens).subspan(t, 1), dec_from, 0, true, false, {}};
        auto out = model::forward(*w, std::span<model::forward_item>(&step, 1), {invariant, false});
        auto full = model::forward_full(*w, std::span<const int32_t>(tokens).subspan(0, t + 1), {invariant, false}, {}, kv);
        CAPTURE(preset);
        CAPTURE(model::to_string(kv));
        CAPTURE(t);
        CAPTURE(invariant);
        if (invariant) REQUIRE(out.logits == full.logits);
        else REQUIRE(test::rel_diff(out.logits, full.logits) < 1e-4);
      }
    }
}

TEST_CASE("shoal_flash with m = 1 and W >= context equals full causal attention") {
  // The same weights run as a deepseek_v3 stack of n_enc + n_dec layers: with every entry in
  // the window, compressed entries are never seen and every layer is plain causal MLA.
  auto flash = test::tiny_model("tiny", 9, [](model::model_config& c) {
    c.compress_ratio = 1;
    c.sliding_window = 512;
    c.retained_tokens = 512;
  });
  auto causal = std::make_shared<model::model_weights>(*flash);
  causal->config.architecture = model::arch::deepseek_v3;
  causal->config.n_encoder_layers = causal->config.n_decoder_layers = 0;
  for (auto& l : causal->layers) l.attn.kv_compress.clear();
  for (size_t n : {1, 9, 40, 100}) {
    auto tokens = test::random_tokens(n, static_cast<uint32_t>(n));
    auto a = model::forward_full(*flash, tokens);
    auto b = model::forward_full(*causal, tokens);
    CAPTURE(n);
    CHECK(test::rel_diff(a.logits, b.logits) < 1e-5);
    if (n >= 2) CHECK(test::rel_diff(a.mtp.logits, b.mtp.logits) < 1e-5);
  }
}

TEST_CASE("shoal_flash compression changes the result (the test above is not vacuous)") {
  auto w = test::tiny_model("tiny");
  auto wide = test::tiny_model("tiny", 1, [](model::model_config& c) {
    c.sliding_window = 512;
    c.retained_tokens = 512;
  });
  auto tokens = test::random_tokens(60, 2);
  CHECK(test::rel_diff(model::forward_full(*w, tokens).logits, model::forward_full(*wide, tokens).logits) > 1e-3);
}

TEST_CASE("the tiled attention path over more keys than one chunk equals the per-query path (600 positions)") {
  // 600 visible keys at the last positions: two key chunks of the online softmax. In fp32: the
  // two paths' GEMMs round differently, and a stored format would turn those last-bit
  // differences into whole rounding steps of its own.
  auto w = test::tiny_model("v3-tiny", 1, [](model::model_config& c) { c.max_position_embeddings = 1024; });
  auto tokens = test::random_tokens(600, 41);
  auto tiled = model::forward_full(*w, tokens, {false, false});
  auto per_query = model::forward_full(*w, tokens, {true, false});
  CHECK(test::rel_diff(tiled.logits, per_query.logits) < 1e-4);
}
