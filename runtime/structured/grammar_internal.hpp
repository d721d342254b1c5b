// Shared by the grammar front ends (grammar_json.cpp, grammar_regex.cpp, grammar_ebnf.cpp):
// the JSON building blocks and the regex compiler as a rule inside a larger grammar.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/structured/grammar.hpp"

namespace shoal::runtime::grammar_detail {

using ranges = std::vector<std::pair<uint32_t, uint32_t>>;

// The code points of [0, U+10FFFF] outside `in`.
ranges complement(ranges in);
// The UTF-8 character at s[i] (i advanced past it), or nullopt (i unchanged) when the bytes
// there are not one.
std::optional<uint32_t> decode_utf8(std::string_view s, size_t& i);

// "line L, column C" (1-based, columns in bytes) of `offset` in `text`.
std::string line_column(std::string_view text, size_t offset);

// JSON text pieces, each rule made on first use. Output is compact JSON with one optional
// space after ':' and ','. Numbers: at most 16 integer digits, 16 fraction digits and a
// 3-digit exponent; strings: any code point, escapes limited to the JSON ones (no lone
// surrogate).
class json_rules {
 public:
  explicit json_rules(grammar_builder& b) : b_(b) {}
  uint32_t sp();        // " " or nothing
  uint32_t chr();       // one code point inside a string, raw or escaped
  uint32_t string();    // "..."
  uint32_t integer();
  uint32_t number();
  uint32_t value();     // any JSON value
  uint32_t object();    // any JSON object
  uint32_t array();     // any JSON array
  // One code point of `set` as it may appear inside a JSON string: raw, or escaped where
  // JSON requires it ('"', '\\', controls).
  uint32_t string_codepoints(const ranges& set, const std::string& name);
  grammar_builder& builder() { return b_; }

 private:
  grammar_builder& b_;
  std::optional<uint32_t> sp_, chr_, string_, integer_, number_, value_, object_, array_;
};

// The regex `pattern` (ECMAScript syntax: classes, escapes, groups, alternation, greedy or lazy
// quantifiers; no backreferences or lookaround) as a rule. in_json_string: the rule matches
// the pattern's strings as JSON string contents (escaped), with JSON schema's unanchored
// semantics (any text before unless ^, after unless $); otherwise the whole text must match.
std::optional<uint32_t> regex_rule(grammar_builder& b, std::string_view pattern, bool in_json_string,
                                   grammar_error& err);

}  // namespace shoal::runtime::grammar_detail
