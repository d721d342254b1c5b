#include "runtime/structured/tool_calls.hpp"

#include <nlohmann/json.hpp>

namespace shoal::runtime {

namespace {

using nlohmann::ordered_json;

constexpr std::string_view args_open = "\n```json\n";
constexpr std::string_view args_close = "\n```";

const char* mode_name(tool_mode m) {
  switch (m) {
    case tool_mode::none: return "none";
    case tool_mode::auto_: return "auto";
    case tool_mode::required: return "required";
    case tool_mode::function: return "function";
  }
  return "none";
}

}  // namespace

constraint_spec tool_constraint(const tool_config& t, const constraint_spec& content) {
  ordered_json j;
  j["mode"] = mode_name(t.mode);
  j["function"] = t.function;
  j["parallel"] = t.parallel;
  j["functions"] = ordered_json::array();
  for (const auto& f : t.functions) j["functions"].push_back({{"name", f.name}, {"parameters", f.parameters}});
  j["content"] = content.active() ? ordered_json{{"kind", to_string(content.kind)}, {"source", content.source}}
                                  : ordered_json(nullptr);
  return {constraint_kind::tool_calls, j.dump()};
}

std::string tools_prompt(const std::vector<tool_function>& functions) {
  std::string s = "## Tools\n\nYou can call the functions listed below. To call functions, reply with the calls only, "
                  "in this format:\n";
  s += std::string(tool_calls_begin_token) + std::string(tool_call_begin_token) + "function" +
       std::string(tool_sep_token) + "FUNCTION_NAME" + std::string(args_open) + "ARGUMENTS" + std::string(args_close) +
       std::string(tool_call_end_token) + std::string(tool_calls_end_token) + "\n";
  s += "ARGUMENTS is a JSON object that matches the function's parameters. For several calls, write each further " +
       std::string(tool_call_begin_token) + "…" + std::string(tool_call_end_token) + " on a new line before " +
       std::string(tool_calls_end_token) + ".\n";
  for (const auto& f : functions) {
    s += "\n### " + f.name + "\n";
    if (!f.description.empty()) s += f.description + "\n";
    s += "Parameters: " + (f.parameters.empty() ? std::string("{\"type\":\"object\"}") : f.parameters) + "\n";
  }
  return s;
}

std::optional<tool_output> parse_tool_calls(std::string_view text, const std::string& id_prefix) {
  const size_t at = text.find(tool_calls_begin_token);
  if (at == std::string_view::npos) return std::nullopt;
  tool_output out;
  out.content = std::string(text.substr(0, at));
  std::string_view rest = text.substr(at + tool_calls_begin_token.size());
  const auto eat = [&](std::string_view s) {
    if (!rest.starts_with(s)) return false;
    rest.remove_prefix(s.size());
    return true;
  };
  while (true) {
    if (eat(tool_calls_end_token)) {
      out.complete = true;
      break;
    }
    if (!out.calls.empty() && !eat("\n")) break;
    if (!eat(tool_call_begin_token)) break;
    const size_t sep = rest.find(tool_sep_token);
    if (sep == std::string_view::npos) break;
    rest.remove_prefix(sep + tool_sep_token.size());  // the call's type: "function"
    const size_t open = rest.find(args_open);
    if (open == std::string_view::npos) break;
    tool_call c;
    c.name = std::string(rest.substr(0, open));
    rest.remove_prefix(open + args_open.size());
    const std::string close = std::string(args_close) + std::string(tool_call_end_token);
    const size_t end = rest.find(close);
    if (end == std::string_view::npos) break;
    c.arguments = std::string(rest.substr(0, end));
    rest.remove_prefix(end + close.size());
    c.id = id_prefix + std::to_string(out.calls.size());
    out.calls.push_back(std::move(c));
  }
  return out;
}

}  // namespace shoal::runtime
