// Regular expressions (ECMAScript syntax, as JSON schema's `pattern` uses) compiled straight
// into grammar rules by a recursive-descent parser: alternation → rule, concatenation →
// sequence, quantifiers → grammar_builder::repeat, classes → code point sets.
#include <algorithm>
#include <cctype>

#include "runtime/structured/grammar_internal.hpp"

namespace shoal::runtime {

namespace grammar_detail {

namespace {
constexpr uint32_t max_cp = 0x10FFFF;
}  // namespace

ranges complement(ranges in) {
  std::sort(in.begin(), in.end());
  ranges out;
  uint32_t next = 0;
  for (auto [lo, hi] : in) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = std::max(next, hi + 1);
  }
  if (next <= max_cp) out.emplace_back(next, max_cp);
  return out;
}

std::optional<uint32_t> decode_utf8(std::string_view s, size_t& i) {
  if (i >= s.size()) return std::nullopt;
  const auto c0 = static_cast<uint8_t>(s[i]);
  const size_t n = c0 < 0x80 ? 1 : (c0 >> 5) == 6 ? 2 : (c0 >> 4) == 14 ? 3 : (c0 >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return std::nullopt;
  uint32_t cp = n == 1 ? c0 : n == 2 ? (c0 & 0x1F) : n == 3 ? (c0 & 0x0F) : (c0 & 0x07);
  for (size_t k = 1; k < n; ++k) {
    const auto c = static_cast<uint8_t>(s[i + k]);
    if ((c >> 6) != 2) return std::nullopt;
    cp = (cp << 6) | (c & 0x3F);
  }
  i += n;
  return cp;
}

namespace {

constexpr int64_t max_count = 1000;

const ranges& digits() {
  static const ranges r = {{'0', '9'}};
  return r;
}
const ranges& word() {
  static const ranges r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  return r;
}
const ranges& space() {
  static const ranges r = {{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
                           {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
  return r;
}

class parser {
 public:
  parser(grammar_builder& b, std::string_view p, bool js, grammar_error& err) : b_(b), j_(b), p_(p), js_(js), err_(err) {}

  std::optional<uint32_t> top() {
    // Top-level branches carry their own anchors.
    std::vector<grammar_builder::sequence> branches;
    for (;;) {
      bool start = false, end = false;
      if (peek('^')) {
        ++i_;
        start = true;
      }
      auto seq = concat(0, true, &end);
      if (!seq) return std::nullopt;
      if (js_) {
        const uint32_t any = b_.repeat(j_.chr(), 0, -1, "regex-any");
        if (!start) seq->insert(seq->begin(), b_.ref(any));
        if (!end) seq->push_back(b_.ref(any));
      }
      branches.push_back(std::move(*seq));
      if (i_ >= p_.size()) break;
      if (p_[i_] == '|') {
        ++i_;
        continue;
      }
      return fail(p_[i_] == ')' ? "unmatched ')'" : "unexpected character");
    }
    return b_.choice(std::move(branches), "regex");
  }

 private:
  grammar_builder& b_;
  json_rules j_;
  std::string_view p_;
  bool js_;
  grammar_error& err_;
  size_t i_ = 0;

  std::nullopt_t fail(const std::string& msg, std::optional<size_t> at = std::nullopt) {
    if (err_.message.empty()) err_ = grammar_error{msg, "offset " + std::to_string(at.value_or(i_))};
    return std::nullopt;
  }
  bool peek(char c) const { return i_ < p_.size() && p_[i_] == c; }

  // One UTF-8 code point at i_.
  std::optional<uint32_t> codepoint() {
    auto cp = decode_utf8(p_, i_);
    if (!cp) return fail("invalid UTF-8");
    return cp;
  }

  std::optional<uint32_t> hex(size_t n) {
    uint32_t v = 0;
    for (size_t k = 0; k < n; ++k, ++i_) {
      if (i_ >= p_.size() || !std::isxdigit(static_cast<unsigned char>(p_[i_]))) return fail("expected a hex digit");
      const char c = p_[i_];
      v = v * 16 + static_cast<uint32_t>(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
  }

  // After a backslash: a set (class escapes) or one code point. in_class: \b is backspace.
  bool escape(ranges& set, bool in_class) {
    if (i_ >= p_.size()) return fail("a pattern cannot end with a backslash"), false;
    const char c = p_[i_++];
    auto one = [&](uint32_t cp) {
      set.emplace_back(cp, cp);
      return true;
    };
    switch (c) {
      case 'd': set.insert(set.end(), digits().begin(), digits().end()); return true;
      case 'D': { auto x = complement(digits()); set.insert(set.end(), x.begin(), x.end()); return true; }
      case 'w': set.insert(set.end(), word().begin(), word().end()); return true;
      case 'W': { auto x = complement(word()); set.insert(set.end(), x.begin(), x.end()); return true; }
      case 's': set.insert(set.end(), space().begin(), space().end()); return true;
      case 'S': { auto x = complement(space()); set.insert(set.end(), x.begin(), x.end()); return true; }
      case 'n': return one('\n');
      case 'r': return one('\r');
      case 't': return one('\t');
      case 'f': return one('\f');
      case 'v': return one('\v');
      case '0': return one(0);
      case 'x': { auto v = hex(2); return v ? one(*v) : false; }
      case 'u':
        if (peek('{')) {
          ++i_;
          uint32_t v = 0;
          size_t n = 0;
          while (i_ < p_.size() && std::isxdigit(static_cast<unsigned char>(p_[i_])) && n < 6) {
            auto d = hex(1);
            v = v * 16 + *d;
            ++n;
          }
          if (n == 0 || !peek('}') || v > max_cp) return fail("bad \\u{...} escape"), false;
          ++i_;
          return one(v);
        } else {
          auto v = hex(4);
          return v ? one(*v) : false;
        }
      case 'b':
        if (in_class) return one('\b');
        return fail("word boundaries (\\b) are not supported", i_ - 2), false;
      case 'B': return fail("word boundaries (\\B) are not supported", i_ - 2), false;
      default: break;
    }
    if (c >= '1' && c <= '9') return fail("backreferences are not supported", i_ - 2), false;
    if (std::isalnum(static_cast<unsigned char>(c))) return fail(std::string("unknown escape \\") + c, i_ - 2), false;
    --i_;
    auto cp = codepoint();
    return cp ? one(*cp) : false;
  }

  std::optional<ranges> char_class() {  // after '['
    const size_t open = i_ - 1;
    bool negate = false;
    if (peek('^')) {
      negate = true;
      ++i_;
    }
    ranges set;
    for (;;) {
      if (i_ >= p_.size()) return fail("unterminated character class", open);
      if (p_[i_] == ']') {
        ++i_;
        break;
      }
      ranges item;
      if (p_[i_] == '\\') {
        ++i_;
        if (!escape(item, true)) return std::nullopt;
      } else {
        auto cp = codepoint();
        if (!cp) return std::nullopt;
        item.emplace_back(*cp, *cp);
      }
      if (peek('-') && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        if (item.size() != 1 || item[0].first != item[0].second) return fail("a class escape cannot start a range");
        ++i_;
        ranges to;
        if (p_[i_] == '\\') {
          ++i_;
          if (!escape(to, true)) return std::nullopt;
        } else {
          auto cp = codepoint();
          if (!cp) return std::nullopt;
          to.emplace_back(*cp, *cp);
        }
        if (to.size() != 1 || to[0].first != to[0].second) return fail("a class escape cannot end a range");
        if (to[0].first < item[0].first) return fail("range out of order");
        set.emplace_back(item[0].first, to[0].first);
      } else {
        set.insert(set.end(), item.begin(), item.end());
      }
    }
    if (negate) set = complement(std::move(set));
    if (set.empty()) return fail("an empty character class matches nothing", open);
    return set;
  }

  grammar_builder::sequence emit(const ranges& set) {
    if (js_) return {b_.ref(j_.string_codepoints(set, "regex-class"))};
    if (set.size() == 1 && set[0].first == set[0].second && set[0].first < 0x80)
      return {b_.byte(static_cast<uint8_t>(set[0].first))};
    return {b_.ref(b_.codepoints(set, "regex-class"))};
  }

  std::optional<grammar_builder::sequence> atom(int depth) {
    const char c = p_[i_];
    if (c == '(') {
      const size_t open = i_++;
      if (peek('?')) {
        if (i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
          i_ += 2;
        } else if (i_ + 1 < p_.size() && p_[i_ + 1] == '<' && i_ + 2 < p_.size() && p_[i_ + 2] != '=' && p_[i_ + 2] != '!') {
          const size_t close = p_.find('>', i_);
          if (close == std::string_view::npos) return fail("unterminated group name");
          i_ = close + 1;
        } else {
          return fail("lookaround and other (? groups are not supported", open);
        }
      }
      std::vector<grammar_builder::sequence> alts;
      for (;;) {
        auto seq = concat(depth + 1, false, nullptr);
        if (!seq) return std::nullopt;
        alts.push_back(std::move(*seq));
        if (peek('|')) {
          ++i_;
          continue;
        }
        if (peek(')')) {
          ++i_;
          break;
        }
        return fail("unterminated group", open);
      }
      return grammar_builder::sequence{b_.ref(b_.choice(std::move(alts), "regex-group"))};
    }
    if (c == '[') {
      ++i_;
      auto set = char_class();
      if (!set) return std::nullopt;
      return emit(*set);
    }
    if (c == '.') {
      ++i_;
      return emit(complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
    }
    if (c == '\\') {
      ++i_;
      ranges set;
      if (!escape(set, false)) return std::nullopt;
      return emit(set);
    }
    if (c == '*' || c == '+' || c == '?') return fail("nothing to repeat");
    if (c == '^' || c == '$') return fail("anchors are supported only at the start and end of the pattern");
    auto cp = codepoint();
    if (!cp) return std::nullopt;
    return emit({{*cp, *cp}});
  }

  // {n}, {n,}, {n,m} at i_ (after the atom); false (i_ unchanged) when not a quantifier.
  bool braces(int64_t& lo, int64_t& hi) {
    size_t k = i_ + 1;
    auto number = [&](int64_t& v) {
      const size_t s = k;
      v = 0;
      while (k < p_.size() && std::isdigit(static_cast<unsigned char>(p_[k])) && k - s < 9) v = v * 10 + (p_[k++] - '0');
      return k > s;
    };
    if (!number(lo)) return false;
    hi = lo;
    if (k < p_.size() && p_[k] == ',') {
      ++k;
      if (!number(hi)) hi = -1;
    }
    if (k >= p_.size() || p_[k] != '}') return false;
    i_ = k + 1;
    return true;
  }

  std::optional<grammar_builder::sequence> concat(int depth, bool top, bool* anchored_end) {
    if (depth > 100) return fail("groups nested deeper than 100");
    grammar_builder::sequence out;
    while (i_ < p_.size() && p_[i_] != '|' && p_[i_] != ')') {
      if (top && p_[i_] == '$' && (i_ + 1 == p_.size() || p_[i_ + 1] == '|')) {
        ++i_;
        if (anchored_end) *anchored_end = true;
        break;
      }
      const size_t at = i_;
      auto a = atom(depth);
      if (!a) return std::nullopt;
      int64_t lo = 1, hi = 1;
      bool quantified = true;
      if (peek('*')) lo = 0, hi = -1, ++i_;
      else if (peek('+')) lo = 1, hi = -1, ++i_;
      else if (peek('?')) lo = 0, hi = 1, ++i_;
      else if (!(peek('{') && braces(lo, hi))) quantified = false;
      if (quantified) {
        if (hi >= 0 && hi < lo) return fail("quantifier range out of order", at);
        if (lo > max_count || hi > max_count) return fail("repetition counts above 1000 are not supported", at);
        if (peek('?')) ++i_;  // lazy: the same strings
        const uint32_t body = b_.choice({std::move(*a)}, "regex-atom");
        out.push_back(b_.ref(b_.repeat(body, lo, hi, "regex-repeat")));
        if (peek('*') || peek('+') || peek('?') || peek('{')) {
          int64_t l2, h2;
          size_t save = i_;
          if (!peek('{') || braces(l2, h2)) return fail("nothing to repeat", save);
        }
      } else {
        out.insert(out.end(), a->begin(), a->end());
      }
    }
    return out;
  }
};

}  // namespace

std::optional<uint32_t> regex_rule(grammar_builder& b, std::string_view pattern, bool in_json_string,
                                   grammar_error& err) {
  err = {};
  parser p(b, pattern, in_json_string, err);
  auto r = p.top();
  if (!r && err.message.empty()) err = grammar_error{"invalid pattern", ""};
  return r;
}

}  // namespace grammar_detail

std::optional<grammar_error> compile_regex(std::string_view pattern, grammar& out) {
  grammar_builder b;
  grammar_error err;
  auto r = grammar_detail::regex_rule(b, pattern, false, err);
  if (!r) return err;
  return b.finish(*r, out);
}

}  // namespace shoal::runtime
