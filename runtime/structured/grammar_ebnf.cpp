// EBNF grammars, GBNF-like: `name ::= alternatives`, with "literals" (escapes \n \r \t \\ \"
// \xHH \uHHHH \UHHHHHHHH), [classes] ([^...] negated, ranges, the same escapes), `.` (any code
// point), rule names, ( groups ), the postfix operators * + ? {m} {m,} {m,n}, and # comments.
// A rule ends where the next `name ::=` starts; the start rule is `root`.
#include <algorithm>
#include <cctype>
#include <map>

#include "runtime/structured/grammar_internal.hpp"

namespace shoal::runtime {

namespace {

using grammar_detail::ranges;

constexpr int64_t max_count = 1000;

class ebnf_parser {
 public:
  ebnf_parser(std::string_view t) : t_(t) {}

  std::optional<grammar_error> run(grammar& out) {
    skip();
    while (i_ < t_.size()) {
      const size_t at = i_;
      std::string name = ident();
      if (name.empty()) return error("expected a rule name", at);
      skip();
      if (t_.compare(i_, 3, "::=") != 0) return error("expected '::=' after rule name '" + name + "'", i_);
      i_ += 3;
      const uint32_t r = named(name, at);
      if (defined_.contains(name)) return error("rule '" + name + "' is defined twice", at);
      defined_.emplace(name, at);
      if (!alternatives(r, 0)) return err_;
      skip();
    }
    for (const auto& [name, at] : first_use_)
      if (!defined_.contains(name)) return error("rule '" + name + "' is used but not defined", at);
    auto root = rules_.find("root");
    if (root == rules_.end() || !defined_.contains("root")) return error("the grammar has no rule 'root'", 0);
    if (auto e = b_.finish(root->second, out)) return e;
    return std::nullopt;
  }

 private:
  std::string_view t_;
  size_t i_ = 0;
  grammar_builder b_;
  std::map<std::string, uint32_t> rules_;
  std::map<std::string, size_t> defined_, first_use_;
  std::optional<grammar_error> err_;

  std::optional<grammar_error> error(const std::string& msg, size_t at) {
    if (!err_) err_ = grammar_error{msg, grammar_detail::line_column(t_, at)};
    return err_;
  }
  bool fail(const std::string& msg, size_t at) {
    error(msg, at);
    return false;
  }

  void skip() {
    while (i_ < t_.size()) {
      if (std::isspace(static_cast<unsigned char>(t_[i_]))) ++i_;
      else if (t_[i_] == '#')
        while (i_ < t_.size() && t_[i_] != '\n') ++i_;
      else break;
    }
  }
  static bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }
  std::string ident() {
    const size_t s = i_;
    while (i_ < t_.size() && ident_char(t_[i_])) ++i_;
    return std::string(t_.substr(s, i_ - s));
  }
  // Is a `name ::=` next (the start of the next rule)?
  bool rule_start() const {
    size_t k = i_;
    while (k < t_.size() && ident_char(t_[k])) ++k;
    if (k == i_) return false;
    while (k < t_.size() && std::isspace(static_cast<unsigned char>(t_[k]))) ++k;
    return t_.compare(k, 3, "::=") == 0;
  }
  uint32_t named(const std::string& name, size_t at) {
    auto [it, fresh] = rules_.try_emplace(name, 0);
    if (fresh) {
      it->second = b_.rule(name);
      first_use_.emplace(name, at);
    }
    return it->second;
  }

  bool alternatives(uint32_t r, int depth) {
    if (depth > 100) return fail("groups nested deeper than 100", i_);
    for (;;) {
      grammar_builder::sequence seq;
      if (!sequence(seq, depth)) return false;
      b_.alt(r, std::move(seq));
      skip();
      if (i_ < t_.size() && t_[i_] == '|') {
        ++i_;
        continue;
      }
      return true;
    }
  }

  bool sequence(grammar_builder::sequence& out, int depth) {
    for (;;) {
      skip();
      if (i_ >= t_.size() || t_[i_] == '|' || t_[i_] == ')' || rule_start()) return true;
      grammar_builder::sequence item;
      if (!primary(item, depth)) return false;
      for (;;) {  // postfix operators
        skip();
        if (i_ >= t_.size()) break;
        const size_t at = i_;
        int64_t lo, hi;
        const char c = t_[i_];
        if (c == '*') lo = 0, hi = -1, ++i_;
        else if (c == '+') lo = 1, hi = -1, ++i_;
        else if (c == '?') lo = 0, hi = 1, ++i_;
        else if (c == '{') {
          if (!braces(lo, hi)) return false;
        } else break;
        if (lo > max_count || hi > max_count) return fail("repetition counts above 1000 are not supported", at);
        const uint32_t body = b_.choice({std::move(item)}, "repeated");
        item = {grammar_builder::ref(b_.repeat(body, lo, hi, "repeat"))};
      }
      out.insert(out.end(), item.begin(), item.end());
    }
  }

  bool braces(int64_t& lo, int64_t& hi) {
    const size_t at = i_++;
    auto number = [&](int64_t& v) {
      skip();
      const size_t s = i_;
      v = 0;
      while (i_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[i_])) && i_ - s < 9) v = v * 10 + (t_[i_++] - '0');
      return i_ > s;
    };
    if (!number(lo)) return fail("expected a count after '{'", at);
    hi = lo;
    skip();
    if (i_ < t_.size() && t_[i_] == ',') {
      ++i_;
      if (!number(hi)) hi = -1;
    }
    skip();
    if (i_ >= t_.size() || t_[i_] != '}') return fail("expected '}'", i_);
    ++i_;
    if (hi >= 0 && hi < lo) return fail("repetition range out of order", at);
    return true;
  }

  // One code point at i_ inside a literal or class: an escape or a UTF-8 character.
  std::optional<uint32_t> char_at() {
    const size_t at = i_;
    if (t_[i_] == '\\') {
      if (++i_ >= t_.size()) return error("unterminated escape", at), std::nullopt;
      const char c = t_[i_++];
      auto hex = [&](size_t n) -> std::optional<uint32_t> {
        uint32_t v = 0;
        for (size_t k = 0; k < n; ++k, ++i_) {
          if (i_ >= t_.size() || !std::isxdigit(static_cast<unsigned char>(t_[i_])))
            return error("expected a hex digit", i_), std::nullopt;
          const char h = t_[i_];
          v = v * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return error("escape is not a Unicode scalar value", at), std::nullopt;
        return v;
      };
      switch (c) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case 'x': return hex(2);
        case 'u': return hex(4);
        case 'U': return hex(8);
        case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': return static_cast<uint8_t>(c);
        default: return error(std::string("unknown escape \\") + c, at), std::nullopt;
      }
    }
    auto cp = grammar_detail::decode_utf8(t_, i_);
    if (!cp) return error("invalid UTF-8", at), std::nullopt;
    return cp;
  }

  static void utf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) out += static_cast<char>(cp);
    else if (cp < 0x800) out += {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    else if (cp < 0x10000)
      out += {static_cast<char>(0xE0 | (cp >> 12)), static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
              static_cast<char>(0x80 | (cp & 0x3F))};
    else
      out += {static_cast<char>(0xF0 | (cp >> 18)), static_cast<char>(0x80 | ((cp >> 12) & 0x3F)),
              static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
  }

  bool primary(grammar_builder::sequence& out, int depth) {
    const size_t at = i_;
    const char c = t_[i_];
    if (c == '"' || c == '\'') {
      ++i_;
      std::string bytes;
      for (;;) {
        if (i_ >= t_.size() || t_[i_] == '\n') return fail("unterminated string literal", at);
        if (t_[i_] == c) {
          ++i_;
          break;
        }
        auto cp = char_at();
        if (!cp) return false;
        utf8(*cp, bytes);
      }
      if (bytes.empty()) return true;  // "" is the empty sequence
      b_.append_literal(out, bytes);
      return true;
    }
    if (c == '[') {
      ++i_;
      bool negate = false;
      if (i_ < t_.size() && t_[i_] == '^') {
        negate = true;
        ++i_;
      }
      ranges set;
      for (;;) {
        if (i_ >= t_.size()) return fail("unterminated character class", at);
        if (t_[i_] == ']') {
          ++i_;
          break;
        }
        auto lo = char_at();
        if (!lo) return false;
        uint32_t hi = *lo;
        if (i_ + 1 < t_.size() && t_[i_] == '-' && t_[i_ + 1] != ']') {
          ++i_;
          auto h = char_at();
          if (!h) return false;
          if (*h < *lo) return fail("range out of order", at);
          hi = *h;
        }
        set.emplace_back(*lo, hi);
      }
      if (negate) set = grammar_detail::complement(std::move(set));
      if (set.empty()) return fail("empty character class", at);
      out.push_back(grammar_builder::ref(b_.codepoints(std::move(set), "class")));
      return true;
    }
    if (c == '.') {
      ++i_;
      out.push_back(grammar_builder::ref(b_.codepoints({{0, 0x10FFFF}}, "any")));
      return true;
    }
    if (c == '(') {
      ++i_;
      const uint32_t g = b_.rule("group");
      if (!alternatives(g, depth + 1)) return false;
      skip();
      if (i_ >= t_.size() || t_[i_] != ')') return fail("unterminated group", at);
      ++i_;
      out.push_back(grammar_builder::ref(g));
      return true;
    }
    if (ident_char(c)) {
      std::string name = ident();
      out.push_back(grammar_builder::ref(named(name, at)));
      return true;
    }
    return fail(std::string("unexpected character '") + c + "'", at);
  }
};

}  // namespace

std::optional<grammar_error> compile_ebnf(std::string_view text, grammar& out) {
  ebnf_parser p(text);
  return p.run(out);
}

}  // namespace shoal::runtime
