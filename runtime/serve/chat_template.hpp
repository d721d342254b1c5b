// Chat templates: the Jinja2 subset that HF tokenizer_config.json chat templates use, parsed
// once and rendered per request into the prompt text the tokenizer then encodes. There is no
// C++ Jinja library in Debian, so this is a small hand-written lexer, parser and evaluator
// (chat_template.cpp, chat_template_eval.cpp) matching Python Jinja2 3.x byte for byte on the
// DeepSeek-V3 template; anything outside the subset is an error value naming the construct.
#pragma once

#include <cstddef>
#include <expected>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/structured/tool_calls.hpp"

namespace shoal::runtime {

// One message as the template sees it: message['role'], message['content'] (none when absent)
// and, on an assistant message that called tools, message['tool_calls'] (a list of {'id',
// 'type': 'function', 'function': {'name', 'arguments'}}; undefined when there are none).
struct chat_message {
  std::string role;                    // system, user, assistant or tool
  std::optional<std::string> content;  // nullopt renders as Jinja's none
  std::vector<tool_call> tool_calls = {};
  bool operator==(const chat_message&) const = default;
};

// Lexer switches with transformers' defaults (apply_chat_template uses trim_blocks and
// lstrip_blocks); plain Jinja2 defaults are both false.
struct template_options {
  bool trim_blocks = true;    // drop the first newline after a {% %} or {# #} tag
  bool lstrip_blocks = true;  // drop spaces/tabs from line start up to a {% %} or {# #} tag
};

namespace detail {
struct template_program;  // the parsed statement tree (chat_template_ast.hpp)
}

// A parsed template; cheap to copy (shares the immutable tree) and safe to render from many
// threads at once. Supported: {% if/elif/else %}, {% for x in xs %} (with else, loop.*),
// {% set x = e %}, {% set ns.attr = e %}, comments, whitespace control (-/+), namespace(),
// raise_exception(), and/or/not, ==, !=, <, <=, >, >=, in, not in, + - * / // % ~,
// `a if c else b`, is [not] defined/undefined/none/string/number/boolean/mapping/sequence/
// iterable, filters trim/length/count/string/lower/upper, string methods strip/lstrip/rstrip/
// startswith/endswith/lower/upper, subscripts and attributes, list literals.
class chat_template {
 public:
  // Errors read "chat template: <what> at offset N" (N: byte offset in `source` with newlines
  // normalised to \n, as Jinja does before lexing).
  static std::expected<chat_template, std::string> parse(std::string_view source,
                                                         const template_options& options = {});

  // Variables: messages, add_generation_prompt, bos_token, eos_token. Errors (type errors,
  // undefined attributes, raise_exception('msg')) read "chat template: <what> at offset N".
  std::expected<std::string, std::string> render(const std::vector<chat_message>& messages,
                                                 bool add_generation_prompt,
                                                 const std::string& bos_token,
                                                 const std::string& eos_token) const;

 private:
  explicit chat_template(std::shared_ptr<const detail::template_program> p) : program_(std::move(p)) {}
  std::shared_ptr<const detail::template_program> program_;
};

struct chat_template_config {
  chat_template tmpl;
  std::string bos_token;  // "" when the file has none
  std::string eos_token;
};

// Reads chat_template (a string, or [{name, template}] where "default" wins, else the first),
// bos_token and eos_token (strings or {"content": ...} objects) from a tokenizer_config.json.
// A missing chat_template is an error: the caller decides on a fallback.
std::expected<chat_template_config, std::string> load_chat_template(
    const std::filesystem::path& tokenizer_config_json, const template_options& options = {});

}  // namespace shoal::runtime
