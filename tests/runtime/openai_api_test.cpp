// Tests of runtime/openai_api: a table of bad request bodies, each rejected with its exact
// status, type and param; good requests of both endpoints parsed field by field, defaults
// included; and every response builder's JSON read back with nlohmann and checked field by field.
#include "runtime/serve/openai_api.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <limits>
#include <string>
#include <vector>

using namespace shoal::runtime;
using json = nlohmann::json;

namespace {

api_limits limits() {
  api_limits l;
  l.model_ids = {"deepseek-v3", "small"};
  l.max_tokens_limit = 1000;
  l.context_length = 2048;
  l.vocab_size = 1000;
  l.max_body_bytes = 4096;
  return l;
}

completion_request parse_ok(const std::string& body, bool chat) {
  const auto r = parse_completion_request(body, chat, limits());
  CAPTURE(body);
  REQUIRE_MESSAGE(r.has_value(), (r ? "" : to_json(r.error())));
  return *r;
}

const response_meta meta{"cmpl-00000000000000ff", 1700000000, "small"};

}  // namespace

TEST_CASE("openai_api: bad requests are rejected with exact status, type and param") {
  struct bad {
    bool chat;
    std::string body;
    int status;
    const char* type;
    const char* param;
  };
  const std::string m = R"("model": "small", )";
  const std::string p = m + R"("prompt": "hi", )";
  const std::string c = m + R"("messages": [{"role": "user", "content": "hi"}], )";
  const std::vector<bad> cases = {
      {false, "not json", 400, "invalid_request_error", ""},
      {false, "[1, 2]", 400, "invalid_request_error", ""},
      {false, R"({"prompt": "hi"})", 400, "invalid_request_error", "model"},
      {false, R"({"model": 7, "prompt": "hi"})", 400, "invalid_request_error", "model"},
      {false, R"({"model": "gpt-4", "prompt": "hi"})", 404, "not_found_error", "model"},
      {false, R"({"model": "small"})", 400, "invalid_request_error", "prompt"},
      {false, "{" + m + R"("prompt": ""})", 400, "invalid_request_error", "prompt"},
      {false, "{" + m + R"("prompt": []})", 400, "invalid_request_error", "prompt"},
      {false, "{" + m + R"("prompt": {"a": 1}})", 400, "invalid_request_error", "prompt"},
      {false, "{" + m + R"("prompt": [1, -2]})", 400, "invalid_request_error", "prompt"},
      {false, "{" + m + R"("prompt": ["a", "b"]})", 400, "invalid_request_error", "prompt"},
      {true, R"({"model": "small"})", 400, "invalid_request_error", "messages"},
      {true, "{" + m + R"("messages": "hi"})", 400, "invalid_request_error", "messages"},
      {true, "{" + m + R"("messages": []})", 400, "invalid_request_error", "messages"},
      {true, "{" + m + R"("messages": ["hi"]})", 400, "invalid_request_error", "messages[0]"},
      {true, "{" + m + R"("messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]})", 400,
       "invalid_request_error", "messages[1].role"},
      {true, "{" + m + R"("messages": [{"content": "b"}]})", 400, "invalid_request_error", "messages[0].role"},
      {true, "{" + m + R"("messages": [{"role": "user", "content": 5}]})", 400, "invalid_request_error",
       "messages[0].content"},
      {true, "{" + m + R"("messages": [{"role": "user"}]})", 400, "invalid_request_error", "messages[0].content"},
      {true, "{" + m + R"("messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", 400,
       "invalid_request_error", "messages[0].content[0]"},  // a model without a vision encoder
      {true, "{" + m + R"("messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "x"}]}]})", 400,
       "invalid_request_error", "messages[0].tool_calls[0]"},
      {true, "{" + m + R"("messages": [{"role": "user", "content": "a", "tool_calls": []}]})", 400,
       "invalid_request_error", "messages[0].tool_calls"},
      {true, "{" + m + R"("messages": [{"role": "assistant", "content": "a", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]})", 400,
       "invalid_request_error", "messages[0].content"},
      {true, "{" + m + R"("messages": [{"role": "user", "content": "a", "tool_call_id": "c1"}]})", 400,
       "invalid_request_error", "messages[0].tool_call_id"},
      {false, "{" + p + R"("max_tokens": 0})", 400, "invalid_request_error", "max_tokens"},
      {false, "{" + p + R"("max_tokens": 1001})", 400, "invalid_request_error", "max_tokens"},
      {false, "{" + p + R"("max_tokens": 16.5})", 400, "invalid_request_error", "max_tokens"},
      {false, "{" + p + R"("max_tokens": "16"})", 400, "invalid_request_error", "max_tokens"},
      {true, "{" + c + R"("max_completion_tokens": -1})", 400, "invalid_request_error", "max_completion_tokens"},
      {false, "{" + p + R"("temperature": 2.5})", 400, "invalid_request_error", "temperature"},
      {false, "{" + p + R"("temperature": "hot"})", 400, "invalid_request_error", "temperature"},
      {false, "{" + p + R"("top_p": 0})", 400, "invalid_request_error", "top_p"},
      {false, "{" + p + R"("top_p": 1.01})", 400, "invalid_request_error", "top_p"},
      {false, "{" + p + R"("top_k": -1})", 400, "invalid_request_error", "top_k"},
      {false, "{" + p + R"("n": 2})", 400, "invalid_request_error", "n"},
      {false, "{" + p + R"("stop": 5})", 400, "invalid_request_error", "stop"},
      {false, "{" + p + R"("stop": ["a", "b", "c", "d", "e"]})", 400, "invalid_request_error", "stop"},
      {false, "{" + p + R"("stop": ["a", 1]})", 400, "invalid_request_error", "stop"},
      {false, "{" + p + R"("stream": "yes"})", 400, "invalid_request_error", "stream"},
      {false, "{" + p + R"("stream": true, "stream_options": {"include_usage": 1}})", 400, "invalid_request_error",
       "stream_options.include_usage"},
      {false, "{" + p + R"("stream_options": {"include_usage": true}})", 400, "invalid_request_error",
       "stream_options"},
      {false, "{" + p + R"("seed": -3})", 400, "invalid_request_error", "seed"},
      {false, "{" + p + R"("seed": 1.5})", 400, "invalid_request_error", "seed"},
      {false, "{" + p + R"("logprobs": 6})", 400, "invalid_request_error", "logprobs"},
      {false, "{" + p + R"("logprobs": true})", 400, "invalid_request_error", "logprobs"},
      {true, "{" + c + R"("logprobs": 5})", 400, "invalid_request_error", "logprobs"},
      {true, "{" + c + R"("top_logprobs": 2})", 400, "invalid_request_error", "top_logprobs"},
      {true, "{" + c + R"("logprobs": true, "top_logprobs": 21})", 400, "invalid_request_error", "top_logprobs"},
      {false, "{" + p + R"("top_logprobs": 2})", 400, "invalid_request_error", "top_logprobs"},
      {false, "{" + p + R"("echo": true})", 400, "invalid_request_error", "echo"},
      {false, "{" + p + R"("best_of": 3})", 400, "invalid_request_error", "best_of"},
      {false, "{" + p + R"("ignore_eos": "no"})", 400, "invalid_request_error", "ignore_eos"},
      {true, "{" + c + R"("traffic_class": "batch"})", 400, "invalid_request_error", "traffic_class"},
      {false, "{" + p + R"("pad": ")" + std::string(5000, 'x') + "\"}", 413, "request_too_large", ""},
      // Fields the API defines but shoal does not implement: refused unless neutral, never ignored.
      {false, "{" + p + R"("presence_penalty": 2.5})", 400, "invalid_request_error", "presence_penalty"},
      {true, "{" + c + R"("frequency_penalty": "high"})", 400, "invalid_request_error", "frequency_penalty"},
      {false, "{" + p + R"("logit_bias": {"50256": -100}})", 400, "invalid_request_error", "logit_bias"},  // ≥ vocab
      {false, "{" + p + R"("logit_bias": {"a7": 1}})", 400, "invalid_request_error", "logit_bias"},
      {false, "{" + p + R"("logit_bias": {"7": 101}})", 400, "invalid_request_error", "logit_bias"},
      {false, "{" + p + R"("logit_bias": {"7": 1, "07": 2}})", 400, "invalid_request_error", "logit_bias"},
      {false, "{" + p + R"("logit_bias": [7]})", 400, "invalid_request_error", "logit_bias"},
      {true, "{" + c + R"("response_format": {"type": "xml"}})", 400, "invalid_request_error", "response_format.type"},
      {true, "{" + c + R"("response_format": {"type": "json_object", "schema": {}}})", 400, "invalid_request_error",
       "response_format.schema"},
      {true, "{" + c + R"("response_format": {"type": "json_schema", "json_schema": {"schema": {}}}})", 400,
       "invalid_request_error", "response_format.json_schema.name"},
      {true, "{" + c + R"("response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 1}}}})",
       400, "invalid_request_error", "response_format.json_schema.schema"},
      {true, "{" + c + R"("response_format": {"type": "json_object"}, "regex": "a+"})", 400, "invalid_request_error", "regex"},
      {false, "{" + p + R"("regex": "(a"})", 400, "invalid_request_error", "regex"},
      {false, "{" + p + R"("ebnf": "root ::= x"})", 400, "invalid_request_error", "ebnf"},
      {false, "{" + p + R"("response_format": {"type": "json_object"}})", 400, "invalid_request_error", "response_format"},
      {true, "{" + c + R"("tools": {"type": "function"}})", 400, "invalid_request_error", "tools"},
      {true, "{" + c + R"("tools": [{"type": "retrieval"}]})", 400, "invalid_request_error", "tools[0]"},
      {true, "{" + c + R"("tools": [{"type": "function", "function": {"name": "a b"}}]})", 400, "invalid_request_error",
       "tools[0].function.name"},
      {true, "{" + c + R"("tools": [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]})",
       400, "invalid_request_error", "tools[1].function.name"},
      {true, "{" + c + R"("tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]})", 400,
       "invalid_request_error", "tools[0].function.parameters"},
      {true, "{" + c + R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "minProperties": 1}}}]})",
       400, "invalid_request_error", "tools[0].function.parameters"},
      {true, "{" + c + R"("tools": [{"type": "function", "function": {"name": "f", "examples": []}}]})", 400,
       "invalid_request_error", "tools[0].function.examples"},
      {true, "{" + c + R"("tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "any"})", 400,
       "invalid_request_error", "tool_choice"},
      {true, "{" + c + R"("tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}})",
       400, "invalid_request_error", "tool_choice"},
      {true, "{" + c + R"("tools": [{"type": "function", "function": {"name": "f"}}], "parallel_tool_calls": 1})", 400,
       "invalid_request_error", "parallel_tool_calls"},
      {true, "{" + c + R"("tool_choice": "required"})", 400, "invalid_request_error", "tool_choice"},
      {false, "{" + p + R"("tools": [{"type": "function", "function": {"name": "f"}}]})", 400, "invalid_request_error", "tools"},
      {true, "{" + c + R"("functions": [{"name": "f"}]})", 400, "invalid_request_error", "functions"},
      {false, "{" + p + R"("suffix": "tail"})", 400, "invalid_request_error", "suffix"},
      {false, "{" + p + R"("temprature": 0.5})", 400, "invalid_request_error", "temprature"},  // a typo is not ignored
      {true, "{" + c + R"("store": true})", 400, "invalid_request_error", "store"},
      {false, "{" + p + R"("messages": [{"role": "user", "content": "hi"}]})", 400, "invalid_request_error",
       "messages"},
      {true, "{" + c + R"("prompt": "hi"})", 400, "invalid_request_error", "prompt"},
  };
  for (const bad& b : cases) {
    CAPTURE(b.body);
    const auto r = parse_completion_request(b.body, b.chat, limits());
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().status == b.status);
    CHECK(r.error().type == b.type);
    CHECK(r.error().param == b.param);
    CHECK_FALSE(r.error().message.empty());
    if (*b.param) CHECK(r.error().message.find(b.param) != std::string::npos);
  }
  CHECK(cases.size() == 87);
}

TEST_CASE("openai_api: fields at their neutral values, informational ones and nulls are accepted") {
  const std::string c = R"("model": "small", "messages": [{"role": "user", "content": "hi"}])";
  for (const std::string extra :
       {R"("presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {})", R"("response_format": {"type": "text"})",
        R"("tools": [], "tool_choice": "none", "parallel_tool_calls": false)", R"("user": "u-1", "logprobs": false)",
        R"("response_format": null, "temprature": null)"}) {
    const auto r = parse_ok("{" + c + ", " + extra + "}", true);
    CHECK(r.messages.size() == 1);
  }
  const auto r = parse_ok(R"({"model": "small", "prompt": "hi", "suffix": "", "echo": false, "best_of": 1})", false);
  CHECK(std::get<std::string>(r.prompt) == "hi");
  const auto a = parse_ok(R"({"model": "small", "prompt": "hi", "logit_bias": {"999": -100, "7": 5.5},
                              "presence_penalty": -2, "frequency_penalty": 1.5})",
                          false);
  REQUIRE(a.logit_bias.size() == 2);
  CHECK(a.logit_bias[0] == std::pair<int32_t, float>{7, 5.5f});
  CHECK(a.logit_bias[1] == std::pair<int32_t, float>{999, -100.0f});
  CHECK(a.presence_penalty == -2.0f);
  CHECK(a.frequency_penalty == 1.5f);
}

TEST_CASE("openai_api: response_format, regex and ebnf become the request's constraint, errors say where") {
  const std::string c = R"("model": "small", "messages": [{"role": "user", "content": "hi"}])";
  auto js = parse_ok("{" + c + R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "person",
      "strict": true, "schema": {"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}},
      "required": ["z", "a"], "additionalProperties": false}}}})", true);
  CHECK(js.constraint.kind == constraint_kind::json_schema);
  CHECK(js.constraint.source ==  // declared order kept
        R"({"type":"object","properties":{"z":{"type":"string"},"a":{"type":"integer"}},"required":["z","a"],"additionalProperties":false})");
  CHECK(parse_ok("{" + c + R"(, "response_format": {"type": "json_object"}})", true).constraint ==
        constraint_spec{constraint_kind::json_object, ""});
  CHECK(parse_ok("{" + c + R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "any"}}})", true).constraint ==
        constraint_spec{constraint_kind::json_schema, "{}"});
  CHECK(parse_ok(R"({"model": "small", "prompt": "hi", "regex": "[0-9]+"})", false).constraint ==
        constraint_spec{constraint_kind::regex, "[0-9]+"});
  CHECK(parse_ok(R"x({"model": "small", "prompt": "hi", "ebnf": "root ::= \"yes\" | \"no\""})x", false).constraint ==
        constraint_spec{constraint_kind::ebnf, "root ::= \"yes\" | \"no\""});
  CHECK_FALSE(parse_ok("{" + c + R"(, "response_format": {"type": "text"}})", true).constraint.active());
  auto err = [&](const std::string& extra, bool chat = true) {
    auto r = parse_completion_request("{" + (chat ? c : std::string(R"("model": "small", "prompt": "hi")")) + ", " + extra + "}",
                                      chat, limits());
    REQUIRE_FALSE(r.has_value());
    return r.error().message;
  };
  CHECK(err(R"("response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {"properties": {"a": {"type": "string", "format": "email"}}}}})") ==
        "'response_format.json_schema.schema' is invalid: unsupported keyword \"format\" at /properties/a");
  CHECK(err(R"x("regex": "ab)")x", false) == "'regex' is invalid: unmatched ')' at offset 2");
  CHECK(err(R"x("ebnf": "root ::= \"a\"\nroot ::= \"b\"")x", false) ==
        "'ebnf' is invalid: rule 'root' is defined twice at line 2, column 1");
  CHECK(err(R"x("regex": "a", "ebnf": "root ::= \"a\"")x", false) ==
        "only one of 'response_format' (json_object, json_schema), 'regex' and 'ebnf' may be given, got 'regex' and 'ebnf'");
}

TEST_CASE("openai_api: logprobs and top_logprobs are read per endpoint and written in each endpoint's shape") {
  const std::string c = R"("model": "small", "messages": [{"role": "user", "content": "hi"}])";
  CHECK(parse_ok(R"({"model": "small", "prompt": "hi", "logprobs": 3})", false).logprobs == 3);
  CHECK(parse_ok(R"({"model": "small", "prompt": "hi", "logprobs": 0})", false).logprobs == 0);
  CHECK(parse_ok(R"({"model": "small", "prompt": "hi"})", false).logprobs == -1);
  CHECK(parse_ok("{" + c + R"(, "logprobs": true, "top_logprobs": 20})", true).logprobs == 20);
  CHECK(parse_ok("{" + c + R"(, "logprobs": true})", true).logprobs == 0);
  CHECK(parse_ok("{" + c + R"(, "logprobs": false})", true).logprobs == -1);
  const response_meta m{"cmpl-1", 7, "small"};
  const logprob_list lp = {{"He", -0.25f, {{"He", -0.25f}, {"We", -1.5f}}, 0},
                           {"\xe2\x82", -std::numeric_limits<float>::infinity(), {}, 2}};
  const auto comp = nlohmann::json::parse(completion_response_json(m, "He", finish_reason::stop, {}, &lp));
  const auto& cl = comp["choices"][0]["logprobs"];
  CHECK(cl["tokens"] == nlohmann::json({"He", "\xef\xbf\xbd"}));  // a split character as U+FFFD
  CHECK(cl["token_logprobs"] == nlohmann::json({-0.25, -9999.0}));
  CHECK(cl["top_logprobs"][0] == nlohmann::json({{"He", -0.25}, {"We", -1.5}}));
  CHECK(cl["text_offset"] == nlohmann::json({0, 2}));
  const auto chat = nlohmann::json::parse(chat_completion_response_json(m, "He", finish_reason::stop, {}, &lp));
  const auto& ch = chat["choices"][0]["logprobs"];
  CHECK(ch["refusal"].is_null());
  CHECK(ch["content"][0] == nlohmann::json({{"token", "He"}, {"logprob", -0.25}, {"bytes", {72, 101}},
                                            {"top_logprobs", {{{"token", "He"}, {"logprob", -0.25}, {"bytes", {72, 101}}},
                                                              {{"token", "We"}, {"logprob", -1.5}, {"bytes", {87, 101}}}}}}));
  CHECK(ch["content"][1]["bytes"] == nlohmann::json({226, 130}));
  CHECK(nlohmann::json::parse(completion_response_json(m, "He", finish_reason::stop, {}))["choices"][0]["logprobs"].is_null());
  CHECK(nlohmann::json::parse(chat_content_chunk_json(m, "x", &lp))["choices"][0]["logprobs"]["content"].size() == 2);
}

TEST_CASE("openai_api: error messages and codes") {
  const auto r = parse_completion_request(R"({"model": "gpt-4", "prompt": "x"})", false, limits());
  CHECK(r.error() == api_error{404, "not_found_error", "The model 'gpt-4' does not exist", "model", "model_not_found"});
  const auto t = parse_completion_request(R"({"model": "small", "prompt": "x", "max_tokens": 0})", false, limits());
  CHECK(t.error().message == "'max_tokens' must be an integer from 1 to 1000, got 0");
  CHECK(check_body_size(4096, limits()) == std::nullopt);
  CHECK(check_body_size(4097, limits())->message == "request body of 4097 bytes exceeds the limit of 4096 bytes");
  CHECK(check_context(2000, 48, 2048) == std::nullopt);
  const auto ctx = check_context(2000, 49, 2048);
  REQUIRE(ctx);
  CHECK(*ctx == api_error{400, "invalid_request_error",
                          "This model's maximum context length is 2048 tokens. However, you requested 2049 tokens "
                          "(2000 in the prompt, 49 for the completion). Please reduce the length of the prompt or "
                          "completion.",
                          "", "context_length_exceeded"});
  CHECK(authentication_error("bad key").status == 401);
  CHECK(overloaded_error("queue full").status == 503);
  CHECK(server_error("boom").type == "server_error");

  const json e = json::parse(to_json(*ctx));
  CHECK(e["error"]["type"] == "invalid_request_error");
  CHECK(e["error"]["param"].is_null());
  CHECK(e["error"]["code"] == "context_length_exceeded");
  CHECK(e["error"]["message"] == ctx->message);
  const json e2 = json::parse(to_json(r.error()));
  CHECK(e2 == json::parse(R"({"error": {"message": "The model 'gpt-4' does not exist", "type": "not_found_error",
                                         "param": "model", "code": "model_not_found"}})"));
}

TEST_CASE("openai_api: completion requests parse with defaults and every field") {
  const completion_request d = parse_ok(R"({"model": "small", "prompt": "Hello"})", false);
  CHECK_FALSE(d.chat);
  CHECK(d.model == "small");
  CHECK(std::get<std::string>(d.prompt) == "Hello");
  CHECK(d.max_tokens == 16);
  CHECK(d.temperature == 1.0f);
  CHECK(d.top_p == 1.0f);
  CHECK(d.top_k == 0);
  CHECK(d.stop.empty());
  CHECK_FALSE(d.stream);
  CHECK_FALSE(d.include_usage);
  CHECK_FALSE(d.seed);
  CHECK_FALSE(d.ignore_eos);
  CHECK(d.cls == shoal::runtime::traffic_class::chat);

  const completion_request f = parse_ok(R"({"model": "deepseek-v3", "prompt": [1, 2, 3], "max_tokens": 1000,
      "temperature": 0, "top_p": 0.5, "top_k": 40, "stop": "\n", "stream": true,
      "stream_options": {"include_usage": true}, "seed": 18446744073709551615, "ignore_eos": true,
      "traffic_class": "agent", "n": 1, "logprobs": null, "echo": false, "best_of": 1, "user": "ignored",
      "presence_penalty": 0})", false);
  CHECK(std::get<std::vector<int32_t>>(f.prompt) == std::vector<int32_t>{1, 2, 3});
  CHECK(f.max_tokens == 1000);
  CHECK(f.temperature == 0.0f);
  CHECK(f.top_p == 0.5f);
  CHECK(f.top_k == 40);
  CHECK(f.stop == std::vector<std::string>{"\n"});
  CHECK(f.stream);
  CHECK(f.include_usage);
  CHECK(f.seed == 18446744073709551615ull);
  CHECK(f.ignore_eos);
  CHECK(f.cls == shoal::runtime::traffic_class::agent);

  CHECK(std::get<std::string>(parse_ok(R"({"model": "small", "prompt": ["one"]})", false).prompt) == "one");
  CHECK(parse_ok(R"({"model": "small", "prompt": "x", "stop": ["a", "b", "c", "d"]})", false).stop.size() == 4);
}

TEST_CASE("openai_api: tools and tool_choice become a tool-call constraint, calls in messages and responses") {
  const std::string c = R"("model": "small", "messages": [{"role": "user", "content": "hi"}])";
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "get_weather", "description": "Forecast",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}, "strict": true}},
      {"type": "function", "function": {"name": "ping"}}])";
  auto a = parse_ok("{" + c + ", " + tools + "}", true);
  CHECK(a.tools.mode == tool_mode::auto_);  // the default with tools
  REQUIRE(a.tools.functions.size() == 2);
  CHECK(a.tools.functions[0] == tool_function{"get_weather", "Forecast",
                                              R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})"});
  CHECK(a.tools.functions[1] == tool_function{"ping", "", ""});
  CHECK(a.constraint == tool_constraint(a.tools, {}));
  auto j = parse_ok("{" + c + ", " + tools + R"(, "response_format": {"type": "json_object"}, "tool_choice": "auto"})", true);
  CHECK(j.constraint == tool_constraint(j.tools, {constraint_kind::json_object, ""}));  // auto: calls or JSON content
  auto req = parse_ok("{" + c + ", " + tools + R"(, "tool_choice": "required", "parallel_tool_calls": false})", true);
  CHECK(req.tools.mode == tool_mode::required);
  CHECK_FALSE(req.tools.parallel);
  auto named = parse_ok("{" + c + ", " + tools + R"(, "tool_choice": {"type": "function", "function": {"name": "ping"}}})", true);
  CHECK(named.tools.mode == tool_mode::function);
  CHECK(named.tools.function == "ping");
  auto none = parse_ok("{" + c + ", " + tools + R"(, "tool_choice": "none", "regex": "a+"})", true);
  CHECK_FALSE(none.tools.active());
  CHECK(none.tools.functions.size() == 2);  // still described in the prompt
  CHECK(none.constraint == constraint_spec{constraint_kind::regex, "a+"});
  auto m = parse_ok(R"({"model": "small", "messages": [{"role": "user", "content": "hi"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "ping", "arguments": "{}"}}]}, {"role": "tool", "content": "pong", "tool_call_id": "call_1"}]})", true);
  REQUIRE(m.messages.size() == 3);
  CHECK(m.messages[1] == chat_message{"assistant", std::nullopt, {{"call_1", "ping", "{}"}}});

  response_meta meta{"chatcmpl-1", 7, "small"};
  const std::vector<tool_call> calls = {{"call_a_0", "ping", "{}"}};
  const json whole = json::parse(chat_completion_response_json(meta, "", finish_reason::tool_calls, {}, nullptr, &calls));
  CHECK(whole["choices"][0]["finish_reason"] == "tool_calls");
  CHECK(whole["choices"][0]["message"] ==
        json::parse(R"({"role":"assistant","content":null,"tool_calls":[{"id":"call_a_0","type":"function","function":{"name":"ping","arguments":"{}"}}]})"));
  const json chunk = json::parse(chat_tool_calls_chunk_json(meta, calls));
  CHECK(chunk["choices"][0]["delta"] ==
        json::parse(R"({"tool_calls":[{"index":0,"id":"call_a_0","type":"function","function":{"name":"ping","arguments":"{}"}}]})"));
  CHECK(chunk["choices"][0]["finish_reason"].is_null());
}

TEST_CASE("openai_api: chat requests parse messages and max_completion_tokens") {
  const completion_request r = parse_ok(R"({"model": "small", "messages": [
      {"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "a"},
      {"type": "text", "text": "b"}]}, {"role": "assistant", "content": null, "tool_calls": []},
      {"role": "tool", "content": "42", "tool_call_id": "t1"}, {"role": "assistant"}]})", true);
  CHECK(r.chat);
  CHECK(r.messages == std::vector<chat_message>{{"system", "Be brief."}, {"user", "ab"}, {"assistant", std::nullopt},
                                                {"tool", "42"}, {"assistant", std::nullopt}});
  CHECK(r.max_tokens == 256);  // min(limit 1000, 256)
  api_limits small = limits();
  small.max_tokens_limit = 100;
  const auto s = parse_completion_request(R"({"model": "small", "messages": [{"role": "user", "content": "x"}]})",
                                          true, small);
  CHECK(s->max_tokens == 100);
  CHECK(parse_ok(R"({"model": "small", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5,
                     "max_completion_tokens": 7})", true).max_tokens == 7);
}

TEST_CASE("openai_api: whole responses carry OpenAI's fields") {
  const usage_info u{10, 5, 8};
  const json c = json::parse(completion_response_json(meta, "Hello", finish_reason::length, u));
  CHECK(c["id"] == "cmpl-00000000000000ff");
  CHECK(c["object"] == "text_completion");
  CHECK(c["created"] == 1700000000);
  CHECK(c["model"] == "small");
  REQUIRE(c["choices"].size() == 1);
  CHECK(c["choices"][0] == json::parse(R"({"index": 0, "text": "Hello", "logprobs": null, "finish_reason": "length"})"));
  CHECK(c["usage"] == json::parse(R"({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
                                      "prompt_tokens_details": {"cached_tokens": 8}})"));

  const json ch = json::parse(chat_completion_response_json(meta, "Hi \xff", finish_reason::stop, u));
  CHECK(ch["object"] == "chat.completion");
  CHECK(ch["choices"][0]["index"] == 0);
  CHECK(ch["choices"][0]["message"] == json::parse(R"({"role": "assistant", "content": "Hi \ufffd"})"));
  CHECK(ch["choices"][0]["finish_reason"] == "stop");
  CHECK(ch["usage"]["total_tokens"] == 15);

  CHECK(make_response_id(false, shoal::request_id(255)) == "cmpl-00000000000000ff");
  CHECK(make_response_id(true, shoal::request_id(0x0123456789abcdefll)) == "chatcmpl-0123456789abcdef");
}

TEST_CASE("openai_api: streamed chunks, SSE framing and the model list") {
  const json t = json::parse(completion_chunk_json(meta, "He", finish_reason::none));
  CHECK(t["object"] == "text_completion");
  CHECK(t["choices"][0]["text"] == "He");
  CHECK(t["choices"][0]["finish_reason"].is_null());
  CHECK(json::parse(completion_chunk_json(meta, "", finish_reason::stop))["choices"][0]["finish_reason"] == "stop");

  const json role = json::parse(chat_role_chunk_json(meta));
  CHECK(role["object"] == "chat.completion.chunk");
  CHECK(role["choices"][0]["delta"] == json::parse(R"({"role": "assistant", "content": ""})"));
  CHECK(role["choices"][0]["finish_reason"].is_null());
  const json content = json::parse(chat_content_chunk_json(meta, "llo"));
  CHECK(content["choices"][0]["delta"] == json::parse(R"({"content": "llo"})"));
  const json fin = json::parse(chat_finish_chunk_json(meta, finish_reason::length));
  CHECK(fin["choices"][0]["delta"] == json::object());
  CHECK(fin["choices"][0]["finish_reason"] == "length");

  const json usage = json::parse(usage_chunk_json(meta, true, {3, 2, 0}));
  CHECK(usage["object"] == "chat.completion.chunk");
  CHECK(usage["choices"] == json::array());
  CHECK(usage["usage"]["total_tokens"] == 5);
  CHECK(json::parse(usage_chunk_json(meta, false, {3, 2, 0}))["object"] == "text_completion");

  CHECK(sse_event(R"({"a":1})") == "data: {\"a\":1}\n\n");
  CHECK(sse_done() == "data: [DONE]\n\n");

  CHECK(models_json({"deepseek-v3", "small"}, 42) ==
        R"({"object":"list","data":[{"id":"deepseek-v3","object":"model","created":42,"owned_by":"shoal"},)"
        R"({"id":"small","object":"model","created":42,"owned_by":"shoal"}]})");
}

TEST_CASE("openai_api: every truncation of a good body, and deep nesting, fail cleanly") {
  const std::string body = R"({"model": "small", "messages": [{"role": "user", "content": [{"type": "text",
      "text": "h\u00e9"}]}], "max_tokens": 5, "stop": ["a"], "stream": true, "stream_options": {"include_usage": true},
      "seed": 3, "temperature": 0.5})";
  REQUIRE(parse_completion_request(body, true, limits()).has_value());
  for (size_t n = 0; n < body.size(); ++n) {
    CAPTURE(n);
    const auto r = parse_completion_request(body.substr(0, n), true, limits());
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().status == 400);
  }
  api_limits big = limits();
  big.max_body_bytes = size_t{1} << 20;
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  const auto r = parse_completion_request(deep, false, big);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().message == "request body must be a JSON object");
}
