// Tests of runtime/chat_template against Python Jinja2: data/chat_template_goldens.json holds
// renders made by data/gen_chat_template_goldens.py (the DeepSeek-V3 template and the fallback
// of model/generate.cpp over 14 conversations x add_generation_prompt, plus snippets for the
// rest of the subset); no Python at test time. Then bad templates fail with named errors.
#include "runtime/serve/chat_template.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace shoal::runtime;
using json = nlohmann::json;

namespace {

json load_goldens() {
  std::ifstream f(fs::path(SHOAL_SOURCE_DIR) / "tests/runtime/data/chat_template_goldens.json");
  REQUIRE(f);
  return json::parse(f);
}

std::vector<chat_message> to_messages(const json& j) {
  std::vector<chat_message> out;
  for (const json& m : j) {
    chat_message msg{m["role"].get<std::string>(), std::nullopt};
    if (!m["content"].is_null()) msg.content = m["content"].get<std::string>();
    out.push_back(std::move(msg));
  }
  return out;
}

// Renders every golden case of one template; error cases must fail (any message).
int check_cases(const chat_template& t, const json& golden) {
  int n = 0;
  for (const json& c : golden["cases"]) {
    CAPTURE(c.dump());
    const auto out = t.render(to_messages(c["messages"]), c["add_generation_prompt"].get<bool>(),
                              golden["bos_token"].get<std::string>(), golden["eos_token"].get<std::string>());
    if (c["expected"].is_null()) {
      CHECK_FALSE(out.has_value());
    } else {
      REQUIRE_MESSAGE(out.has_value(), (out ? "" : out.error()));
      CHECK(*out == c["expected"].get<std::string>());
    }
    ++n;
  }
  return n;
}

std::string parse_error(std::string_view source) {
  const auto t = chat_template::parse(source);
  if (t) return "";
  return t.error();
}

std::string render_error(std::string_view source) {
  const auto t = chat_template::parse(source);
  REQUIRE_MESSAGE(t.has_value(), (t ? "" : t.error()));
  const auto out = t->render({{"user", "hi"}}, false, "", "");
  return out ? "" : out.error();
}

}  // namespace

TEST_CASE("chat_template: the DeepSeek-V3 template from tokenizer_config.json renders as Jinja2 does") {
  const json g = load_goldens()["templates"][0];
  REQUIRE(g["name"] == "deepseek-v3");
  const auto cfg = load_chat_template(fs::path(SHOAL_SHARED_DIR) / "tokenizers/deepseek-v3/tokenizer_config.json");
  REQUIRE_MESSAGE(cfg.has_value(), (cfg ? "" : cfg.error()));
  CHECK(cfg->bos_token == g["bos_token"].get<std::string>());
  CHECK(cfg->eos_token == g["eos_token"].get<std::string>());
  CHECK(check_cases(cfg->tmpl, g) == 28);
  // The golden file was made from the same template text.
  const auto again = chat_template::parse(g["template"].get<std::string>());
  REQUIRE(again.has_value());
  CHECK(check_cases(*again, g) == 28);
}

TEST_CASE("chat_template: the fallback template of model/generate.cpp renders as Jinja2 does") {
  const json g = load_goldens()["templates"][1];
  REQUIRE(g["name"] == "generate-fallback");
  const auto t = chat_template::parse(g["template"].get<std::string>());
  REQUIRE_MESSAGE(t.has_value(), (t ? "" : t.error()));
  CHECK(check_cases(*t, g) == 28);
}

TEST_CASE("chat_template: snippets of the subset render as Jinja2 does") {
  const json goldens = load_goldens();
  const auto messages = to_messages(json::parse(R"([
    {"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Tell me a joke."}])"));
  int n = 0;
  for (const json& s : goldens["snippets"]) {
    CAPTURE(s["template"].get<std::string>());
    template_options o{s["options"]["trim_blocks"].get<bool>(), s["options"]["lstrip_blocks"].get<bool>()};
    const auto t = chat_template::parse(s["template"].get<std::string>(), o);
    REQUIRE_MESSAGE(t.has_value(), (t ? "" : t.error()));
    const auto out = t->render(messages, true, "<s>", "</s>");
    if (s["expected"].is_null()) {
      CHECK_FALSE(out.has_value());
    } else {
      REQUIRE_MESSAGE(out.has_value(), (out ? "" : out.error()));
      CHECK(*out == s["expected"].get<std::string>());
    }
    ++n;
  }
  CHECK(n == 28);
}

TEST_CASE("chat_template: bad templates fail to parse with the construct and offset named") {
  struct bad {
    const char* source;
    const char* message;
  };
  const std::vector<bad> cases = {
      {"ab{% if x", "chat template: unterminated '{%' tag at offset 2"},
      {"{{ x ", "chat template: unterminated '{{' tag at offset 0"},
      {"{# note", "chat template: unterminated comment '{#' at offset 0"},
      {"{{ 'abc }}", "chat template: unterminated string literal at offset 3"},
      {"{% if x %}yes", "chat template: missing {% endif %} for the {% if %} opened at offset 0"},
      {"{% for m in messages %}", "chat template: missing {% endfor %} for the {% for %} opened at offset 0"},
      {"{{ x|shout }}", "chat template: unknown filter 'shout' at offset 5"},
      {"{{ x is odd }}", "chat template: unknown test 'odd' at offset 8"},
      {"{{ 1 + }}", "chat template: unexpected end of expression '}}' in expression at offset 7"},
      {"{{ (1 }}", "chat template: unexpected '}', expected ')' at offset 6"},
      {"{{ x ) }}", "chat template: unexpected ')' at offset 5"},
      {"{% macro m() %}{% endmacro %}", "chat template: unsupported tag 'macro' at offset 3"},
      {"{% endif %}", "chat template: unexpected {% endif %} at offset 0"},
      {"{% if x %}{% else %}{% elif y %}{% endif %}", "chat template: unexpected {% elif %} at offset 20"},
      {"{{ x[1:] }}", "chat template: slices are not supported at offset 6"},
      {"{{ {'a': 1} }}", "chat template: dict literals are not supported at offset 3"},
      {"{% for k, v in d %}{% endfor %}", "chat template: tuple unpacking in {% for %} is not supported at offset 8"},
      {"{% set x %}y{% endset %}", "chat template: block {% set %} is not supported at offset 9"},
      {"{{ x y }}", "chat template: expected '}}', got 'y' at offset 5"},
      {"{{ a ! b }}", "chat template: unexpected character '!' at offset 5"},
      {"{{ 2 ** 3 }}", "chat template: '**' is not supported at offset 5"},
  };
  for (const bad& b : cases) {
    CAPTURE(std::string(b.source));
    CHECK(parse_error(b.source) == b.message);
  }
  const std::string deep = "{{ " + std::string(500, '(') + "1" + std::string(500, ')') + " }}";
  CHECK(parse_error(deep) == "chat template: expression nested too deeply at offset 102");
}

TEST_CASE("chat_template: render errors are values naming the problem") {
  CHECK(render_error("{{ raise_exception('roles must alternate') }}") ==
        "chat template: raise_exception('roles must alternate') at offset 3");
  CHECK(render_error("{{ nothing.attr }}") == "chat template: cannot read 'attr' of an undefined value at offset 10");
  CHECK(render_error("{{ 'a' + none }}") ==
        "chat template: unsupported operand types for +: 'str' and 'NoneType' at offset 7");
  CHECK(render_error("{{ nothing + 'a' }}") == "chat template: undefined value used in '+' at offset 11");
  CHECK(render_error("{% for x in 3 %}{% endfor %}") == "chat template: 'int' object is not iterable at offset 12");
  CHECK(render_error("{% set x = 1 %}{% set x.y = 2 %}") ==
        "chat template: cannot assign attribute 'y' on 'x', which is not a namespace at offset 15");
  CHECK(render_error("{{ 1 // 0 }}") == "chat template: division by zero at offset 5");
  CHECK(render_error("{{ 3|length }}") == "chat template: object of type 'int' has no len() at offset 4");
  CHECK(render_error("{{ 'a'.zfill(3) }}") == "chat template: unsupported string method 'zfill' at offset 6");
  CHECK(render_error("{{ 'ab' * 100000000 }}") == "chat template: string too long at offset 8");
  // A user message without content: the DeepSeek template concatenates it (a TypeError in Jinja2).
  const auto cfg = load_chat_template(fs::path(SHOAL_SHARED_DIR) / "tokenizers/deepseek-v3/tokenizer_config.json");
  REQUIRE(cfg.has_value());
  const auto out = cfg->tmpl.render({{"user", std::nullopt}}, true, cfg->bos_token, cfg->eos_token);
  REQUIRE_FALSE(out.has_value());
  CHECK(out.error().find("unsupported operand types for +: 'str' and 'NoneType'") != std::string::npos);
}

TEST_CASE("chat_template: load_chat_template reports missing files and fields") {
  const fs::path dir = fs::temp_directory_path() / "shoal_chat_template_test";
  fs::create_directories(dir);
  const auto write = [&](const char* name, const std::string& text) {
    std::ofstream(dir / name, std::ios::binary) << text;
    return dir / name;
  };
  CHECK(load_chat_template(dir / "absent.json").error() == "cannot read " + (dir / "absent.json").string());
  const fs::path none = write("none.json", R"({"bos_token": "<s>"})");
  CHECK(load_chat_template(none).error() == none.string() + ": no chat_template");
  const fs::path bad = write("bad.json", R"({"chat_template": "{% if %}"})");
  CHECK(load_chat_template(bad).error() ==
        bad.string() + ": chat template: unexpected end of tag '%}' in expression at offset 6");
  const fs::path list = write("list.json", R"({"chat_template": [{"name": "tool_use", "template": "T"},
      {"name": "default", "template": "D{{ bos_token }}"}], "bos_token": {"content": "<b>"}, "eos_token": null})");
  const auto cfg = load_chat_template(list);
  REQUIRE(cfg.has_value());
  CHECK(cfg->bos_token == "<b>");
  CHECK(cfg->eos_token == "");
  CHECK(cfg->tmpl.render({}, false, cfg->bos_token, cfg->eos_token).value() == "D<b>");
  const fs::path wrong = write("wrong.json", R"({"chat_template": "x", "eos_token": 5})");
  CHECK(load_chat_template(wrong).error() ==
        wrong.string() + ": field 'eos_token' must be a string or {\"content\": string}");
  fs::remove_all(dir);
}

TEST_CASE("chat_template: long chains are bounded and seeded mutations of a real template never crash") {
  CHECK(parse_error("{{ 1" + [] { std::string s; for (int i = 0; i < 10000; ++i) s += "+1"; return s; }() + " }}") ==
        "chat template: expression nested too deeply at offset 514");
  CHECK(parse_error("{{ x" + [] { std::string s; for (int i = 0; i < 1000; ++i) s += "|trim"; return s; }() + " }}")
            .find("expression nested too deeply") != std::string::npos);

  const json g = load_goldens()["templates"][0];
  const std::string source = g["template"].get<std::string>();
  const auto messages = to_messages(g["cases"][10]["messages"]);  // system, user, tool turns
  std::mt19937 rng(1);
  const std::string significant = "{}%#-+'\"()[]|.,=~ \n\\ab01";
  int parsed = 0, rendered = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string s = source;
    for (int k = 0; k < 1 + static_cast<int>(rng() % 3); ++k) {
      const size_t at = rng() % s.size();
      switch (rng() % 4) {
        case 0: s.resize(at); break;
        case 1: s[at] = significant[rng() % significant.size()]; break;
        case 2: s.erase(at, rng() % 16); break;
        default: s.insert(at, s.substr(rng() % s.size(), rng() % 16)); break;
      }
      if (s.empty()) s = "x";
    }
    const auto t = chat_template::parse(s);
    if (!t) {
      CHECK(t.error().starts_with("chat template: "));
      continue;
    }
    ++parsed;
    const auto out = t->render(messages, true, "<s>", "</s>");
    if (out) ++rendered;
    else CHECK(out.error().starts_with("chat template: "));
  }
  MESSAGE("mutations parsed: " << parsed << ", rendered: " << rendered);
  CHECK(parsed > 0);
}

// Found by the chat_template fuzzer: a namespace stored in itself (or two in each other) is a
// shared_ptr cycle; every render emptied it at the end, or each request leaked it. The
// sanitizer build's LeakSanitizer fails this test if the cycle outlives the render.
TEST_CASE("chat_template: a namespace stored in itself or in another renders and leaves no cycle behind") {
  auto t = chat_template::parse(
      "{% set ns = namespace(a=1) %}{% set ns.self = ns %}{% set other = namespace(back=ns) %}"
      "{% set ns.other = other %}{{ ns.self.a }}-{{ ns.other.back.a }}");
  REQUIRE_MESSAGE(t, t.error());
  for (int i = 0; i < 3; ++i) {
    auto r = t->render({}, false, "", "");
    REQUIRE_MESSAGE(r, r.error());
    CHECK(*r == "1-1");
  }
  // Printed, such a namespace ends its repr after 64 levels (Python prints a recursive
  // container as {...}); found by the fuzzer as a stack overflow.
  auto printed = chat_template::parse("{% set ns = namespace(n=0) %}{% set ns.n = ns %}{{ ns }}");
  REQUIRE_MESSAGE(printed, printed.error());
  auto r = printed->render({}, false, "", "");
  REQUIRE_MESSAGE(r, r.error());
  CHECK(r->starts_with("<Namespace {'n': <Namespace {'n': "));
  CHECK(r->find("...") != std::string::npos);
}
