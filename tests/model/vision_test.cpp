// The vision encoder and image rows in the forward pass on the tiny vision model: the rows an
// image gives (one per patch, deterministic, batch-invariant kernels within 1e-5 of the fast
// ones), that they change the logits, that chunked prefill splitting an image anywhere equals
// the whole prompt, and the size checks. The equality with the NumPy reference is the
// reference_forward test.
#include <doctest/doctest.h>

#include "model/forward.hpp"
#include "model/vision.hpp"
#include "tests/support/tiny_models.hpp"

using namespace shoal;
using test::dense_cache;

namespace {

// 5 text tokens, the image's placeholders, 6 text tokens.
std::vector<int32_t> prompt_with_image(int64_t n_image) {
  auto tokens = test::random_tokens(5, 11);
  tokens.insert(tokens.end(), static_cast<size_t>(n_image), 299);
  auto tail = test::random_tokens(6, 12);
  tokens.insert(tokens.end(), tail.begin(), tail.end());
  return tokens;
}

}  // namespace

TEST_CASE("vision: one row of hidden_size per patch, deterministic, invariant kernels within 1e-5") {
  auto w = test::tiny_model("tiny", 1, test::with_vision);
  for (auto [width, height] : std::vector<std::pair<int64_t, int64_t>>{{14, 14}, {56, 56}, {28, 42}, {56, 14}}) {
    CAPTURE(width);
    CAPTURE(height);
    auto rgb = test::random_rgb(width, height, 3);
    auto a = model::encode_image(*w, rgb, width, height, true);
    CHECK(static_cast<int64_t>(a.size()) == model::image_tokens(w->config.vision, width, height) * w->config.hidden_size);
    CHECK(a == model::encode_image(*w, rgb, width, height, true));
    CHECK(test::rel_diff(model::encode_image(*w, rgb, width, height, false), a) < 1e-5);
    auto other = rgb;
    other[0] ^= 0x80;  // one pixel of the first patch
    CHECK(model::encode_image(*w, other, width, height, true) != a);
  }
}

TEST_CASE("vision: image rows change the logits, chunked prefill splitting the image equals whole") {
  auto w = test::tiny_model("tiny", 1, test::with_vision);
  const int64_t width = 56, height = 28, n = model::image_tokens(w->config.vision, width, height);
  REQUIRE(n == 8);
  auto rows = model::encode_image(*w, test::random_rgb(width, height, 5), width, height, true);
  auto tokens = prompt_with_image(n);
  const model::input_rows in{5, n, rows.data()};
  auto with = model::forward_full(*w, tokens, {true, false}, std::span(&in, 1));
  auto without = model::forward_full(*w, tokens, {true, false});
  CHECK(test::rel_diff(with.logits, without.logits) > 1e-3);

  const auto& c = w->config;
  const int64_t total = static_cast<int64_t>(tokens.size());
  for (auto split : std::vector<std::vector<int64_t>>{{3, 16}, {7, 2, 10}, {13, 6}, std::vector<int64_t>(19, 1)}) {
    dense_cache dc(c, (total + c.block_size - 1) / c.block_size, model::min_ring_tokens(c) + 1);
    const int64_t dec_from = std::max<int64_t>(0, total - model::exact_decoder_tail(c));
    std::vector<float> logits;
    for (size_t i = 0, pos = 0; static_cast<int64_t>(pos) < total; ++i) {
      const int64_t len = i < split.size() ? std::min<int64_t>(split[i], total - pos) : total - pos;
      model::forward_item item{&dc.cache, std::span<const int32_t>(tokens).subspan(pos, len), dec_from, 0,
                               static_cast<int64_t>(pos) + len == total, false, std::span(&in, 1)};
      auto out = model::forward(*w, std::span<model::forward_item>(&item, 1), {true, false});
      pos += static_cast<size_t>(len);
      if (static_cast<int64_t>(pos) == total) logits = out.logits;
    }
    CHECK(logits == with.logits);
  }
}

TEST_CASE("vision: image sizes outside the encoder's are named") {
  auto w = test::tiny_model("tiny", 1, test::with_vision);
  const auto& v = w->config.vision;
  CHECK(model::check_image(v, 56, 28, 56 * 28 * 3).empty());
  CHECK(model::check_image(v, 30, 28, 30 * 28 * 3).find("width 30 is not a positive multiple of the patch size 14") !=
        std::string::npos);
  CHECK(model::check_image(v, 56, 70, 56 * 70 * 3).find("height 70") != std::string::npos);
  CHECK(model::check_image(v, 0, 14, 0).find("width 0") != std::string::npos);
  CHECK(model::check_image(v, 14, 14, 10).find("10 bytes of RGB, not 588") != std::string::npos);
  CHECK(model::check_image(test::tiny_model("tiny")->config.vision, 14, 14, 588) == "the model has no vision encoder");
}
