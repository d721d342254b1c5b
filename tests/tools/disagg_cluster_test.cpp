// The disaggregated loopback cluster as `shoal up` starts it from the sample
// config/local-disagg/ (gateway + 2 prefill + 2 decode engine nodes, handoffs over libfabric
// tcp;ofi_rxm on loopback; the test only rewrites ports, the model path and the cache size): greedy completions
// and chat, streamed and not, equal the colocated engine's for deepseek_v3 and for
// shoal_flash in exact SWA mode (deepseek_v3 with cost-model chunked prefill on the prefill
// engines), every request went through a handoff, and usage
// cached_tokens matches the colocated engine's on a repeated prompt. Then kill -9 of a
// decode node under 50 concurrent streams: every stream is accounted for, with its exact
// text. Then kill -9 of a prefill node mid-prompt under 50 streams: its unfinished prompts
// are re-routed to the other prefill engine, every stream ends with its exact text.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/http_client.hpp"
#include "runtime/serve/chat_template.hpp"
#include "runtime/core/cost_model.hpp"
#include "runtime/engine/engine_setup.hpp"
#include "tests/support/cluster.hpp"
#include "tools/shoald/engine_options.hpp"

using namespace shoal;
using namespace std::chrono_literals;
using nlohmann::json;
using test::completion_body;
using test::read_text;
using test::stream_text;
using test::temp_dir;
using test::write_text;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> node_files = {"gateway", "prefill-a", "prefill-b", "decode-a", "decode-b"};

struct disagg_cluster : test::cli_cluster {
  std::map<std::string, uint16_t> ports;  // node name → node.listen port
  uint16_t http_port = 0;
  std::optional<runtime::loaded_model> model;

  // `preset` generated with `seed`; `exact`: the checkpoint's swa_mode set to "exact";
  // `chunked`: the prefill engines get a cost model (1 ms per token) and a 20 ms step budget,
  // so prompts are computed in chunks of about 19 tokens before the handoff.
  // `gateway_keys`: lines added to the gateway's [gateway] section (balancer policies).
  // `engine_keys`: lines added to a node's [engine] section, by node name.
  disagg_cluster(const std::string& preset, uint64_t seed, bool exact, bool chunked = false,
                 const std::string& gateway_keys = "", const std::map<std::string, std::string>& engine_keys = {}) {
    model = test::generated_model(model_dir, preset, seed);
    if (exact) {
      json c = json::parse(read_text(model_dir / "config.json"));
      c["swa_mode"] = "exact";
      write_text(model_dir / "config.json", c.dump(2));
      auto m = runtime::load_model_dir(model_dir.string(), false);
      REQUIRE(m);
      REQUIRE(m->weights->config.swa_mode == "exact");
      model = std::move(*m);
    }
    http_port = test::free_port();
    for (size_t i = 0; i < node_files.size(); ++i) ports[node_files[i]] = test::free_port();
    // The samples as shipped, with this test's ports, model and a smaller cache.
    const fs::path samples = fs::path(SHOAL_SOURCE_DIR) / "config" / "local-disagg";
    for (size_t i = 0; i < node_files.size(); ++i) {
      std::string text = read_text(samples / (node_files[i] + ".toml"));
      REQUIRE(!text.empty());
      for (size_t j = 0; j < node_files.size(); ++j)
        text = std::regex_replace(text, std::regex("127\\.0\\.0\\.1:720" + std::to_string(j)),
                                  "127.0.0.1:" + std::to_string(ports[node_files[j]]));
      text = std::regex_replace(text, std::regex("127\\.0\\.0\\.1:8000"), "127.0.0.1:" + std::to_string(http_port));
      text = std::regex_replace(text, std::regex("\\.\\./\\.\\./models/small"), model_dir.string());
      text = std::regex_replace(text, std::regex("cache_mib = 256"), "cache_mib = 64");
      text = std::regex_replace(text, std::regex("connection_timeout_ms = 3000"), "connection_timeout_ms = 2000");
      if (chunked && text.find("role = \"prefill\"") != std::string::npos) {
        write_text(dir.path / "cost.json", runtime::cost_model(0.001, 0.001, 0, 0).to_json());
        text = std::regex_replace(text, std::regex("role = \"prefill\""),
                                  "role = \"prefill\"\ncost_model = \"" + (dir.path / "cost.json").string() +
                                    "\"\nstep_ms = 20");
      }
      if (!gateway_keys.empty()) {  // the sample's policy lines give way to the test's
        text = std::regex_replace(text, std::regex("\n(prefill_policy|decode_policy) = [^\n]*"), "");
        text = std::regex_replace(text, std::regex("\n\\[gateway\\]\n"), "\n[gateway]\n" + gateway_keys);
      }
      if (auto k = engine_keys.find(node_files[i]); k != engine_keys.end())
        text = std::regex_replace(text, std::regex("\n\\[engine\\]\n"), "\n[engine]\n" + k->second);
      write_text(config_dir / (node_files[i] + ".toml"), text);
    }
  }

  std::expected<actors::http_response, std::string> post(const std::string& path, const json& body,
                                                         actors::http_call_options opts = {}) const {
    return actors::http_call("127.0.0.1", http_port, "POST", path, body.dump(), opts);
  }

  // The colocated engine (role both, the daemon's config): greedy texts and cached tokens of
  // `prompts` run one after the other (the prefix cache carries over, as on one engine).
  std::vector<std::pair<std::string, int64_t>> colocated(const std::vector<std::vector<int32_t>>& prompts,
                                                         int32_t max_tokens,
                                                         model::kv_dtype kv = model::kv_dtype::bf16) const {
    runtime::engine local(model->weights,
                          tools::shoald::engine_config_for(model->weights->config, tools::shoald::default_cache_mib, kv));
    runtime::sampling_params p;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    std::vector<std::pair<std::string, int64_t>> out;
    for (const auto& prompt : prompts) {
      auto id = local.add_request(prompt, p);
      REQUIRE_MESSAGE(id, (id ? "" : id.error().message));
      auto done = local.run_to_completion();
      REQUIRE(done.size() == 1);
      out.emplace_back(test::as_json_text(model->tokenizer->decode(done[0].output)), done[0].cached_tokens);
    }
    return out;
  }

  // `shoal shell -c balancers`.
  std::string balancers() {
    std::string out;
    int rc = shoal({"shell", "--connect=127.0.0.1:" + std::to_string(ports["gateway"]), "-c", "balancers"}, out);
    REQUIRE_MESSAGE(rc == 0, out);
    return out;
  }

  // "placed=N" of engine `name` ("prefill-a/0") in the balancers' report; −1 when not listed.
  static int64_t placed(const std::string& report, const std::string& name) {
    std::smatch m;
    if (!std::regex_search(report, m, std::regex("  " + name + ": [^\n]*placed=(\\d+)"))) return -1;
    return std::stoll(m[1]);
  }

  // A number from `shoal shell -c "stats NODE/rank0"`: the value after "KEY=".
  int64_t stat(const std::string& node, const std::string& key) {
    std::string out;
    int rc = shoal({"shell", "--connect=127.0.0.1:" + std::to_string(ports["gateway"]), "-c", "stats " + node + "/rank0"},
                   out);
    REQUIRE_MESSAGE(rc == 0, out);
    std::smatch m;
    REQUIRE_MESSAGE(std::regex_search(out, m, std::regex(" " + key + "=(\\d+)")), out);
    return std::stoll(m[1]);
  }
};

}  // namespace

TEST_CASE("disaggregated cluster: 2 prefill + 2 decode nodes equal the colocated engine (deepseek_v3, shoal_flash exact)") {
  for (const auto& [preset, exact] : std::vector<std::pair<std::string, bool>>{{"v3-tiny", false}, {"tiny", true}}) {
    CAPTURE(preset);
    disagg_cluster c(preset, 21, exact, /*chunked=*/preset == "v3-tiny");
    c.start();
    // A fresh cluster: nothing cached yet. The long prompt is sent once to warm the one
    // prefill engine it lands on (the router breaks ties by membership order, so an idle
    // cluster sends consecutive requests to the same prefill engine).
    auto post = [&](const std::string& path, const json& body) { return c.post(path, body); };
    auto expected = [&](const std::vector<int32_t>& ids, int32_t n) { return c.colocated({ids}, n)[0].first; };
    const int sent = test::check_api_forms(post, *c.model->tokenizer, c.model_dir, 12, expected,
                                           {"The quick brown fox", "jumps over the lazy dog, twice and again and once more",
                                            "a"},
                                           "hello there, how are you");

    // Every request was computed on a prefill engine and decoded on a decode engine.
    const int64_t offered = c.stat("prefill-a", "handoffs_offered") + c.stat("prefill-b", "handoffs_offered");
    const int64_t placed = c.stat("prefill-a", "handoffs_placed") + c.stat("prefill-b", "handoffs_placed");
    const int64_t taken = c.stat("decode-a", "handoffs_taken") + c.stat("decode-b", "handoffs_taken");
    CHECK(offered == sent);
    CHECK(placed == sent);
    CHECK(taken == sent);
    CHECK(c.stat("decode-a", "handoff_failures") + c.stat("decode-b", "handoff_failures") == 0);
    CHECK(c.stat("prefill-a", "handoffs_kept") + c.stat("prefill-b", "handoffs_kept") == 0);
    CHECK(c.stat("decode-a", "blocks_free") > 0);
    // One prefill step per request (prompt and first token at once), or several with the cost
    // model's 20 ms budget (about 19 tokens a chunk).
    const int64_t prefill_steps = c.stat("prefill-a", "steps") + c.stat("prefill-b", "steps");
    if (preset == "v3-tiny") CHECK(prefill_steps > sent);
    else CHECK(prefill_steps == sent);

    // usage.cached_tokens: a prompt of several blocks, then a longer one that extends it (a
    // conversation's next turn: in exact SWA mode a hit must end at a window snapshot and
    // before the decoder tail, so a repeated prompt alone would hit nothing) report what the
    // colocated engine reports for the same two requests (0, then the shared prefix).
    std::string first, second;
    for (int i = 0; i < 5; ++i) first += "block number " + std::to_string(i) + " of the shared prefix; ";
    second = first;
    for (int i = 0; i < 4; ++i) second += "and the next turn adds sentence " + std::to_string(i) + "; ";
    const std::vector<std::string> turns = {first, second};
    auto ref = c.colocated({runtime::encode_prompt(*c.model->tokenizer, first),
                            runtime::encode_prompt(*c.model->tokenizer, second)},
                           6);
    REQUIRE(ref[0].second == 0);
    REQUIRE(ref[1].second > 0);
    for (int k = 0; k < 2; ++k) {
      CAPTURE(k);
      auto r = c.post("/v1/completions", completion_body(turns[static_cast<size_t>(k)], 6, false));
      REQUIRE(r);
      REQUIRE_MESSAGE(r->status == 200, r->body);
      json j = json::parse(r->body);
      CHECK(j["choices"][0]["text"] == ref[static_cast<size_t>(k)].first);
      CHECK(j["usage"]["prompt_tokens_details"]["cached_tokens"] == ref[static_cast<size_t>(k)].second);
    }
  }
}

TEST_CASE("disaggregated cluster: one request id from the gateway through prefill, handoff and decode") {
  disagg_cluster c("tiny", 31, false);
  c.start();
  auto shell = [&](const std::string& command) {
    std::string out;
    const int rc = c.shoal({"shell", "--state-dir", c.state_dir.string(), "-c", command}, out);
    CHECK_MESSAGE(rc == 0, out);
    return out;
  };
  // Requests enough (and long enough) to be seen in flight on a fast machine.
  const int clients = 24;
  std::vector<std::expected<actors::http_response, std::string>> responses(clients);
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i)
    threads.emplace_back([&, i] {
      responses[static_cast<size_t>(i)] =
        c.post("/v1/completions", completion_body("follow request " + std::to_string(i), 400, false));
    });
  // The gateway lists one by its id ("request <16 hex> completion ..."); the decode engine
  // that took its handoff shows the same id among the requests it runs.
  const std::regex listed("gateway: request ([0-9a-f]{16}) completion");
  std::string id, decoding_on;
  for (int tries = 0; tries < 400 && decoding_on.empty(); ++tries) {
    std::smatch m;
    const std::string requests = shell("requests");
    if (id.empty() && std::regex_search(requests, m, listed)) id = m[1];
    if (!id.empty())
      for (const char* node : {"decode-a", "decode-b"})
        if (shell(std::string("stats ") + node + "/rank0").find(id) != std::string::npos) decoding_on = node;
    if (decoding_on.empty()) std::this_thread::sleep_for(10ms);
  }
  for (auto& t : threads) t.join();
  REQUIRE_MESSAGE(!id.empty(), "the gateway never listed a request");
  CHECK_MESSAGE(!decoding_on.empty(), "no decode engine listed request " << id);
  // One client's response carries that id.
  int answered = 0;
  for (const auto& r : responses) {
    REQUIRE(r);
    REQUIRE_MESSAGE(r->status == 200, r->body);
    answered += json::parse(r->body)["id"] == "cmpl-" + id;
  }
  CHECK(answered == 1);
  // Once it finished: exactly one prefill engine lent it (handed_off), exactly one decode
  // engine (the one seen running it) finished it at its length, both by the same id.
  int lent = 0, finished = 0;
  for (const char* node : {"prefill-a", "prefill-b"}) lent += shell(std::string("stats ") + node + "/rank0").find(id + ":handed_off") != std::string::npos;
  for (const char* node : {"decode-a", "decode-b"}) {
    const bool here = shell(std::string("stats ") + node + "/rank0").find(id + ":length") != std::string::npos;
    finished += here;
    if (here) CHECK(node == decoding_on);
  }
  CHECK(lent == 1);
  CHECK(finished == 1);
  // The gateway node's log names it with its outcome (written once the response left, so
  // it may trail the client by a moment).
  const std::string line = "request " + id + " completion status=200";
  std::string log = read_text(c.state_dir / "gateway.log");
  for (int tries = 0; tries < 200 && log.find(line) == std::string::npos; ++tries) {
    std::this_thread::sleep_for(25ms);
    log = read_text(c.state_dir / "gateway.log");
  }
  CHECK_MESSAGE(log.find(line) != std::string::npos, log);
}

TEST_CASE("disaggregated cluster: kill -9 of a decode node under 50 streams, every stream completes exactly") {
  disagg_cluster c("tiny", 23, true);
  c.start();
  const int streams = 50;
  const int32_t n = 400;  // long enough that the kill lands mid-stream, also on a loaded machine
  std::vector<std::string> prompts;
  std::vector<std::string> expected;
  for (int i = 0; i < streams; ++i) {
    prompts.push_back("request number " + std::to_string(i) + " says");
    expected.push_back(c.colocated({runtime::encode_prompt(*c.model->tokenizer, prompts.back())}, n)[0].first);
  }

  // Kill decode-b once every stream is decoding (4 events: the role chunk, token 1 from a
  // prefill engine, then a decode engine's), half of them there.
  auto pids = test::cluster_pids(c.state_dir);
  REQUIRE(pids.contains("decode-b"));
  auto post = [&](const std::string& path, const json& body, actors::http_call_options o) { return c.post(path, body, o); };
  auto got = test::streams_with_kill(post, prompts, n, 4, pids["decode-b"]);
  // The kill hit requests in flight: those decode-b held were recomputed from their prompt
  // on a prefill engine and handed off again (to decode-a), so more than 50 were offered.
  const int64_t offered = c.stat("prefill-a", "handoffs_offered") + c.stat("prefill-b", "handoffs_offered");
  MESSAGE("50 streams in " << got.seconds << " s, decode-b killed at " << got.kill_at_s << " s; " << offered
                           << " handoffs offered for 50 requests");
  CHECK(offered > streams);

  int completed = 0;
  for (int i = 0; i < streams; ++i) {
    CAPTURE(i);
    CHECK(got.done[i]);  // ended with [DONE], nothing hung
    if (got.errors[i].empty() && got.texts[i] == expected[i]) ++completed;
    else MESSAGE("stream " << i << ": " << (got.errors[i].empty() ? "text differs" : got.errors[i]));
  }
  // Re-routed requests are recomputed (same seed) and their streamed tokens skipped: all 50
  // finish with the colocated engine's text.
  CHECK(completed == streams);

  // The survivor decodes new requests; the gateway no longer lists decode-b.
  auto r = c.post("/v1/completions", completion_body(prompts[0], n, false));
  REQUIRE(r);
  CHECK_MESSAGE(r->status == 200, r->body);
  if (r->status == 200) CHECK(json::parse(r->body)["choices"][0]["text"] == expected[0]);
  std::string out;
  CHECK(c.shoal({"shell", "--connect=127.0.0.1:" + std::to_string(c.ports["gateway"]), "-c", "nodes"}, out) == 0);
  CHECK(out.find("decode-b") == std::string::npos);
  // The decode balancer dropped decode-b; decode-a took its re-placed requests and the new one.
  const std::string report = c.balancers();
  MESSAGE(report);
  CHECK(disagg_cluster::placed(report, "decode-b/0") == -1);
  CHECK(disagg_cluster::placed(report, "decode-a/0") > streams / 2);
}

TEST_CASE("disaggregated cluster: engines of two KV formats, a handoff of another format is refused and counted, every request ends with its prefill engine's text") {
  // prefill-a and decode-b hold bf16 caches, prefill-b and decode-a fp32; round-robin
  // placement offers some bf16 handoffs to decode-a first.
  disagg_cluster c("tiny", 37, false, false, "prefill_policy = \"round_robin\"\ndecode_policy = \"round_robin\"\n",
                   {{"prefill-b", "kv_dtype = \"fp32\"\n"}, {"decode-a", "kv_dtype = \"fp32\"\n"}});
  c.start();
  std::vector<std::string> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back("a request in two formats, number " + std::to_string(i));
  std::vector<std::string> ids, texts;
  for (const auto& p : prompts) {
    auto r = c.post("/v1/completions", completion_body(p, 10, false));
    REQUIRE(r);
    REQUIRE_MESSAGE(r->status == 200, r->body);
    json j = json::parse(r->body);
    ids.push_back(j["id"].get<std::string>().substr(5));  // "cmpl-" + the request id
    texts.push_back(j["choices"][0]["text"].get<std::string>());
  }
  auto stats_of = [&](const char* node) {
    std::string out;
    REQUIRE(c.shoal({"shell", "--connect=127.0.0.1:" + std::to_string(c.ports["gateway"]), "-c",
                     std::string("stats ") + node + "/rank0"}, out) == 0);
    return out;
  };
  const std::string pa = stats_of("prefill-a"), pb = stats_of("prefill-b");
  for (size_t i = 0; i < prompts.size(); ++i) {
    CAPTURE(i);
    const bool on_a = pa.find(ids[i] + ":") != std::string::npos, on_b = pb.find(ids[i] + ":") != std::string::npos;
    REQUIRE_MESSAGE(on_a != on_b, "request " << ids[i] << " not listed by exactly one prefill engine");
    const auto kv = on_a ? model::kv_dtype::bf16 : model::kv_dtype::fp32;
    const std::string want =
      c.colocated({runtime::encode_prompt(*c.model->tokenizer, prompts[i])}, 10, kv)[0].first;
    CHECK(texts[i] == want);
  }
  // Every handoff ended on a decode engine of its own format: refusals are counted, none failed.
  const int64_t refused = c.stat("decode-a", "handoffs_refused_format") + c.stat("decode-b", "handoffs_refused_format");
  CHECK(refused >= 1);
  CHECK(c.stat("decode-a", "handoff_failures") + c.stat("decode-b", "handoff_failures") == 0);
  CHECK(c.stat("decode-a", "handoffs_taken") + c.stat("decode-b", "handoffs_taken") +
          c.stat("prefill-a", "handoffs_kept") + c.stat("prefill-b", "handoffs_kept") ==
        static_cast<int64_t>(prompts.size()));
}

TEST_CASE("disaggregated cluster: requests land where the balancers' policies say (shell balancers)") {
  SUBCASE("round-robin prefill and decode: in turn") {
    disagg_cluster c("tiny", 29, false, false, "prefill_policy = \"round_robin\"\ndecode_policy = \"round_robin\"\n");
    c.start();
    for (int i = 0; i < 8; ++i) {
      auto r = c.post("/v1/completions", completion_body("round robin request " + std::to_string(i), 4, false));
      REQUIRE(r);
      REQUIRE_MESSAGE(r->status == 200, r->body);
    }
    const std::string report = c.balancers();
    MESSAGE(report);
    CHECK(report.find("prefill_balancer: policy=round_robin") != std::string::npos);
    CHECK(report.find("decode_balancer: policy=round_robin") != std::string::npos);
    for (const char* e : {"prefill-a/0", "prefill-b/0", "decode-a/0", "decode-b/0"}) CHECK(disagg_cluster::placed(report, e) == 4);
    // The shell without --connect finds the cluster that `shoal up` recorded in its state directory
    // (the sample listens on 72xx, not the shell's fallback 127.0.0.1:7100).
    std::string nodes;
    REQUIRE_MESSAGE(c.shoal({"shell", "--state-dir", c.state_dir.string(), "-c", "nodes"}, nodes) == 0, nodes);
    for (const char* n : {"gateway", "prefill-a", "prefill-b", "decode-a", "decode-b"})
      CHECK_MESSAGE(nodes.find(n) != std::string::npos, n << " missing from: " << nodes);
  }
  SUBCASE("tiered prefill: a repeated prompt stays on the engine that holds its prefix and hits its cache") {
    disagg_cluster c("tiny", 29, false);
    c.start();
    std::string prompt = "a shared system prompt that spans several cache blocks of the tiny preset,";
    for (int i = 0; i < 4; ++i) prompt += " and then some more words to make it longer";
    auto first = c.post("/v1/completions", completion_body(prompt, 4, false));
    REQUIRE(first);
    REQUIRE_MESSAGE(first->status == 200, first->body);
    auto again = c.post("/v1/completions", completion_body(prompt, 4, false));
    REQUIRE(again);
    REQUIRE_MESSAGE(again->status == 200, again->body);
    const std::string report = c.balancers();
    MESSAGE(report);
    CHECK(report.find("prefill_balancer: policy=tiered") != std::string::npos);
    const int64_t a = disagg_cluster::placed(report, "prefill-a/0"), b = disagg_cluster::placed(report, "prefill-b/0");
    CHECK(a + b == 2);
    CHECK(std::max(a, b) == 2);  // both on one engine (that locality beats a lower id: runtime balancer_test)
    CHECK(json::parse(again->body)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>() > 0);
    CHECK(report.find("decode_balancer: policy=decode_balancer") != std::string::npos);
  }
}

TEST_CASE("disaggregated cluster: kill -9 of a prefill node mid-prompt under 50 streams, every stream completes exactly") {
  // deepseek_v3 with cost-model chunks (about 19 tokens a 20 ms step) and long prompts, so the
  // kill lands while prefill-a is still computing most of its prompts.
  disagg_cluster c("v3-tiny", 25, false, /*chunked=*/true);
  c.start();
  const int streams = 50;
  const int32_t n = 16;
  std::vector<std::string> prompts;
  std::vector<std::string> expected;
  for (int i = 0; i < streams; ++i) {
    std::string p = "request number " + std::to_string(i) + " asks:";
    while (p.size() < 400) p += " and then some more words about item " + std::to_string(i);
    prompts.push_back(p);
    expected.push_back(c.colocated({runtime::encode_prompt(*c.model->tokenizer, p)}, n)[0].first);
  }
  auto pids = test::cluster_pids(c.state_dir);
  REQUIRE(pids.contains("prefill-a"));
  auto post = [&](const std::string& path, const json& body, actors::http_call_options o) { return c.post(path, body, o); };
  // Killed 300 ms in, mid-prompt: all 50 prompts of 400 bytes take about 1.6 s on the faster
  // instances of this machine kind (an Ice Lake Xeon; at 120 bytes they took 0.56 s there, and
  // the kill came after prefill-a had handed off all its prompts) and about 5 s on the slower.
  auto got = test::streams_with_kill(post, prompts, n, 0, pids["prefill-a"], 300ms);
  // prefill-a's unfinished prompts were re-routed to prefill-b: it offered more than its half.
  const int64_t offered_b = c.stat("prefill-b", "handoffs_offered");
  MESSAGE("50 streams in " << got.seconds << " s, prefill-a killed at " << got.kill_at_s << " s; prefill-b offered "
                           << offered_b << " handoffs");
  CHECK(offered_b > streams / 2);
  int completed = 0;
  for (int i = 0; i < streams; ++i) {
    CAPTURE(i);
    CHECK(got.done[i]);
    if (got.errors[i].empty() && got.texts[i] == expected[i]) ++completed;
    else MESSAGE("stream " << i << ": " << (got.errors[i].empty() ? "text differs" : got.errors[i]));
  }
  CHECK(completed == streams);
}
