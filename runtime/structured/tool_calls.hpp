// Tool calling in the DeepSeek-V3 chat format: the functions a request offers, the constraint
// that makes the model's tool calls well formed (arguments matching each function's JSON
// schema), the prompt section that describes the tools to the model, and reading the calls
// back out of the generated text. A call is written as the DeepSeek-V3 chat template renders
// an assistant message's tool_calls:
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>
// further calls each after "\n", and <｜tool▁calls▁end｜> last.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/structured/constraint.hpp"

namespace shoal::runtime {

// The tool-call tokens of the DeepSeek-V3 tokenizer (added tokens).
inline constexpr std::string_view tool_calls_begin_token = "<｜tool▁calls▁begin｜>";
inline constexpr std::string_view tool_calls_end_token = "<｜tool▁calls▁end｜>";
inline constexpr std::string_view tool_call_begin_token = "<｜tool▁call▁begin｜>";
inline constexpr std::string_view tool_call_end_token = "<｜tool▁call▁end｜>";
inline constexpr std::string_view tool_sep_token = "<｜tool▁sep｜>";

struct tool_function {
  std::string name;         // 1 to 64 of [A-Za-z0-9_-]
  std::string description;  // may be empty
  std::string parameters;   // a JSON schema's text; empty: any JSON object
  bool operator==(const tool_function&) const = default;
};

// none: the model answers in text (no constraint from the tools); auto: text or tool calls;
// required: one or more tool calls; function: one call of the named function.
enum class tool_mode : uint8_t { none, auto_, required, function };

struct tool_config {
  std::vector<tool_function> functions;
  tool_mode mode = tool_mode::none;
  std::string function;  // mode function: its name
  bool parallel = true;  // more than one call per reply (auto, required)
  bool active() const { return !functions.empty() && mode != tool_mode::none; }
  bool operator==(const tool_config&) const = default;
};

struct tool_call {
  std::string id;         // "call_…", unique within the response
  std::string name;
  std::string arguments;  // JSON text, as generated
  bool operator==(const tool_call&) const = default;
};

// The constraint of a request with active tools: its output is tool calls (required,
// function) or either tool calls or `content` (auto; content none: any text).
constraint_spec tool_constraint(const tool_config& t, const constraint_spec& content);

// The tools described for the model: a system-prompt section naming each function, its
// description and parameter schema, and the call format.
std::string tools_prompt(const std::vector<tool_function>& functions);

// Generated text read back: the text before the calls block and the calls. nullopt when the
// text has no calls block; `complete` is false when the block was cut short (max_tokens),
// and then `calls` holds the calls that were whole. Ids are `id_prefix` + the call's index.
struct tool_output {
  std::string content;
  std::vector<tool_call> calls;
  bool complete = false;
};
std::optional<tool_output> parse_tool_calls(std::string_view text, const std::string& id_prefix);

}  // namespace shoal::runtime
