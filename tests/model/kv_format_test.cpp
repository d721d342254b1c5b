// KV cache formats: the paged memory's layout, the block header, and the accuracy of bf16 and
// fp8 caches against the exact fp32 one on every preset (bounds derived in model/README.md
// "KV cache formats").
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "model/forward.hpp"
#include "model/kv_format.hpp"
#include "tests/support/skip.hpp"
#include "tests/support/tiny_models.hpp"

using namespace shoal;

namespace {

// Logits of every position of `tokens` (one pass, every position through the decoder).
std::vector<float> all_logits(const model::model_weights& w, const std::vector<int32_t>& tokens, model::kv_dtype kv,
                              bool invariant = true) {
  const auto& c = w.config;
  const int64_t n = static_cast<int64_t>(tokens.size());
  test::dense_cache dc(c, (n + c.block_size - 1) / c.block_size, model::min_ring_tokens(c) + 1, kv);
  model::forward_item item{&dc.cache, tokens, 0, 0, true, false, {}, n};
  return model::forward(w, std::span<model::forward_item>(&item, 1), {invariant, false}).logits;
}

struct divergence {
  double max_rel = 0;  // max |Δlogit| / max |logit|
  double mean_kl = 0;  // mean over positions of KL(p_fp32 ‖ p_format)
};

divergence compare(const std::vector<float>& ref, const std::vector<float>& got, int64_t vocab) {
  divergence d;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num = std::max(num, double(std::fabs(ref[i] - got[i])));
    den = std::max(den, double(std::fabs(ref[i])));
  }
  d.max_rel = num / den;
  const size_t rows = ref.size() / static_cast<size_t>(vocab);
  for (size_t r = 0; r < rows; ++r) {
    const float* a = ref.data() + r * vocab;
    const float* b = got.data() + r * vocab;
    double ma = *std::max_element(a, a + vocab), mb = *std::max_element(b, b + vocab), sa = 0, sb = 0;
    for (int64_t k = 0; k < vocab; ++k) sa += std::exp(a[k] - ma), sb += std::exp(b[k] - mb);
    double kl = 0;
    for (int64_t k = 0; k < vocab; ++k) {
      const double la = a[k] - ma - std::log(sa), lb = b[k] - mb - std::log(sb);
      kl += std::exp(la) * (la - lb);
    }
    d.mean_kl += kl / double(rows);
  }
  return d;
}

}  // namespace

TEST_CASE("kv_format: sizes per format, blocks contiguous in the pages, the header round-trips") {
  auto c = *model::preset_config("v3-small");
  const auto fp32 = model::kv_format_of(c, model::kv_dtype::fp32), bf16 = model::kv_format_of(c, model::kv_dtype::bf16),
             fp8 = model::kv_format_of(c, model::kv_dtype::fp8);
  CHECK(fp32.entry_bytes() == 4 * 320);
  CHECK(bf16.entry_bytes() * 2 == fp32.entry_bytes());
  CHECK(fp8.entry_bytes() == 256 + 8 + 128);  // e4m3 latent, its 8 scales, bf16 rope
  CHECK(fp32.layers == c.cache_layers());
  CHECK(fp32.block_bytes() == static_cast<size_t>(c.cache_layers() * c.block_size) * fp32.entry_bytes());
  model::kv_pages pages(bf16, 3);
  CHECK(pages.memory().size() == 3 * bf16.block_bytes());
  CHECK(pages.block(1) - pages.block(0) == static_cast<std::ptrdiff_t>(bf16.block_bytes()));
  CHECK(pages.offset_bytes(2) == 2 * bf16.block_bytes());
  uint8_t header[model::kv_block_header_bytes];
  model::write_block_header(fp8, header);
  auto back = model::read_block_header(header);
  REQUIRE(back);
  CHECK(*back == fp8);
  CHECK(*back != bf16);
  header[0] = 'X';
  CHECK_FALSE(model::read_block_header(header));
  CHECK_FALSE(model::read_block_header(std::span<const uint8_t>(header, 8)));
  CHECK(model::parse_kv_dtype("bf16") == model::kv_dtype::bf16);
  CHECK_FALSE(model::parse_kv_dtype("int8"));
}

namespace {

// The derived bounds (model/README.md "KV cache formats"): a stored value's relative error is
// at most u (bf16 2^-8; fp8 2^-3, the OCP scale rule's clipping of a block's top binade), so
// to first order max |Δlogit| / max |logit| ≤ u (1 + 2S) ≤ 2u with the absolute score scale
// S ≤ 1/2, and KL(p ‖ q) ≈ ½ Var_p(Δlogit) ≤ ½ (2u · max |logit|)².
double unit_error(model::kv_dtype kv) { return kv == model::kv_dtype::bf16 ? 0x1p-8 : 0x1p-3; }

// Each preset's attention, caches and dense layers, its routed FFNs replaced by dense ones:
// top-k routing is discontinuous, and a random-initialised gate's margins are so thin that
// any perturbation flips some of 256 × layers choices (see model/README.md).
void dense_ffn(model::model_config& c) { c.first_k_dense_replace = c.num_hidden_layers + c.num_nextn_predict_layers; }

}  // namespace

TEST_CASE("kv_format: bf16 and fp8 caches stay within their derived bounds of fp32 on every preset") {
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SHOAL_UNDER_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(SHOAL_UNDER_ASAN)
  const std::vector<const char*> presets = {"tiny", "v3-tiny"};  // the small ones take minutes under ASan
#else
  const std::vector<const char*> presets = {"tiny", "v3-tiny", "small", "v3-small"};
#endif
  for (const char* preset : presets) {
    CAPTURE(preset);
    auto w = test::tiny_model(preset, 1, dense_ffn);
    auto tokens = test::random_tokens(256, 17, static_cast<int32_t>(w->config.vocab_size));
    auto ref = all_logits(*w, tokens, model::kv_dtype::fp32);
    double max_logit = 0;
    for (float x : ref) max_logit = std::max(max_logit, double(std::fabs(x)));
    for (auto kv : {model::kv_dtype::bf16, model::kv_dtype::fp8}) {
      CAPTURE(model::to_string(kv));
      auto d = compare(ref, all_logits(*w, tokens, kv), w->config.vocab_size);
      const double u = unit_error(kv);
      MESSAGE(std::string(preset) << " " << model::to_string(kv) << ": max |dlogit| / max |logit| " << d.max_rel << " (bound "
                     << 2 * u << "), mean KL " << d.mean_kl << " (bound " << 0.5 * std::pow(2 * u * max_logit, 2) << ")");
      CHECK(d.max_rel > 0);  // the format does change the values
      CHECK(d.max_rel <= 2 * u);
      CHECK(d.mean_kl <= 0.5 * std::pow(2 * u * max_logit, 2));
    }
  }
}
