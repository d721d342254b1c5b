// Images through the engine on the tiny vision model: the first token's logits equal the
// whole-prompt forward with the image's rows; a repeated image is a prefix hit over its
// tokens; the same image after other text is an embedding-cache hit (the encoder runs once);
// a different image behind the same tokens gets neither; the keys of blocks with an image
// carry its hash; images that do not fit their prompt are refused.
#include <doctest/doctest.h>

#include "model/vision.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/vision/image.hpp"
#include "tests/support/tiny_models.hpp"

using namespace shoal;

namespace {

constexpr int32_t image_token = 299;

runtime::prompt_image make_image(int64_t width, int64_t height, uint32_t seed, int64_t pos) {
  auto img = std::make_shared<runtime::rgb_image>();
  img->width = width, img->height = height, img->rgb = test::random_rgb(width, height, seed);
  runtime::prompt_image im;
  im.pos = pos, im.count = (width / 14) * (height / 14), im.hash = runtime::image_content_hash(*img);
  im.pixels = std::move(img);
  return im;
}

// `head` text tokens, the image's placeholders, 20 more text tokens.
std::vector<int32_t> prompt_around(const std::vector<int32_t>& head, const runtime::prompt_image& im) {
  std::vector<int32_t> p = head;
  p.insert(p.end(), static_cast<size_t>(im.count), image_token);
  auto tail = test::random_tokens(20, 77);
  p.insert(p.end(), tail.begin(), tail.end());
  return p;
}

runtime::sampling_params greedy(int32_t n) {
  runtime::sampling_params p;
  p.temperature = 0;
  p.max_tokens = n;
  return p;
}

}  // namespace

TEST_CASE("vision engine: first-token logits equal the whole-prompt forward with the image rows (v3-tiny)") {
  auto w = test::tiny_model("v3-tiny", 1, test::with_vision);
  runtime::engine e(w, test::exact_engine_config(64));
  auto im = make_image(56, 28, 5, 5);
  auto prompt = prompt_around(test::random_tokens(5, 11), im);
  auto id = e.add_request(prompt, greedy(4), runtime::traffic_class::chat, {im});
  REQUIRE(id.has_value());
  std::vector<runtime::token_event> events;
  while (e.has_work())
    for (auto& ev : e.step()) events.push_back(std::move(ev));
  REQUIRE(events.size() == 4);
  auto rows = model::encode_image(*w, im.pixels->rgb, 56, 28, true);
  const model::input_rows in{im.pos, im.count, rows.data()};
  auto whole = model::forward_full(*w, prompt, {true, false}, std::span(&in, 1));
  CHECK(events[0].logits == whole.logits);
  CHECK(e.stats().images_encoded == 1);
  CHECK(e.stats().image_patches_encoded == 8);
  auto plain = model::forward_full(*w, prompt, {true, false});
  CHECK(events[0].logits != plain.logits);  // the image mattered
}

TEST_CASE("vision engine: a repeated image hits the prefix cache, after other text the embedding cache, another image neither") {
  auto w = test::tiny_model("tiny", 1, test::with_vision);
  auto cfg = test::exact_engine_config(64);
  cfg.sched.max_chunk = 16;  // chunk boundaries leave window snapshots: the hit is exact
  runtime::engine e(w, cfg);
  const auto head = test::random_tokens(5, 11);
  auto x = make_image(56, 28, 5, 5), y = make_image(56, 28, 6, 5);
  auto first = e.add_request(prompt_around(head, x), greedy(2), runtime::traffic_class::chat, {x});  // warms both caches
  REQUIRE(first.has_value());
  while (e.has_work()) e.step();
  REQUIRE(e.stats().images_encoded == 1);

  // A longer prompt over the same start: the hit ends before its decoder tail, so the window
  // comes from a snapshot and the outputs equal a cold engine's exactly.
  auto longer = prompt_around(head, x);
  auto extra = test::random_tokens(60, 78);
  longer.insert(longer.end(), extra.begin(), extra.end());
  auto again = e.add_request(longer, greedy(3), runtime::traffic_class::chat, {x});
  REQUIRE(again.has_value());
  while (e.has_work()) e.step();
  CHECK(e.cached_tokens(*again) == 32);  // both full blocks of the first 33 tokens, the image inside the first
  CHECK(e.stats().images_encoded == 1);
  CHECK(e.stats().cache.replays == 0);
  runtime::engine cold(w, cfg);
  auto ref = cold.add_request(longer, greedy(3), runtime::traffic_class::chat, {x});
  REQUIRE(ref.has_value());
  while (cold.has_work()) cold.step();
  CHECK(e.result(*again).output == cold.result(*ref).output);

  auto other_text = test::random_tokens(5, 12);
  auto x_later = x;  // same pixels, same position, other text before: no prefix hit
  auto c = e.add_request(prompt_around(other_text, x_later), greedy(2), runtime::traffic_class::chat, {x_later});
  REQUIRE(c.has_value());
  while (e.has_work()) e.step();
  CHECK(e.cached_tokens(*c) == 0);
  CHECK(e.stats().images_encoded == 1);
  CHECK(e.stats().image_cache.hits >= 1);

  auto d = e.add_request(prompt_around(head, y), greedy(2), runtime::traffic_class::chat, {y});
  REQUIRE(d.has_value());
  while (e.has_work()) e.step();
  CHECK(e.cached_tokens(*d) == 0);  // the image's block differs, and so every block after it
  CHECK(e.stats().images_encoded == 2);
}

TEST_CASE("vision engine: block keys carry the image hash from the image's block on") {
  const auto head = test::random_tokens(20, 11);  // the image starts in the second block of 16
  auto x = make_image(56, 28, 5, 20), y = make_image(56, 28, 6, 20);
  auto p = prompt_around(head, x);
  auto kx = runtime::chain_keys(p, 16, std::span(&x, 1)), ky = runtime::chain_keys(p, 16, std::span(&y, 1));
  auto plain = runtime::chain_keys(p, 16);
  REQUIRE(kx.size() == 3);
  CHECK(kx[0] == ky[0]);  // before the image
  CHECK(kx[0] == plain[0]);
  CHECK(kx[1] != ky[1]);
  CHECK(kx[2] != ky[2]);  // the chain carries the difference on
  CHECK(kx[1] != plain[1]);
  CHECK(runtime::chain_keys(p, 16, std::span(&x, 1)) == kx);
}

TEST_CASE("vision engine: images that do not fit the prompt or the encoder are refused, nothing queued") {
  auto w = test::tiny_model("tiny", 1, test::with_vision);
  runtime::engine e(w, test::exact_engine_config(64));
  const auto head = test::random_tokens(5, 11);
  auto im = make_image(56, 28, 5, 5);
  auto prompt = prompt_around(head, im);
  auto refused = [&](runtime::prompt_image bad, const std::string& what) {
    auto r = e.add_request(prompt, greedy(2), runtime::traffic_class::chat, {bad});
    REQUIRE_FALSE(r.has_value());
    CHECK_MESSAGE(r.error().message.find(what) != std::string::npos, r.error().message);
  };
  auto shifted = im;
  shifted.pos = 4;
  refused(shifted, "prompt token 4 is");
  auto short_count = im;
  short_count.count = 7;
  refused(short_count, "spans 7 tokens; its 8 patches");
  auto tampered = im;
  auto px = std::make_shared<runtime::rgb_image>(*im.pixels);
  px->rgb[3] ^= 1;
  tampered.pixels = px;
  refused(tampered, "do not hash");
  auto past = im;
  past.pos = static_cast<int64_t>(prompt.size()) - 4;
  refused(past, "runs past the prompt");
  auto odd = make_image(28, 28, 5, 5);
  auto big = std::make_shared<runtime::rgb_image>();
  big->width = 70, big->height = 14, big->rgb = test::random_rgb(70, 14, 1);
  odd.pixels = big;
  odd.hash = runtime::image_content_hash(*big);
  refused(odd, "width 70");
  CHECK_FALSE(e.has_work());

  runtime::engine plain(test::tiny_model("tiny"), test::exact_engine_config(64));
  auto r = plain.add_request(prompt, greedy(2), runtime::traffic_class::chat, {im});
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().message.find("no vision encoder") != std::string::npos);
}

TEST_CASE("embedding cache: bounded in bytes, least recently used out first, oversize rows not kept") {
  runtime::embedding_cache cache(3 * 100 * sizeof(float));
  auto rows = [](float v) { return std::make_shared<const std::vector<float>>(100, v); };
  cache.put({1, 0}, rows(1));
  cache.put({2, 0}, rows(2));
  cache.put({3, 0}, rows(3));
  REQUIRE(cache.get({1, 0}));  // 1 is now the most recent: 2 goes first
  cache.put({4, 0}, rows(4));
  CHECK(cache.get({2, 0}) == nullptr);
  CHECK(cache.get({1, 0})->at(0) == 1);
  CHECK(cache.get({3, 0})->at(0) == 3);
  CHECK(cache.get({4, 0})->at(0) == 4);
  auto held = cache.get({3, 0});
  cache.put({5, 0}, std::make_shared<const std::vector<float>>(301, 5.0f));  // larger than the whole cache
  CHECK(cache.get({5, 0}) == nullptr);
  cache.put({6, 0}, rows(6));
  cache.put({7, 0}, rows(7));
  cache.put({8, 0}, rows(8));
  CHECK(held->at(0) == 3);  // evicted, still valid for its holder
  const auto s = cache.stats();
  CHECK(s.entries == 3);
  CHECK(s.bytes == 3 * 100 * static_cast<int64_t>(sizeof(float)));
  CHECK(s.evictions == 4);
  CHECK(s.hits == 5);
  CHECK(s.misses == 2);
}
