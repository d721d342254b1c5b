// What a request's output must match (structured output): a JSON schema (its text), any JSON
// object, a regular expression (the whole output), an EBNF grammar (start rule `root`), or
// tool calls (runtime/structured/tool_calls.hpp: the functions, the choice, and what content may be).
// A plain value that travels with the sampling parameters; runtime/structured/grammar.hpp compiles it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace shoal::runtime {

enum class constraint_kind : uint8_t { none, json_schema, json_object, regex, ebnf, tool_calls };

const char* to_string(constraint_kind k);
std::optional<constraint_kind> constraint_kind_from(std::string_view name);
std::optional<constraint_kind> constraint_kind_from_byte(uint8_t b);

struct constraint_spec {
  constraint_kind kind = constraint_kind::none;
  std::string source;  // the schema's JSON text, the regex or the grammar; empty for json_object
  bool active() const { return kind != constraint_kind::none; }
  friend bool operator==(const constraint_spec&, const constraint_spec&) = default;
};

}  // namespace shoal::runtime
