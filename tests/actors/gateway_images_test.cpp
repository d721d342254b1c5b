// Image chat through the gateway (harness: gateway_harness.hpp): equal to a plain engine with
// the image, a repeated image a prefix hit and another not, and bad images refused with the
// exact 400 while the gateway keeps serving.
#include <doctest/doctest.h>

#include "tests/actors/gateway_harness.hpp"

using namespace shoal;
using namespace shoal::test::gateway_harness;
using namespace std::chrono_literals;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string png_url(const test::bytes& png) { return "data:image/png;base64," + test::base64(png); }

test::bytes noise_rgb(int w, int h, uint32_t seed) {
  test::bytes px(static_cast<size_t>(w * h * 3));
  uint32_t x = seed;
  for (auto& b : px) b = static_cast<uint8_t>((x = x * 1664525u + 1013904223u) >> 24);
  return px;
}

json image_chat(const std::string& url, int32_t max_tokens) {
  return {{"model", "tiny"},
          {"messages", json::array({{{"role", "user"},
                                     {"content", json::array({{{"type", "text"}, {"text", "What is in "}},
                                                              {{"type", "image_url"}, {"image_url", {{"url", url}}}},
                                                              {{"type", "text"}, {"text", "?"}}})}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"ignore_eos", true}};
}

}  // namespace

TEST_CASE("gateway image chat equals a plain engine with the image, a repeated image is a prefix hit, another is not") {
  cluster c(1);
  uint16_t port = c.start_gateway();
  const int32_t n = 12;
  const std::string url = png_url(test::write_png(noise_rgb(40, 30, 1).data(), 40, 30, PNG_FORMAT_RGB));
  const json body = image_chat(url, n);

  // The reference: the same body parsed as the gateway parses it, rendered, expanded, and run
  // on a plain engine with the image.
  auto limits = runtime::api_limits{};
  limits.model_ids = {"tiny"};
  limits.image_token = "<image>";
  limits.image_side = 56, limits.image_patch = 14;
  auto parsed = runtime::parse_completion_request(body.dump(), true, limits);
  REQUIRE(parsed);
  REQUIRE(parsed->images.size() == 1);
  CHECK(parsed->images[0].count == 6);  // 40x30 fits 42x28: 3 x 2 patches
  auto ids = runtime::expand_image_tokens(chat_prompt(parsed->messages), tok().token_id("<image>"), parsed->images);
  REQUIRE(ids);
  const std::string want = as_json_text(tok().decode(reference_tokens(*ids, n, parsed->images)));
  CHECK(want != as_json_text(tok().decode(reference_tokens(*ids, n))));  // the image matters

  auto r = post(port, "/v1/chat/completions", body);
  REQUIRE(r.status == 200);
  json j = parse(r.body);
  CHECK(j["choices"][0]["message"]["content"] == want);
  CHECK(j["usage"]["prompt_tokens"] == ids->size());

  auto again = post(port, "/v1/chat/completions", body);
  REQUIRE(again.status == 200);
  json ja = parse(again.body);
  CHECK(ja["choices"][0]["message"]["content"] == want);
  CHECK(ja["usage"]["prompt_tokens_details"]["cached_tokens"] == (ids->size() - 1) / 16 * 16);

  auto other = post(port, "/v1/chat/completions",
                    image_chat(png_url(test::write_png(noise_rgb(40, 30, 2).data(), 40, 30, PNG_FORMAT_RGB)), n));
  REQUIRE(other.status == 200);
  CHECK(parse(other.body)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);  // the image is in block 0
  auto st = c.stats(0);
  CHECK(st.engine.images_encoded == 2);
}

TEST_CASE("gateway refuses bad images with the exact 400 naming the problem, and keeps serving") {
  cluster c(1);
  auto g = cluster::default_gateway();
  g.max_images = 2;
  g.image_limits.max_pixels = 100 * 100;
  g.image_limits.max_bytes = 6000;
  uint16_t port = c.start_gateway(g);
  const auto small = test::write_png(noise_rgb(20, 20, 3).data(), 20, 20, PNG_FORMAT_RGB);
  const auto big = test::write_png(test::bytes(120 * 100 * 3, 128).data(), 120, 100, PNG_FORMAT_RGB);
  const auto heavy = test::write_png(noise_rgb(60, 60, 4).data(), 60, 60, PNG_FORMAT_RGB);
  REQUIRE(heavy.size() > 6000);
  REQUIRE(big.size() < 6000);
  const test::bytes gif = {'G', 'I', 'F', '8', '9', 'a', 1, 0, 1, 0, 0, 0, 0};
  const test::bytes text = {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd', '!'};
  const std::string url_param = "messages[0].content[1].image_url.url";
  struct image_case {
    const char* name;
    json body;
    std::string param, message;
  };
  auto with_url = [&](const std::string& url) { return image_chat(url, 4); };
  json three = image_chat(png_url(small), 4);
  for (int i = 0; i < 2; ++i)
    three["messages"][0]["content"].push_back({{"type", "image_url"}, {"image_url", {{"url", png_url(small)}}}});
  json placeholder = image_chat(png_url(small), 4);
  placeholder["messages"][0]["content"][0]["text"] = "look: <image>";
  json no_url = image_chat(png_url(small), 4);
  no_url["messages"][0]["content"][1]["image_url"] = json::object();
  json bad_detail = image_chat(png_url(small), 4);
  bad_detail["messages"][0]["content"][1]["image_url"]["detail"] = "ultra";
  json bad_type = image_chat(png_url(small), 4);
  bad_type["messages"][0]["content"][1] = {{"type", "input_audio"}, {"input_audio", {{"data", "AAAA"}}}};
  const std::vector<image_case> cases = {
    {"remote https URL", with_url("https://example.com/cat.png"), url_param, "data URL"},
    {"remote http URL", with_url("http://10.0.0.1/cat.jpg"), url_param, "data URL"},
    {"not a URL", with_url("cat.png"), url_param, "not a data URL"},
    {"data URL without base64", with_url("data:image/png,abcd"), url_param, "base64"},
    {"bad base64 character", with_url("data:image/png;base64,iVBO*w0KGgo="), url_param, "'*'"},
    {"bad base64 length", with_url("data:image/png;base64,iVBORw0KGgoAA"), url_param, "base64"},
    {"not an image", with_url(png_url(text)), url_param, "image 1: "},
    {"truncated PNG", with_url(png_url(test::bytes(small.begin(), small.begin() + small.size() / 2))), url_param,
     "truncated"},
    {"GIF bytes", with_url(png_url(gif)), url_param, "GIF"},
    {"WebP media type", with_url("data:image/webp;base64,UklGRg=="), url_param, "webp"},
    {"over the pixel limit", with_url(png_url(big)), url_param, "12000 pixels"},
    {"over the byte limit", with_url(png_url(heavy)), url_param, "6000"},
    {"three images, limit two", three, "messages[0].content[4]", "too many images: at most 2"},
    {"placeholder text in a text part", placeholder, "messages[0].content[0].text", "image placeholder"},
    {"image_url without url", no_url, url_param, "image_url"},
    {"unknown detail", bad_detail, "messages[0].content[1].image_url.detail", "'auto', 'low' or 'high'"},
    {"unknown part type", bad_type, "messages[0].content[1]", "only parts"},
  };
  REQUIRE(cases.size() >= 10);
  for (const auto& ic : cases) {
    INFO("case: " << std::string(ic.name));
    auto r = post(port, "/v1/chat/completions", ic.body);
    check_error(r, 400, "invalid_request_error", ic.param);
    json j = json::parse(r.body, nullptr, false);
    const std::string msg = j.is_object() ? j["error"].value("message", "") : "";
    CHECK_MESSAGE(msg.find(ic.message) != std::string::npos, msg);
  }
  CHECK(c.in_flight(c.gateways[0]) == 0);
  auto ok = post(port, "/v1/chat/completions", image_chat(png_url(small), 4));
  CHECK(ok.status == 200);
  CHECK(c.stats(0).engine.images_encoded == 1);  // nothing of the refused requests reached the engine
}
