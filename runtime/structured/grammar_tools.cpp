// The tool-call front end: the source runtime/structured/tool_calls.cpp's tool_constraint writes (the
// mode, the functions with their parameter schemas, what content may be), compiled to the
// DeepSeek-V3 call format with each function's arguments constrained by its schema. The
// tool-call tokens are spelled as special_token_bytes, so the mask lets exactly those added
// tokens through where a call goes.
#include <nlohmann/json.hpp>

#include "runtime/structured/grammar.hpp"
#include "runtime/structured/tool_calls.hpp"

namespace shoal::runtime {

namespace {

using nlohmann::json;

void append_special(grammar_builder& b, grammar_builder::sequence& s, std::string_view token) {
  b.append_literal(s, special_token_bytes(token));
}

}  // namespace

std::optional<grammar_error> compile_tool_calls(std::string_view source, grammar& out) {
  json j = json::parse(source, nullptr, false);
  if (!j.is_object() || !j.contains("functions") || !j["functions"].is_array() || !j.contains("mode") ||
      !j["mode"].is_string())
    return grammar_error{"a tool-call constraint must be an object with 'mode' and 'functions'", ""};
  const std::string mode = j["mode"].get<std::string>();
  if (mode != "auto" && mode != "required" && mode != "function")
    return grammar_error{"unknown tool mode '" + mode + "' (auto, required or function)", "/mode"};
  const std::string only = j.value("function", std::string());
  const bool parallel = j.value("parallel", true) && mode != "function";
  grammar_builder b;
  std::vector<grammar_builder::sequence> calls;
  for (size_t i = 0; i < j["functions"].size(); ++i) {
    const json& f = j["functions"][i];
    const std::string where = "/functions/" + std::to_string(i);
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
      return grammar_error{"a function needs a name", where};
    const std::string name = f["name"].get<std::string>();
    if (mode == "function" && name != only) continue;
    const std::string params = f.value("parameters", std::string());
    grammar args;
    if (auto e = params.empty() ? compile_json_object(args) : compile_json_schema(params, args)) {
      e->where = where + "/parameters" + (e->where.empty() ? "" : " " + e->where);
      return e;
    }
    grammar_builder::sequence s;
    append_special(b, s, tool_call_begin_token);
    b.append_literal(s, "function");
    append_special(b, s, tool_sep_token);
    b.append_literal(s, name + "\n```json\n");
    s.push_back(grammar_builder::ref(b.embed(args, name + ".")));
    b.append_literal(s, "\n```");
    append_special(b, s, tool_call_end_token);
    calls.push_back(std::move(s));
  }
  if (calls.empty())
    return grammar_error{mode == "function" ? "no function named '" + only + "'" : "no functions", "/functions"};
  const uint32_t call = b.choice(std::move(calls), "call");
  grammar_builder::sequence block;
  append_special(b, block, tool_calls_begin_token);
  block.push_back(grammar_builder::ref(call));
  if (parallel) {
    grammar_builder::sequence more = b.literal("\n");
    more.push_back(grammar_builder::ref(call));
    block.push_back(grammar_builder::ref(b.repeat(b.choice({more}, "next_call"), 0, -1, "more_calls")));
  }
  append_special(b, block, tool_calls_end_token);
  const uint32_t root = b.rule("root");
  b.alt(root, block);
  if (mode == "auto") {
    const json* c = j.contains("content") && j["content"].is_object() ? &j["content"] : nullptr;
    grammar text;
    if (c) {
      auto kind = constraint_kind_from(c->value("kind", std::string()));
      if (!kind || *kind == constraint_kind::none || *kind == constraint_kind::tool_calls)
        return grammar_error{"content must be a json_schema, json_object, regex or ebnf constraint", "/content"};
      if (auto e = compile({*kind, c->value("source", std::string())}, text)) {
        e->where = "/content" + (e->where.empty() ? "" : " " + e->where);
        return e;
      }
      b.alt(root, {grammar_builder::ref(b.embed(text, "content."))});
    } else {  // any text: code points, none of them a tool-call token
      b.alt(root, {grammar_builder::ref(b.repeat(b.codepoints({{0, 0x10FFFF}}, "char"), 0, -1, "text"))});
    }
  }
  return b.finish(root, out);
}

}  // namespace shoal::runtime
