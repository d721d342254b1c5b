// The vision loopback cluster as `shoal up` starts it from the sample config/local-vision/
// (gateway + 2 vision-encoder workers + a prefill and a decode engine node; rows and handoffs
// over libfabric tcp;ofi_rxm on loopback; the test only rewrites ports, the model path and the
// cache sizes) on a v3-tiny checkpoint with a vision encoder: an image chat request's greedy
// output equals the colocated engine's with in-process vision, the image was encoded by a
// worker and its rows read by the prefill engine (which encoded nothing). Then a worker is
// stopped and killed with jobs queued on it: the VE balancer places them on the other worker
// and every request completes with its exact text.
#include <doctest/doctest.h>

#include <csignal>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <png.h>
#include <nlohmann/json.hpp>

#include "actors/http_client.hpp"
#include "model/generate.hpp"
#include "runtime/serve/chat_template.hpp"
#include "runtime/engine/engine_setup.hpp"
#include "runtime/serve/openai_api.hpp"
#include "tests/support/cluster.hpp"
#include "tests/support/image_files.hpp"
#include "tools/shoald/engine_options.hpp"

using namespace shoal;
using namespace std::chrono_literals;
using nlohmann::json;
using test::read_text;
using test::temp_dir;
using test::write_text;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> node_files = {"gateway", "ve-a", "ve-b", "prefill", "decode"};

test::bytes noise_rgb(int w, int h, uint32_t seed) {
  test::bytes px(static_cast<size_t>(w * h * 3));
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : px) b = static_cast<uint8_t>((x = x * 1664525u + 1013904223u) >> 24);
  return px;
}

json image_chat(const test::bytes& png, int32_t max_tokens) {
  const std::string url = "data:image/png;base64," + test::base64(png);
  return {{"model", "model"},
          {"messages", json::array({{{"role", "user"},
                                     {"content", json::array({{{"type", "text"}, {"text", "Describe "}},
                                                              {{"type", "image_url"}, {"image_url", {{"url", url}}}},
                                                              {{"type", "text"}, {"text", " briefly."}}})}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"ignore_eos", true}};
}

struct vision_cluster : test::cli_cluster {
  std::map<std::string, uint16_t> ports;
  uint16_t http_port = 0;
  std::optional<runtime::loaded_model> model;

  explicit vision_cluster(uint64_t seed) {
    model = test::generated_model(model_dir, "v3-tiny", seed, true);
    http_port = test::free_port();
    for (const auto& n : node_files) ports[n] = test::free_port();
    shell_port = ports["gateway"];
    const fs::path samples = fs::path(SHOAL_SOURCE_DIR) / "config" / "local-vision";
    for (size_t i = 0; i < node_files.size(); ++i) {
      std::string text = read_text(samples / (node_files[i] + ".toml"));
      REQUIRE(!text.empty());
      for (size_t j = 0; j < node_files.size(); ++j)
        text = std::regex_replace(text, std::regex("127\\.0\\.0\\.1:740" + std::to_string(j)),
                                  "127.0.0.1:" + std::to_string(ports[node_files[j]]));
      text = std::regex_replace(text, std::regex("127\\.0\\.0\\.1:8020"), "127.0.0.1:" + std::to_string(http_port));
      text = std::regex_replace(text, std::regex("\\.\\./\\.\\./models/small-vision"), model_dir.string());
      text = std::regex_replace(text, std::regex("cache_mib = 256"), "cache_mib = 64");
      text = std::regex_replace(text, std::regex("connection_timeout_ms = 3000"), "connection_timeout_ms = 2000");
      write_text(config_dir / (node_files[i] + ".toml"), text);
    }
  }

  std::expected<actors::http_response, std::string> post(const json& body) const {
    return actors::http_call("127.0.0.1", http_port, "POST", "/v1/chat/completions", body.dump(), {});
  }

  // The colocated engine with in-process vision: the body parsed, rendered and expanded as
  // the gateway does it, then run on one engine (role both, the daemon's config).
  std::string colocated(const json& body, int32_t max_tokens) const {
    const model::model_config& c = model->weights->config;
    runtime::api_limits limits;
    limits.model_ids = {"model"};
    limits.image_token = model->tokenizer->decode_token(static_cast<int32_t>(c.vision.image_token_id));
    limits.image_side = c.vision.image_size;
    limits.image_patch = c.vision.patch_size;
    auto parsed = runtime::parse_completion_request(body.dump(), true, limits);
    REQUIRE(parsed);
    auto t = runtime::load_chat_template(model_dir / "tokenizer_config.json");
    REQUIRE(t);
    auto text = t->tmpl.render(parsed->messages, true, t->bos_token, t->eos_token);
    REQUIRE(text);
    auto ids = runtime::expand_image_tokens(model->tokenizer->encode(*text), static_cast<int32_t>(c.vision.image_token_id),
                                            parsed->images);
    REQUIRE(ids);
    runtime::engine local(model->weights, tools::shoald::engine_config_for(c));
    runtime::sampling_params p;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    auto id = local.add_request(*ids, p, runtime::traffic_class::chat, parsed->images);
    REQUIRE_MESSAGE(id, (id ? "" : id.error().message));
    auto done = local.run_to_completion();
    REQUIRE(done.size() == 1);
    return test::as_json_text(model->tokenizer->decode(done[0].output));
  }


  // "KEY=N" after `prefix` in `text` (0 when the line or the key is absent).
  static int64_t number(const std::string& text, const std::string& prefix, const std::string& key) {
    std::smatch m;
    if (!std::regex_search(text, m, std::regex(prefix + "[^\n]* " + key + "=(\\d+)"))) return 0;
    return std::stoll(m[1]);
  }
};

}  // namespace

TEST_CASE("vision cluster: an image chat through a VE worker equals the colocated engine, a killed worker's jobs are re-placed") {
  vision_cluster c(31);
  c.start();
  const int32_t n = 10;

  // One image chat request: the worker encodes, the prefill engine reads the rows.
  const json body = image_chat(test::write_png(noise_rgb(40, 30, 1).data(), 40, 30, PNG_FORMAT_RGB), n);
  const std::string want = c.colocated(body, n);
  auto r = c.post(body);
  REQUIRE(r);
  REQUIRE_MESSAGE(r->status == 200, r->body);
  CHECK(json::parse(r->body)["choices"][0]["message"]["content"] == want);
  std::string ve = c.shell("ve");
  MESSAGE(ve);
  CHECK(vision_cluster::number(ve, "ve-a/ve_worker:", "images_encoded") +
          vision_cluster::number(ve, "ve-b/ve_worker:", "images_encoded") == 1);
  const std::string prefill = c.shell("stats prefill/rank0");
  CHECK(vision_cluster::number(prefill, "rank0:", "image_rows_read") == 1);
  CHECK(vision_cluster::number(prefill, "rank0:", "images_encoded") == 0);
  CHECK(vision_cluster::number(prefill, "rank0:", "image_row_read_failures") == 0);

  // ve-a stops with jobs placed on it, then dies: the balancer places them on ve-b.
  const int requests = 8;
  std::vector<json> bodies;
  std::vector<std::string> expected;
  for (int i = 0; i < requests; ++i) {
    bodies.push_back(image_chat(test::write_png(noise_rgb(56, 42, 100 + i).data(), 56, 42, PNG_FORMAT_RGB), n));
    expected.push_back(c.colocated(bodies.back(), n));
  }
  auto pids = test::cluster_pids(c.state_dir);
  REQUIRE(pids.contains("ve-a"));
  REQUIRE(kill(pids["ve-a"], SIGSTOP) == 0);
  std::vector<std::string> got(requests);
  std::vector<int> status(requests, 0);
  std::vector<std::thread> clients;
  for (int i = 0; i < requests; ++i)
    clients.emplace_back([&, i] {
      auto a = c.post(bodies[static_cast<size_t>(i)]);
      if (!a) return;
      status[static_cast<size_t>(i)] = a->status;
      got[static_cast<size_t>(i)] = a->status == 200 ? json::parse(a->body)["choices"][0]["message"]["content"].get<std::string>()
                                                     : a->body;
    });
  std::this_thread::sleep_for(500ms);  // the requests are in: some wait on the stopped worker
  const std::string during = c.shell("ve");
  MESSAGE(during);
  CHECK(kill(pids["ve-a"], SIGKILL) == 0);  // CHECK, not REQUIRE: the clients still run
  for (auto& t : clients) t.join();
  for (int i = 0; i < requests; ++i) {
    CAPTURE(i);
    CHECK(status[static_cast<size_t>(i)] == 200);
    CHECK(got[static_cast<size_t>(i)] == expected[static_cast<size_t>(i)]);
  }
  ve = c.shell("ve");
  MESSAGE(ve);
  CHECK(vision_cluster::number(during, "  ve-a:", "jobs") >= 1);  // ve-a held jobs when it was killed
  CHECK(vision_cluster::number(ve, "gateway/ve_balancer:", "placed_again") >= 1);
  CHECK(ve.find("ve-a") == std::string::npos);  // gone from the pool
  CHECK(vision_cluster::number(ve, "ve-b/ve_worker:", "images_encoded") >= requests - 1);
}
