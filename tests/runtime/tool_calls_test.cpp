// Tool calling pieces: calls read back out of generated text (whole, several, cut short), the
// tools' prompt section, the request's constraint source, and earlier calls rendered by the
// DeepSeek-V3 chat template exactly as Python Jinja2 renders them.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "runtime/serve/chat_template.hpp"
#include "runtime/serve/openai_api.hpp"
#include "runtime/structured/tool_calls.hpp"

using namespace shoal::runtime;

namespace {

std::string call(const std::string& name, const std::string& args) {
  return std::string(tool_call_begin_token) + "function" + std::string(tool_sep_token) + name + "\n```json\n" + args +
         "\n```" + std::string(tool_call_end_token);
}

}  // namespace

TEST_CASE("tool calls: read back from generated text, several, cut short, or none") {
  const std::string two = std::string(tool_calls_begin_token) + call("get_weather", R"({"city":"Paris"})") + "\n" +
                          call("add", R"({"a":1,"b":2})") + std::string(tool_calls_end_token);
  auto p = parse_tool_calls(two, "call_x_");
  REQUIRE(p);
  CHECK(p->complete);
  CHECK(p->content.empty());
  REQUIRE(p->calls.size() == 2);
  CHECK(p->calls[0] == tool_call{"call_x_0", "get_weather", R"({"city":"Paris"})"});
  CHECK(p->calls[1] == tool_call{"call_x_1", "add", R"({"a":1,"b":2})"});
  // max_tokens cut the second call: the first is whole, the block is not.
  auto cut = parse_tool_calls(two.substr(0, two.size() - 30), "c");
  REQUIRE(cut);
  CHECK_FALSE(cut->complete);
  CHECK(cut->calls.size() == 1);
  CHECK_FALSE(parse_tool_calls("plain text, no calls", "c"));
  auto after = parse_tool_calls("Let me look. " + two, "c");
  REQUIRE(after);
  CHECK(after->content == "Let me look. ");
  CHECK(after->calls.size() == 2);
}

TEST_CASE("tool calls: the tools' prompt section and the request's constraint") {
  std::vector<tool_function> fs = {{"get_weather", "The weather in a city", R"({"type":"object"})"}, {"ping", "", ""}};
  const std::string s = tools_prompt(fs);
  CHECK(s.find("### get_weather\nThe weather in a city\nParameters: {\"type\":\"object\"}\n") != std::string::npos);
  CHECK(s.find("### ping\nParameters: {\"type\":\"object\"}\n") != std::string::npos);
  CHECK(s.find(std::string(tool_calls_begin_token) + std::string(tool_call_begin_token) + "function") != std::string::npos);
  tool_config t{fs, tool_mode::function, "ping", true};
  auto c = tool_constraint(t, {constraint_kind::regex, "a+"});
  CHECK(c.kind == constraint_kind::tool_calls);
  auto j = nlohmann::json::parse(c.source);
  CHECK(j["mode"] == "function");
  CHECK(j["function"] == "ping");
  CHECK(j["functions"].size() == 2);
  CHECK(j["content"]["kind"] == "regex");
  // The section joins the first system message, or comes first as one.
  auto with = with_tools_prompt({{"system", "Be brief.", {}}, {"user", "hi", {}}}, fs);
  REQUIRE(with.size() == 2);
  CHECK(*with[0].content == "Be brief.\n\n" + s);
  auto alone = with_tools_prompt({{"user", "hi", {}}}, fs);
  REQUIRE(alone.size() == 2);
  CHECK(alone[0].role == "system");
  CHECK(*alone[0].content == s);
}

TEST_CASE("chat template: assistant tool calls and tool outputs render as Jinja2 renders DeepSeek-V3's template") {
  auto cfg = load_chat_template(std::string(SHOAL_SHARED_DIR) + "/tokenizers/deepseek-v3/tokenizer_config.json");
  REQUIRE_MESSAGE(cfg, cfg.error());
  std::vector<chat_message> ms = {
      {"system", "Be brief.", {}},
      {"user", "Weather in Paris?", {}},
      {"assistant", std::nullopt, {{"call_1", "get_weather", R"({"city":"Paris"})"}}},
      {"tool", R"({"temp":21})", {}},
      {"assistant", "It is 21 degrees.", {}},
      {"user", "And Rome, Oslo?", {}},
      {"assistant", std::nullopt, {{"call_2", "get_weather", R"({"city":"Rome"})"}, {"call_3", "get_weather", R"({"city":"Oslo"})"}}},
      {"tool", R"({"temp":25})", {}},
      {"tool", R"({"temp":9})", {}}};
  auto out = cfg->tmpl.render(ms, true, cfg->bos_token, cfg->eos_token);
  REQUIRE_MESSAGE(out, out.error());
  // Python: jinja2.Environment(trim_blocks=True, lstrip_blocks=True), the same messages.
  const std::string expected = nlohmann::json::parse(R"x("<\uff5cbegin\u2581of\u2581sentence\uff5c>Be brief.<\uff5cUser\uff5c>Weather in Paris?<\uff5cAssistant\uff5c><\uff5ctool\u2581calls\u2581begin\uff5c><\uff5ctool\u2581call\u2581begin\uff5c>function<\uff5ctool\u2581sep\uff5c>get_weather\n```json\n{\"city\":\"Paris\"}\n```<\uff5ctool\u2581call\u2581end\uff5c><\uff5ctool\u2581outputs\u2581begin\uff5c><\uff5ctool\u2581output\u2581begin\uff5c>{\"temp\":21}<\uff5ctool\u2581output\u2581end\uff5c><\uff5ctool\u2581outputs\u2581end\uff5c>It is 21 degrees.<\uff5cend\u2581of\u2581sentence\uff5c><\uff5cUser\uff5c>And Rome, Oslo?\n<\uff5ctool\u2581call\u2581begin\uff5c>function<\uff5ctool\u2581sep\uff5c>get_weather\n```json\n{\"city\":\"Rome\"}\n```<\uff5ctool\u2581call\u2581end\uff5c><\uff5ctool\u2581calls\u2581end\uff5c><\uff5cend\u2581of\u2581sentence\uff5c>\n<\uff5ctool\u2581call\u2581begin\uff5c>function<\uff5ctool\u2581sep\uff5c>get_weather\n```json\n{\"city\":\"Oslo\"}\n```<\uff5ctool\u2581call\u2581end\uff5c><\uff5ctool\u2581calls\u2581end\uff5c><\uff5cend\u2581of\u2581sentence\uff5c>\n<\uff5ctool\u2581output\u2581begin\uff5c>{\"temp\":25}<\uff5ctool\u2581output\u2581end\uff5c>\n<\uff5ctool\u2581output\u2581begin\uff5c>{\"temp\":9}<\uff5ctool\u2581output\u2581end\uff5c><\uff5ctool\u2581outputs\u2581end\uff5c>")x").get<std::string>();
  CHECK(*out == expected);
}
