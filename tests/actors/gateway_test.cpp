// The gateway end to end: an in-process cluster (detached engines over a tiny checkpoint written
// to a temp dir, balancers fed a hand-made membership, the gateway on a loopback port) driven
// over real HTTP with http_call. Bad input gets its exact OpenAI error and leaves the gateway
// serving; good requests stream the same greedy tokens as a plain runtime::engine; a client
// leaving cancels its generation; an engine killed mid-stream is replaced without a visible
// seam; drain refuses new requests. Every wait is bounded. The harness is gateway_harness.hpp;
// image chat is in gateway_images_test.cpp.
#include <doctest/doctest.h>

#include <regex>

#include "tests/actors/gateway_harness.hpp"

using namespace shoal;
using namespace shoal::test::gateway_harness;
using namespace std::chrono_literals;
using json = nlohmann::json;
namespace fs = std::filesystem;


// -- bad input ---------------------------------------------------------------------------------

TEST_CASE("gateway answers bad input with the exact OpenAI error and keeps serving") {
  cluster c(1);
  auto g = cluster::default_gateway();
  g.context_length = 64;
  g.max_body_bytes = 4096;
  uint16_t port = c.start_gateway(g);

  const std::vector<bad_case> cases = bad_input_cases();
  REQUIRE(cases.size() >= 14);
  for (const auto& bc : cases) {
    INFO("case: " << bc.name);
    auto r = call(port, bc.method, bc.target, bc.body);
    check_error(r, bc.status, bc.type, bc.param, bc.code);
  }

  // Not HTTP at all: the server's own 400, still an OpenAI error body.
  std::string raw = raw_exchange(port, "this is not http at all\r\n\r\n");
  REQUIRE(raw.rfind("HTTP/1.1 400", 0) == 0);
  auto head_end = raw.find("\r\n\r\n");
  REQUIRE(head_end != std::string::npos);
  check_error(400, raw.substr(head_end + 4), 400, "invalid_request_error");

  // The gateway still serves.
  auto ok = post(port, "/v1/completions", completion_body("hello", 8));
  CHECK(ok.status == 200);
  json j = parse(ok.body);
  CHECK(j["usage"]["completion_tokens"] == 8);
  CHECK(c.in_flight(c.gateways[0]) == 0);
}

// -- auth --------------------------------------------------------------------------------------

TEST_CASE("gateway bearer auth guards the API but not health") {
  cluster c(1);
  auto g = cluster::default_gateway();
  g.auth_tokens = {"secret"};
  uint16_t port = c.start_gateway(g);
  auto body = completion_body("auth", 4);
  actors::http_call_options wrong, right;
  wrong.headers["Authorization"] = "Bearer nope";
  right.headers["Authorization"] = "Bearer secret";

  check_error(post(port, "/v1/completions", body), 401, "authentication_error", "", "invalid_api_key");
  check_error(post(port, "/v1/completions", body, wrong), 401, "authentication_error", "", "invalid_api_key");
  check_error(post(port, "/v1/chat/completions",
                   {{"model", "tiny"}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}}),
              401, "authentication_error", "", "invalid_api_key");
  auto ok = post(port, "/v1/completions", body, right);
  CHECK(ok.status == 200);
  CHECK(parse(ok.body)["usage"]["completion_tokens"] == 4);

  check_error(call(port, "GET", "/v1/models"), 401, "authentication_error", "", "invalid_api_key");
  check_error(call(port, "GET", "/v1/models", "", wrong), 401, "authentication_error", "", "invalid_api_key");
  auto models = call(port, "GET", "/v1/models", "", right);
  CHECK(models.status == 200);
  CHECK(parse(models.body)["data"][0]["id"] == "tiny");

  auto health = call(port, "GET", "/health");
  CHECK(health.status == 200);
  CHECK(parse(health.body)["status"] == "ok");
}

// -- good requests -----------------------------------------------------------------------------

TEST_CASE("gateway completions match a plain engine, streamed or not") {
  cluster c(1);
  uint16_t port = c.start_gateway();
  const std::string prompt = "The quick brown fox";
  const int32_t n = 24;
  const auto prompt_ids = runtime::encode_prompt(tok(), prompt);
  const std::string want = as_json_text(tok().decode(reference_tokens(prompt_ids, n)));

  auto r = post(port, "/v1/completions", completion_body(prompt, n));
  REQUIRE(r.status == 200);
  json j = parse(r.body);
  CHECK(j["object"] == "text_completion");
  CHECK(j["model"] == "tiny");
  REQUIRE(j["choices"].size() == 1);
  CHECK(j["choices"][0]["text"] == want);
  CHECK(j["choices"][0]["finish_reason"] == "length");
  CHECK(j["usage"]["prompt_tokens"] == prompt_ids.size());
  CHECK(j["usage"]["completion_tokens"] == n);
  CHECK(j["usage"]["total_tokens"] == prompt_ids.size() + n);

  // The same request streamed: text chunks, the last with finish_reason, then [DONE].
  json sb = completion_body(prompt, n);
  sb["stream"] = true;
  auto s = post(port, "/v1/completions", sb);
  REQUIRE(s.status == 200);
  CHECK(s.headers["content-type"] == "text/event-stream");
  auto chunks = sse_chunks(s.body);
  REQUIRE(chunks.size() >= 2);
  std::string text;
  for (size_t i = 0; i < chunks.size(); ++i) {
    CHECK(chunks[i]["object"] == "text_completion");
    CHECK(chunks[i]["id"] == chunks[0]["id"]);
    text += chunks[i]["choices"][0]["text"].get<std::string>();
    if (i + 1 < chunks.size()) CHECK(chunks[i]["choices"][0]["finish_reason"].is_null());
  }
  CHECK(chunks.back()["choices"][0]["finish_reason"] == "length");
  CHECK(text == want);
  CHECK(text == j["choices"][0]["text"].get<std::string>());

  // Token ids as the prompt: the same tokens (the text prompt's ids, BOS included).
  json ib = completion_body(prompt, n);
  ib["prompt"] = prompt_ids;
  auto ids = post(port, "/v1/completions", ib);
  REQUIRE(ids.status == 200);
  CHECK(parse(ids.body)["choices"][0]["text"] == want);
}

TEST_CASE("gateway chat completions stream role, content, finish and usage chunks") {
  cluster c(1);
  uint16_t port = c.start_gateway();
  const int32_t n = 20;
  std::vector<runtime::chat_message> msgs = {{"system", "Be brief."}, {"user", "Name a colour."}};
  const auto prompt_ids = chat_prompt(msgs);
  const std::string want = as_json_text(tok().decode(reference_tokens(prompt_ids, n)));
  json body = {{"model", "tiny"},
               {"messages", json::array({{{"role", "system"}, {"content", "Be brief."}},
                                         {{"role", "user"}, {"content", "Name a colour."}}})},
               {"max_tokens", n},
               {"temperature", 0},
               {"ignore_eos", true}};

  auto r = post(port, "/v1/chat/completions", body);
  REQUIRE(r.status == 200);
  json j = parse(r.body);
  CHECK(j["object"] == "chat.completion");
  REQUIRE(j["choices"].size() == 1);
  CHECK(j["choices"][0]["message"]["role"] == "assistant");
  CHECK(j["choices"][0]["message"]["content"] == want);
  CHECK(j["choices"][0]["finish_reason"] == "length");
  CHECK(j["usage"]["prompt_tokens"] == prompt_ids.size());
  CHECK(j["usage"]["completion_tokens"] == n);

  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto s = post(port, "/v1/chat/completions", body);
  REQUIRE(s.status == 200);
  auto chunks = sse_chunks(s.body);
  REQUIRE(chunks.size() >= 4);
  for (const auto& ch : chunks) {
    CHECK(ch["object"] == "chat.completion.chunk");
    CHECK(ch["id"] == chunks[0]["id"]);
  }
  // Role chunk first.
  CHECK(chunks[0]["choices"][0]["delta"]["role"] == "assistant");
  CHECK(chunks[0]["choices"][0]["finish_reason"].is_null());
  // Usage chunk last: no choices.
  const json& usage = chunks.back();
  CHECK(usage["choices"].empty());
  CHECK(usage["usage"]["prompt_tokens"] == prompt_ids.size());
  CHECK(usage["usage"]["completion_tokens"] == n);
  // Finish chunk before it: empty delta.
  const json& fin = chunks[chunks.size() - 2];
  CHECK(fin["choices"][0]["finish_reason"] == "length");
  CHECK(!fin["choices"][0]["delta"].contains("content"));
  std::string text;
  for (size_t i = 1; i + 2 < chunks.size(); ++i) {
    CHECK(chunks[i]["choices"][0]["finish_reason"].is_null());
    text += chunks[i]["choices"][0]["delta"]["content"].get<std::string>();
  }
  CHECK(text == want);
}

TEST_CASE("gateway stop string truncates the text with finish reason stop") {
  cluster c(1);
  uint16_t port = c.start_gateway();
  const std::string prompt = "Once upon a time";
  const int32_t n = 48;
  const std::string raw = tok().decode(reference_tokens(runtime::encode_prompt(tok(), prompt), n));
  // A stop string that occurs in the greedy output: two printable ASCII bytes past the start.
  std::string stop;
  for (size_t i = 1; i + 1 < raw.size() && stop.empty(); ++i)
    if (raw[i] >= 0x20 && raw[i] < 0x7f && raw[i + 1] >= 0x20 && raw[i + 1] < 0x7f) stop = raw.substr(i, 2);
  REQUIRE_MESSAGE(!stop.empty(), "no two printable ASCII bytes in the greedy output");
  const std::string want = as_json_text(raw.substr(0, raw.find(stop)));
  INFO("stop = '" << stop << "'");

  json body = completion_body(prompt, n);
  body["stop"] = stop;
  auto r = post(port, "/v1/completions", body);
  REQUIRE(r.status == 200);
  json j = parse(r.body);
  CHECK(j["choices"][0]["text"] == want);
  CHECK(j["choices"][0]["finish_reason"] == "stop");
  CHECK(j["usage"]["completion_tokens"] < n);

  body["stream"] = true;
  auto s = post(port, "/v1/completions", body);
  REQUIRE(s.status == 200);
  auto chunks = sse_chunks(s.body);
  REQUIRE(!chunks.empty());
  std::string text;
  for (const auto& ch : chunks) text += ch["choices"][0]["text"].get<std::string>();
  CHECK(text == want);
  CHECK(chunks.back()["choices"][0]["finish_reason"] == "stop");

  // The request stopped early: its generation is cancelled and its blocks come back.
  auto deadline = std::chrono::steady_clock::now() + wait_timeout;
  actors::engine_stats_snapshot st = c.stats(0);
  while ((st.requests_running != 0 || st.engine.blocks_free != st.engine.blocks_total) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
    st = c.stats(0);
  }
  CHECK(st.requests_running == 0);
  CHECK(st.engine.blocks_free == st.engine.blocks_total);
}

TEST_CASE("gateway logit_bias and penalties reach the engine, a bias outside the vocabulary is a 400") {
  cluster c(1);
  actors::gateway_config g = cluster::default_gateway();
  g.vocab_size = tiny_checkpoint().model.weights->config.vocab_size;
  uint16_t port = c.start_gateway(g);
  const std::string prompt = "Once upon a time";
  const int32_t n = 8;
  const auto z = tok().encode("z");
  REQUIRE(z.size() == 1);
  json body = completion_body(prompt, n);
  body["logit_bias"] = {{std::to_string(z[0]), 100}};  // greedy: +100 makes every token 'z'
  auto r = post(port, "/v1/completions", body);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(parse(r.body)["choices"][0]["text"] == "zzzzzzzz");

  // Penalties: the plain engine with the same penalties gives the same text.
  json pen = completion_body(prompt, 24);
  pen["frequency_penalty"] = 1.5;
  pen["presence_penalty"] = 0.5;
  runtime::sampling_params o;
  o.frequency_penalty = 1.5f, o.presence_penalty = 0.5f;
  const auto ids = runtime::encode_prompt(tok(), prompt);
  const std::string want = as_json_text(tok().decode(reference_tokens(ids, 24, {}, o)));
  CHECK(want != as_json_text(tok().decode(reference_tokens(ids, 24))));  // they change the output here
  auto rp = post(port, "/v1/completions", pen);
  REQUIRE_MESSAGE(rp.status == 200, rp.body);
  CHECK(parse(rp.body)["choices"][0]["text"] == want);

  body["logit_bias"] = {{std::to_string(g.vocab_size), 1}};
  auto bad = post(port, "/v1/completions", body);
  CHECK(bad.status == 400);
  CHECK(parse(bad.body)["error"]["param"] == "logit_bias");
}

TEST_CASE("gateway logprobs: every token's, the greedy token the likeliest, the same streamed or not") {
  cluster c(1);
  uint16_t port = c.start_gateway(cluster::default_gateway());
  json body = completion_body("Once upon a time", 6);
  body["logprobs"] = 3;
  auto r = post(port, "/v1/completions", body);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  const json out = parse(r.body);
  const json& lp = out["choices"][0]["logprobs"];
  REQUIRE(lp["tokens"].size() == 6);
  for (size_t i = 0; i < 6; ++i) {
    // Offsets count the output's bytes; a token that splits a character shows as U+FFFD.
    if (i > 0 && lp["tokens"][i - 1].get<std::string>().find("\xef\xbf\xbd") == std::string::npos)
      CHECK(lp["text_offset"][i].get<int64_t>() - lp["text_offset"][i - 1].get<int64_t>() ==
            static_cast<int64_t>(lp["tokens"][i - 1].get<std::string>().size()));
    const double v = lp["token_logprobs"][i];
    CHECK(v <= 0.0);
    REQUIRE(lp["top_logprobs"][i].size() >= 1);
    double best = -1e9;
    for (const auto& [tok, x] : lp["top_logprobs"][i].items()) best = std::max(best, x.get<double>());
    CHECK(v == doctest::Approx(best));  // greedy takes the likeliest
  }
  CHECK(lp["text_offset"][0] == 0);
  json chat = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 5},
               {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 2}};
  auto rc = post(port, "/v1/chat/completions", chat);
  REQUIRE_MESSAGE(rc.status == 200, rc.body);
  const json whole = parse(rc.body)["choices"][0]["logprobs"]["content"];
  REQUIRE(whole.size() == parse(rc.body)["usage"]["completion_tokens"].get<size_t>());
  for (const auto& t : whole) {
    REQUIRE(t["top_logprobs"].size() == 2);
    CHECK(t["token"] == t["top_logprobs"][0]["token"]);
    CHECK(t["logprob"] == t["top_logprobs"][0]["logprob"]);
    CHECK(t["bytes"].is_array());
  }
  chat["stream"] = true;
  auto rs = post(port, "/v1/chat/completions", chat);
  REQUIRE_MESSAGE(rs.status == 200, rs.body);
  json streamed = json::array();
  for (const json& ch : sse_chunks(rs.body))
    if (!ch["choices"].empty() && ch["choices"][0]["logprobs"].is_object())
      for (const auto& t : ch["choices"][0]["logprobs"]["content"]) streamed.push_back(t);
  CHECK(streamed == whole);
}

TEST_CASE("gateway structured output: json_schema content parses and validates, regex and ebnf hold, bad ones are 400s") {
  cluster c(1);
  uint16_t port = c.start_gateway(cluster::default_gateway());
  const json schema = {{"type", "object"},
                       {"properties", {{"city", {{"type", "string"}, {"maxLength", 10}}},
                                       {"temp", {{"type", "number"}}},
                                       {"rain", {{"type", "boolean"}}},
                                       {"unit", {{"enum", {"C", "F"}}}}}},
                       {"required", {"city", "temp", "rain", "unit"}},
                       {"additionalProperties", false}};
  for (int seed = 0; seed < 4; ++seed) {
    json body = {{"model", "tiny"},
                 {"messages", {{{"role", "user"}, {"content", "The weather in Paris, as JSON"}}}},
                 {"max_tokens", 200},
                 {"temperature", seed == 0 ? 0.0 : 1.0},
                 {"seed", seed},
                 {"response_format", {{"type", "json_schema"},
                                      {"json_schema", {{"name", "weather"}, {"strict", true}, {"schema", schema}}}}}};
    auto r = post(port, "/v1/chat/completions", body);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    const json out = parse(r.body);
    const std::string content = out["choices"][0]["message"]["content"];
    CAPTURE(content);
    CHECK(out["choices"][0]["finish_reason"] == "stop");
    const json v = json::parse(content, nullptr, false);
    REQUIRE(v.is_object());
    CHECK(v.size() == 4);
    CHECK((v["city"].is_string() && v["city"].get<std::string>().size() <= 40));  // ≤ 10 code points
    CHECK(v["temp"].is_number());
    CHECK(v["rain"].is_boolean());
    CHECK((v["unit"] == "C" || v["unit"] == "F"));
  }
  json re = completion_body("Order number:", 30);
  re["regex"] = "[A-Z]{2}-[0-9]{3,5}";
  auto rr = post(port, "/v1/completions", re);
  REQUIRE_MESSAGE(rr.status == 200, rr.body);
  const std::string code = parse(rr.body)["choices"][0]["text"];
  CHECK(std::regex_match(code, std::regex("[A-Z]{2}-[0-9]{3,5}")));
  CHECK(parse(rr.body)["choices"][0]["finish_reason"] == "stop");  // ignore_eos, yet the grammar ends it
  json eb = completion_body("Answer:", 10);
  eb["ebnf"] = "root ::= \"yes\" | \"no\"";
  auto re2 = post(port, "/v1/completions", eb);
  REQUIRE_MESSAGE(re2.status == 200, re2.body);
  const std::string yn = parse(re2.body)["choices"][0]["text"];
  CHECK((yn == "yes" || yn == "no"));

  json bad = {{"model", "tiny"},
              {"messages", {{{"role", "user"}, {"content", "hi"}}}},
              {"response_format", {{"type", "json_schema"},
                                   {"json_schema", {{"name", "n"}, {"schema", {{"type", "integer"}, {"maximum", 9}}}}}}}};
  auto b = post(port, "/v1/chat/completions", bad);
  check_error(b, 400, "invalid_request_error", "response_format.json_schema.schema");
  CHECK(parse(b.body)["error"]["message"] ==
        "'response_format.json_schema.schema' is invalid: unsupported keyword \"maximum\" at /");
  json badre = completion_body("x", 4);
  badre["regex"] = "[a-";
  check_error(post(port, "/v1/completions", badre), 400, "invalid_request_error", "regex");
  auto ok = post(port, "/v1/completions", completion_body("still serving", 2));
  CHECK(ok.status == 200);
}

TEST_CASE("gateway tool calling: required and named choices return tool_calls whose arguments validate, streamed alike") {
  cluster c(1);
  uint16_t port = c.start_gateway(cluster::default_gateway());
  const json params = {{"type", "object"},
                       {"properties", {{"city", {{"type", "string"}, {"maxLength", 12}}}, {"days", {{"type", "integer"}}}}},
                       {"required", {"city", "days"}},
                       {"additionalProperties", false}};
  const json none = {{"type", "object"}, {"properties", json::object()}, {"additionalProperties", false}};
  const json tools = json::array(
      {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"description", "Forecast"}, {"parameters", params}}}},
       {{"type", "function"}, {"function", {{"name", "ping"}, {"parameters", none}}}}});
  auto check_call = [](const json& call, const std::string& only = "") {
    CHECK(call["type"] == "function");
    CHECK(call["id"].get<std::string>().starts_with("call_"));
    const std::string name = call["function"]["name"];
    if (!only.empty()) CHECK(name == only);
    const json args = json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
    CAPTURE(call.dump());
    REQUIRE(args.is_object());
    if (name == "get_weather") {
      CHECK(args.size() == 2);
      CHECK((args["city"].is_string() && args["city"].get<std::string>().size() <= 48));
      CHECK(args["days"].is_number_integer());
    } else {
      CHECK(name == "ping");
      CHECK(args.empty());
    }
  };
  json body = {{"model", "tiny"},
               {"messages", {{{"role", "user"}, {"content", "Weather in Paris for 3 days?"}}}},
               {"tools", tools},
               {"tool_choice", "required"},
               {"parallel_tool_calls", false},
               {"max_tokens", 300}};
  for (int seed = 0; seed < 4; ++seed) {
    body["temperature"] = seed == 0 ? 0.0 : 1.0;
    body["seed"] = seed;
    auto r = post(port, "/v1/chat/completions", body);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    const json out = parse(r.body);
    CAPTURE(r.body);
    CHECK(out["choices"][0]["finish_reason"] == "tool_calls");
    const json& msg = out["choices"][0]["message"];
    CHECK(msg["content"].is_null());
    REQUIRE(msg["tool_calls"].size() == 1);
    check_call(msg["tool_calls"][0]);
  }
  // A named function, parallel calls allowed: one call of it.
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  body.erase("parallel_tool_calls");
  body["temperature"] = 0;
  auto named = post(port, "/v1/chat/completions", body);
  REQUIRE_MESSAGE(named.status == 200, named.body);
  const json nj = parse(named.body);
  REQUIRE(nj["choices"][0]["message"]["tool_calls"].size() == 1);
  check_call(nj["choices"][0]["message"]["tool_calls"][0], "get_weather");
  // Streamed: the role chunk, one tool_calls delta, the finish chunk; the same call.
  body["stream"] = true;
  body["logprobs"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto s = post(port, "/v1/chat/completions", body);
  REQUIRE(s.status == 200);
  auto chunks = sse_chunks(s.body);
  REQUIRE(chunks.size() == 4);
  // The log probabilities of every token of the calls ride with them.
  CHECK(chunks[1]["choices"][0]["logprobs"]["content"].size() == chunks[3]["usage"]["completion_tokens"]);
  CHECK(chunks[0]["choices"][0]["delta"]["role"] == "assistant");
  const json& delta = chunks[1]["choices"][0]["delta"];
  REQUIRE(delta["tool_calls"].size() == 1);
  CHECK(delta["tool_calls"][0]["index"] == 0);
  CHECK(delta["tool_calls"][0]["function"] == nj["choices"][0]["message"]["tool_calls"][0]["function"]);
  CHECK(chunks[2]["choices"][0]["finish_reason"] == "tool_calls");
  body.erase("logprobs");
  body.erase("stream_options");
  // auto: text or calls, and a conversation holding earlier calls and their outputs.
  body.erase("stream");
  body["tool_choice"] = "auto";
  body["messages"] = json::array(
      {{{"role", "user"}, {"content", "Weather in Paris?"}},
       {{"role", "assistant"},
        {"content", nullptr},
        {"tool_calls", {{{"id", "call_1"}, {"type", "function"},
                         {"function", {{"name", "get_weather"}, {"arguments", R"({"city":"Paris","days":1})"}}}}}}},
       {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", R"({"temp":21})"}},
       {{"role", "user"}, {"content", "And Rome?"}}});
  for (int seed = 0; seed < 3; ++seed) {
    body["temperature"] = 1.0;
    body["seed"] = seed;
    auto r = post(port, "/v1/chat/completions", body);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    const json out = parse(r.body);
    const json& msg = out["choices"][0]["message"];
    if (msg.contains("tool_calls")) {
      for (const auto& call : msg["tool_calls"]) check_call(call);
    } else {
      CHECK(msg["content"].is_string());
    }
  }

  // none: text only; the tool-call tokens are banned (logit bias −100).
  body["tool_choice"] = "none";
  for (int seed = 0; seed < 2; ++seed) {
    body["seed"] = seed;
    auto r = post(port, "/v1/chat/completions", body);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    const json out = parse(r.body);
    CHECK_FALSE(out["choices"][0]["message"].contains("tool_calls"));
    CHECK(out["choices"][0]["message"]["content"].get<std::string>().find("tool\u2581call") == std::string::npos);
  }

  // Bad tools: each a 400 naming its field.
  json bad = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"tools", tools}};
  bad["tools"][0]["function"]["parameters"] = {{"type", "integer"}, {"maximum", 3}};
  check_error(post(port, "/v1/chat/completions", bad), 400, "invalid_request_error", "tools[0].function.parameters");
  bad["tools"] = tools;
  bad["tool_choice"] = {{"type", "function"}, {"function", {{"name", "nope"}}}};
  check_error(post(port, "/v1/chat/completions", bad), 400, "invalid_request_error", "tool_choice");
  bad.erase("tools");
  bad["tool_choice"] = "required";
  check_error(post(port, "/v1/chat/completions", bad), 400, "invalid_request_error", "tool_choice");
  bad.erase("tool_choice");
  bad["messages"] = json::array({{{"role", "user"}, {"content", "hi"}},
                                 {{"role", "assistant"},
                                  {"tool_calls", {{{"id", "c"}, {"type", "function"},
                                                   {"function", {{"name", "f"}, {"arguments", "{not json"}}}}}}}});
  check_error(post(port, "/v1/chat/completions", bad), 400, "invalid_request_error",
              "messages[1].tool_calls[0].function.arguments");
  auto ok = post(port, "/v1/completions", completion_body("still serving", 2));
  CHECK(ok.status == 200);
}

TEST_CASE("gateway lists its model and exports request metrics") {
  cluster c(1);
  uint16_t port = c.start_gateway();
  auto models = call(port, "GET", "/v1/models");
  REQUIRE(models.status == 200);
  json m = parse(models.body);
  CHECK(m["object"] == "list");
  REQUIRE(m["data"].size() == 1);
  CHECK(m["data"][0]["id"] == "tiny");
  CHECK(m["data"][0]["object"] == "model");

  for (int i = 0; i < 2; ++i) CHECK(post(port, "/v1/completions", completion_body("metrics", 4)).status == 200);
  check_error(post(port, "/v1/completions", {{"model", "tiny"}}), 400, "invalid_request_error", "prompt");
  // Without a context limit (context_length 0: none) requests are not refused as too long.
  auto unlimited = cluster::default_gateway();
  unlimited.context_length = 0;
  uint16_t port0 = c.start_gateway(unlimited);
  auto r0 = post(port0, "/v1/completions", completion_body("no limit", 4));
  CHECK(r0.status == 200);
  CHECK(parse(r0.body)["usage"]["completion_tokens"] == 4);

  auto metrics = call(port, "GET", "/metrics");
  REQUIRE(metrics.status == 200);
  const std::string& text = metrics.body;
  CHECK(text.find("shoal_requests_total{status=\"200\"} 3") != std::string::npos);  // /v1/models too
  CHECK(text.find("shoal_requests_total{status=\"400\"} 1") != std::string::npos);
  CHECK(text.find("shoal_time_to_first_token_seconds_bucket") != std::string::npos);
  CHECK(text.find("shoal_time_to_first_token_seconds_count{model=\"tiny\"} 2") != std::string::npos);
  CHECK(text.find("shoal_generation_tokens_total{model=\"tiny\"} 8") != std::string::npos);
  INFO(text);
}

// -- failures ----------------------------------------------------------------------------------

TEST_CASE("gateway cancels the generation when a streaming client disconnects") {
  cluster c(1);
  uint16_t port = c.start_gateway();
  const int32_t n = 2000;
  json body = completion_body("Tell me a very long story", n);
  body["stream"] = true;
  actors::http_call_options opts;
  opts.close_after_body_bytes = 1;  // leave after the first chunk
  auto r = post(port, "/v1/completions", body, opts);
  CHECK(r.status == 200);
  CHECK(!r.body.empty());

  auto deadline = std::chrono::steady_clock::now() + wait_timeout;
  actors::engine_stats_snapshot st = c.stats(0);
  while ((st.requests_running != 0 || st.engine.blocks_free != st.engine.blocks_total) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(2ms);
    st = c.stats(0);
  }
  CHECK(st.requests_running == 0);
  CHECK(st.engine.blocks_free == st.engine.blocks_total);
  CHECK(st.engine.generated >= 1);
  CHECK(st.engine.generated < n / 4);  // cancelled long before 2,000 tokens
  MESSAGE("tokens generated before the cancel: " << st.engine.generated);

  // The gateway forgot the request and still serves.
  auto gw_deadline = std::chrono::steady_clock::now() + wait_timeout;
  while (c.in_flight(c.gateways[0]) != 0 && std::chrono::steady_clock::now() < gw_deadline)
    std::this_thread::sleep_for(5ms);
  CHECK(c.in_flight(c.gateways[0]) == 0);
  CHECK(post(port, "/v1/completions", completion_body("again", 4)).status == 200);
}

TEST_CASE("gateway re-routes a stream whose engine is killed and the client sees no seam") {
  cluster c(2);
  c.route_to({0});  // the stream starts on engine 0
  uint16_t port = c.start_gateway();
  const std::string prompt = "Re-route me";
  const int32_t n = 300;
  const std::string want = as_json_text(tok().decode(reference_tokens(runtime::encode_prompt(tok(), prompt), n)));

  json body = completion_body(prompt, n);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  actors::http_call_options opts;
  std::atomic<bool> killed{false};
  opts.on_body = [&](std::string_view) {
    if (killed.exchange(true)) return;
    c.route_to({0, 1});
    caf::anon_send_exit(c.engines[0], caf::exit_reason::kill);
  };
  auto r = post(port, "/v1/completions", body, opts);
  REQUIRE(killed);
  REQUIRE(r.status == 200);
  auto chunks = sse_chunks(r.body);
  REQUIRE(chunks.size() >= 3);
  std::string text;
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    REQUIRE_MESSAGE(!chunks[i].contains("error"), chunks[i].dump());
    text += chunks[i]["choices"][0]["text"].get<std::string>();
  }
  CHECK(chunks[chunks.size() - 2]["choices"][0]["finish_reason"] == "length");
  CHECK(chunks.back()["usage"]["completion_tokens"] == n);
  CHECK(text == want);
  // Engine 1 resumed after the tokens the client had (at least the first): it generated only
  // the rest, and the text is still the reference's.
  const uint64_t rest = c.stats(1).engine.generated;
  CHECK(rest > 0);
  CHECK(rest < static_cast<uint64_t>(n));
}

TEST_CASE("gateway drain refuses new requests with 503") {
  cluster c(1);
  uint16_t port = c.start_gateway();
  CHECK(post(port, "/v1/completions", completion_body("before", 4)).status == 200);
  CHECK(call(port, "GET", "/health").status == 200);

  CHECK(c.drain(c.gateways[0]) == std::optional<bool>(true));
  CHECK(c.drain(c.gateways[0]) == std::optional<bool>(false));
  check_error(post(port, "/v1/completions", completion_body("after", 4)), 503, "overloaded_error", "",
              "service_unavailable");
  check_error(post(port, "/v1/chat/completions",
                   {{"model", "tiny"}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}}),
              503, "overloaded_error", "", "service_unavailable");
  auto health = call(port, "GET", "/health");
  CHECK(health.status == 503);
  CHECK(parse(health.body)["status"] == "draining");
}

// -- images ------------------------------------------------------------------------------------
