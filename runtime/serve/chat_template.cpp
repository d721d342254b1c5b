// Lexer and parser of the chat-template Jinja2 subset (hand-written: no C++ Jinja in Debian),
// plus load_chat_template. The lexer mirrors jinja2/lexer.py: newlines normalised, one trailing
// newline dropped, `-`/`+` whitespace control, trim_blocks and lstrip_blocks with the same
// "line_starting" rule; the parser mirrors jinja2/parser.py's precedence (tests and filters bind
// tighter than any binary operator, so `not x is defined` is `not (x is defined)`).
#include "runtime/serve/chat_template.hpp"

#include "runtime/serve/chat_template_ast.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <fstream>
#include <iterator>

namespace shoal::runtime {

namespace {

using detail::expr;
using detail::expr_kind;
using detail::stmt;
using detail::stmt_kind;
using detail::value;

enum class tok : uint8_t { data, block_begin, block_end, var_begin, var_end, name, string, number, op, eof };

struct token {
  tok kind = tok::eof;
  std::string text;  // data, name, decoded string, operator; number: its spelling
  value num;         // number: int64_t or double
  size_t offset = 0;
};

std::unexpected<std::string> fail(const std::string& what, size_t offset) {
  return std::unexpected("chat template: " + what + " at offset " + std::to_string(offset));
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Jinja joins source lines with \n (so \r\n and \r become \n) and drops one trailing newline.
std::string normalise_newlines(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      out += '\n';
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      out += s[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Python "unicode-escape" decoding of a string literal's body (what Jinja applies); unknown
// escapes stay as written, as in Python.
std::expected<std::string, std::string> decode_escapes(std::string_view s, size_t offset) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char c = s[++i];
    static constexpr std::string_view simple = "n\nt\tr\r\\\\''\"\"a\ab\bf\fv\v";
    if (size_t k = simple.find(c); k != std::string_view::npos && k % 2 == 0) {
      out += simple[k + 1];
    } else if (c == 'x' || c == 'u' || c == 'U') {
      const size_t n = c == 'x' ? 2 : c == 'u' ? 4 : 8;
      uint32_t cp = 0;
      auto [p, ec] = std::from_chars(s.data() + i + 1, s.data() + std::min(s.size(), i + 1 + n), cp, 16);
      if (ec != std::errc() || p != s.data() + i + 1 + n || cp > 0x10FFFF)
        return fail(std::string("bad \\") + c + " escape in string literal", offset);
      append_utf8(out, cp);
      i += n;
    } else if (c >= '0' && c <= '7') {
      uint32_t cp = 0;
      size_t n = 0;
      for (; n < 3 && i + n < s.size() && s[i + n] >= '0' && s[i + n] <= '7'; ++n) cp = cp * 8 + (s[i + n] - '0');
      append_utf8(out, cp);
      i += n - 1;
    } else {
      out += '\\';
      out += c;
    }
  }
  return out;
}

class lexer {
 public:
  lexer(const std::string& src, const template_options& o) : s_(src), o_(o) {}

  std::expected<std::vector<token>, std::string> run() {
    while (pos_ < s_.size()) {
      size_t p = s_.find('{', pos_);
      while (p != std::string::npos && (p + 1 >= s_.size() || std::string_view("{%#").find(s_[p + 1]) == std::string_view::npos))
        p = s_.find('{', p + 1);
      if (p == std::string::npos) {
        push_data(s_.substr(pos_), pos_);
        break;
      }
      const char kind = s_[p + 1];
      const char sign = p + 2 < s_.size() && (s_[p + 2] == '-' || s_[p + 2] == '+') ? s_[p + 2] : 0;
      std::string text = s_.substr(pos_, p - pos_);
      if (sign == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (sign != '+' && o_.lstrip_blocks && kind != '{') {
        const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((l_pos > 0 || line_starting_) && l_pos < text.size() &&
            std::all_of(text.begin() + l_pos, text.end(), is_space))
          text.resize(l_pos);
      }
      push_data(std::move(text), pos_);
      pos_ = p + 2 + (sign ? 1 : 0);
      SHOAL_TEMPLATE_CHECK(kind == '#' ? comment(p) : tag(kind, p));
    }
    out_.push_back({tok::eof, "", {}, s_.size()});
    return std::move(out_);
  }

 private:
  void push_data(std::string text, size_t offset) {
    if (!text.empty()) out_.push_back({tok::data, std::move(text), {}, offset});
  }

  // After a tag's closing delimiter at `end`: `-` eats all whitespace, trim_blocks one \n.
  void finish_tag(size_t end, char sign, bool is_block) {
    if (sign == '-') {
      while (end < s_.size() && is_space(s_[end])) ++end;
    } else if (sign != '+' && is_block && o_.trim_blocks && end < s_.size() && s_[end] == '\n') {
      ++end;
    }
    line_starting_ = end > 0 && s_[end - 1] == '\n';
    pos_ = end;
  }

  std::expected<void, std::string> comment(size_t open) {
    const size_t q = s_.find("#}", pos_);
    if (q == std::string::npos) return fail("unterminated comment '{#'", open);
    const char sign = q > pos_ && (s_[q - 1] == '-' || s_[q - 1] == '+') ? s_[q - 1] : 0;
    finish_tag(q + 2, sign, true);
    return {};
  }

  std::expected<void, std::string> tag(char kind, size_t open) {
    const bool block = kind == '%';
    const std::string close = block ? "%}" : "}}";
    out_.push_back({block ? tok::block_begin : tok::var_begin, "", {}, open});
    std::string balance;
    while (true) {
      while (pos_ < s_.size() && is_space(s_[pos_])) ++pos_;
      if (pos_ >= s_.size())
        return fail(std::string("unterminated '") + (block ? "{%" : "{{") + "' tag", open);
      if (balance.empty()) {
        for (const char sign : {'-', '+', '\0'}) {
          if (sign == '+' && !block) continue;
          const std::string end = sign ? sign + close : close;
          if (s_.compare(pos_, end.size(), end) == 0) {
            out_.push_back({block ? tok::block_end : tok::var_end, "", {}, pos_});
            finish_tag(pos_ + end.size(), sign, block);
            return {};
          }
        }
      }
      SHOAL_TEMPLATE_CHECK(next_token(balance));
    }
  }

  std::expected<void, std::string> next_token(std::string& balance) {
    const size_t start = pos_;
    const char c = s_[pos_];
    if (is_name_start(c)) {
      while (pos_ < s_.size() && is_name_char(s_[pos_])) ++pos_;
      out_.push_back({tok::name, s_.substr(start, pos_ - start), {}, start});
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      return number();
    } else if (c == '\'' || c == '"') {
      size_t i = pos_ + 1;
      while (i < s_.size() && s_[i] != c) i += s_[i] == '\\' ? 2 : 1;
      if (i >= s_.size()) return fail("unterminated string literal", start);
      SHOAL_TEMPLATE_TRY(text, decode_escapes(std::string_view(s_).substr(pos_ + 1, i - pos_ - 1), start));
      out_.push_back({tok::string, std::move(text), {}, start});
      pos_ = i + 1;
    } else {
      static constexpr std::array<std::string_view, 6> two = {"//", "**", "==", "!=", ">=", "<="};
      std::string op(1, c);
      for (auto t : two)
        if (s_.compare(pos_, 2, t) == 0) op = std::string(t);
      if (op.size() == 1 && std::string_view("+-*/%~<>()[]{},.:|=;").find(c) == std::string_view::npos)
        return fail(std::string("unexpected character '") + c + "'", start);
      if (c == '(' || c == '[' || c == '{') balance += c == '(' ? ')' : c == '[' ? ']' : '}';
      if (c == ')' || c == ']' || c == '}') {
        if (balance.empty()) return fail(std::string("unexpected '") + c + "'", start);
        if (balance.back() != c)
          return fail(std::string("unexpected '") + c + "', expected '" + balance.back() + "'", start);
        balance.pop_back();
      }
      out_.push_back({tok::op, op, {}, start});
      pos_ += op.size();
    }
    return {};
  }

  std::expected<void, std::string> number() {
    const size_t start = pos_;
    auto digits = [&] {
      while (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) ++pos_;
    };
    digits();
    bool is_float = false;
    if (pos_ + 1 < s_.size() && s_[pos_] == '.' && std::isdigit(static_cast<unsigned char>(s_[pos_ + 1]))) {
      ++pos_, digits(), is_float = true;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      size_t e = pos_ + 1;
      if (e < s_.size() && (s_[e] == '+' || s_[e] == '-')) ++e;
      if (e < s_.size() && std::isdigit(static_cast<unsigned char>(s_[e]))) pos_ = e, digits(), is_float = true;
    }
    std::string spelling = s_.substr(start, pos_ - start);
    std::erase(spelling, '_');
    token t{tok::number, spelling, {}, start};
    const char* b = spelling.data();
    const char* e = b + spelling.size();
    if (is_float) {
      double d = 0;
      if (std::from_chars(b, e, d).ec != std::errc()) return fail("bad number '" + spelling + "'", start);
      t.num.v = d;
    } else {
      int64_t i = 0;
      if (std::from_chars(b, e, i).ec != std::errc()) return fail("integer out of range '" + spelling + "'", start);
      t.num.v = i;
    }
    out_.push_back(std::move(t));
    return {};
  }

  const std::string& s_;
  const template_options& o_;
  size_t pos_ = 0;
  bool line_starting_ = true;
  std::vector<token> out_;
};

// Recursive descent over the token list, one function per precedence level of jinja2/parser.py.
class parser {
 public:
  explicit parser(std::vector<token> t) : t_(std::move(t)) {}

  std::expected<detail::template_program, std::string> run() {
    SHOAL_TEMPLATE_TRY(body, parse_body({}, "", 0));
    return detail::template_program{std::move(body.first)};
  }

 private:
  using exp_expr = std::expected<expr, std::string>;
  using body_and_tag = std::pair<std::vector<stmt>, std::string>;
  static constexpr int max_depth = 100;
  static constexpr uint32_t max_height = 256;

  const token& cur() const { return t_[i_]; }
  const token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  bool at_op(std::string_view op) const { return cur().kind == tok::op && cur().text == op; }
  bool at_name(std::string_view n) const { return cur().kind == tok::name && cur().text == n; }

  static std::string describe(const token& t) {
    switch (t.kind) {
      case tok::block_end: return "end of tag '%}'";
      case tok::var_end: return "end of expression '}}'";
      case tok::eof: return "end of template";
      case tok::string: return "string literal";
      default: return "'" + t.text + "'";
    }
  }

  std::expected<void, std::string> expect_op(std::string_view op) {
    if (!at_op(op)) return fail("expected '" + std::string(op) + "', got " + describe(cur()), cur().offset);
    ++i_;
    return {};
  }

  std::expected<void, std::string> expect_block_end() {
    if (cur().kind != tok::block_end) return fail("expected end of tag, got " + describe(cur()), cur().offset);
    ++i_;
    return {};
  }

  std::expected<std::string, std::string> expect_name() {
    if (cur().kind != tok::name) return fail("expected a name, got " + describe(cur()), cur().offset);
    return t_[i_++].text;
  }

  // Statements up to one of `stops` (consumed up to and including the tag name, which is
  // returned); `opener`/`open_at` name the enclosing tag in the unterminated error.
  std::expected<body_and_tag, std::string> parse_body(std::vector<std::string_view> stops,
                                                      std::string_view opener, size_t open_at) {
    if (++depth_ > max_depth) return fail("blocks nested too deeply", cur().offset);
    std::vector<stmt> body;
    while (true) {
      const token& t = cur();
      if (t.kind == tok::eof) {
        --depth_;
        if (stops.empty()) return body_and_tag{std::move(body), ""};
        return fail("missing {% " + std::string(stops.back()) + " %} for the {% " + std::string(opener) +
                        " %} opened", open_at);
      }
      if (t.kind == tok::data) {
        body.push_back({stmt_kind::text, t.text, "", {}, {}, t.offset});
        ++i_;
      } else if (t.kind == tok::var_begin) {
        ++i_;
        SHOAL_TEMPLATE_TRY(e, parse_expression());
        if (cur().kind != tok::var_end) return fail("expected '}}', got " + describe(cur()), cur().offset);
        ++i_;
        body.push_back({stmt_kind::output, "", "", {std::move(e)}, {}, t.offset});
      } else {  // block_begin
        ++i_;
        const token& name = cur();
        if (name.kind != tok::name) return fail("expected a tag name, got " + describe(name), name.offset);
        if (std::find(stops.begin(), stops.end(), name.text) != stops.end()) {
          ++i_;
          --depth_;
          return body_and_tag{std::move(body), name.text};
        }
        SHOAL_TEMPLATE_TRY(s, parse_statement(t.offset));
        body.push_back(std::move(s));
      }
    }
  }

  std::expected<stmt, std::string> parse_statement(size_t open_at) {
    const token& name = t_[i_++];
    if (name.text == "if") return parse_if(open_at);
    if (name.text == "for") return parse_for(open_at);
    if (name.text == "set") return parse_set(open_at);
    static constexpr std::array<std::string_view, 5> ends = {"elif", "else", "endif", "endfor", "endset"};
    if (std::find(ends.begin(), ends.end(), name.text) != ends.end())
      return fail("unexpected {% " + name.text + " %}", open_at);
    return fail("unsupported tag '" + name.text + "'", name.offset);
  }

  std::expected<stmt, std::string> parse_if(size_t open_at) {
    stmt s{stmt_kind::if_, "", "", {}, {}, open_at};
    while (true) {
      SHOAL_TEMPLATE_TRY(cond, parse_expression());
      SHOAL_TEMPLATE_CHECK(expect_block_end());
      s.exprs.push_back(std::move(cond));
      SHOAL_TEMPLATE_TRY(branch, parse_body({"elif", "else", "endif"}, "if", open_at));
      s.bodies.push_back(std::move(branch.first));
      if (branch.second == "elif") continue;
      if (branch.second == "else") {
        SHOAL_TEMPLATE_CHECK(expect_block_end());
        SHOAL_TEMPLATE_TRY(other, parse_body({"endif"}, "if", open_at));
        s.bodies.push_back(std::move(other.first));
      }
      SHOAL_TEMPLATE_CHECK(expect_block_end());
      return s;
    }
  }

  std::expected<stmt, std::string> parse_for(size_t open_at) {
    SHOAL_TEMPLATE_TRY(var, expect_name());
    if (at_op(",")) return fail("tuple unpacking in {% for %} is not supported", cur().offset);
    if (!at_name("in")) return fail("expected 'in', got " + describe(cur()), cur().offset);
    ++i_;
    SHOAL_TEMPLATE_TRY(iter, parse_or());
    if (at_name("if")) return fail("loop filter '{% for x in y if c %}' is not supported", cur().offset);
    if (at_name("recursive")) return fail("recursive loops are not supported", cur().offset);
    SHOAL_TEMPLATE_CHECK(expect_block_end());
    stmt s{stmt_kind::for_, var, "", {}, {}, open_at};
    s.exprs.push_back(std::move(iter));
    SHOAL_TEMPLATE_TRY(body, parse_body({"else", "endfor"}, "for", open_at));
    s.bodies.push_back(std::move(body.first));
    s.bodies.emplace_back();
    if (body.second == "else") {
      SHOAL_TEMPLATE_CHECK(expect_block_end());
      SHOAL_TEMPLATE_TRY(other, parse_body({"endfor"}, "for", open_at));
      s.bodies.back() = std::move(other.first);
    }
    SHOAL_TEMPLATE_CHECK(expect_block_end());
    return s;
  }

  std::expected<stmt, std::string> parse_set(size_t open_at) {
    stmt s{stmt_kind::set, "", "", {}, {}, open_at};
    SHOAL_TEMPLATE_TRY(var, expect_name());
    s.text = var;
    if (at_op(".")) {
      ++i_;
      SHOAL_TEMPLATE_TRY(attr, expect_name());
      s.attr = attr;
    }
    if (at_op(",")) return fail("tuple assignment in {% set %} is not supported", cur().offset);
    if (cur().kind == tok::block_end) return fail("block {% set %} is not supported", cur().offset);
    SHOAL_TEMPLATE_CHECK(expect_op("="));
    SHOAL_TEMPLATE_TRY(e, parse_expression());
    if (at_op(",")) return fail("tuples are not supported", cur().offset);
    SHOAL_TEMPLATE_CHECK(expect_block_end());
    s.exprs.push_back(std::move(e));
    return s;
  }

  template <size_t N>
  static bool known(const std::array<std::string_view, N>& names, const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  }

  static expr make(expr_kind k, std::string text, std::vector<expr> args, size_t offset) {
    expr e;
    e.kind = k, e.text = std::move(text), e.args = std::move(args), e.offset = offset;
    set_height(e);
    return e;
  }

  static void set_height(expr& e) {
    for (const expr& a : e.args) e.height = std::max(e.height, a.height + 1);
  }

  // Long operator or postfix chains (`1+1+...`) nest without parentheses; bound them too.
  std::expected<void, std::string> check_height(const expr& e) const {
    if (e.height > max_height) return fail("expression nested too deeply", e.offset);
    return {};
  }

  exp_expr parse_expression() {
    if (++depth_ > max_depth) return fail("expression nested too deeply", cur().offset);
    SHOAL_TEMPLATE_TRY(e, parse_or());
    while (at_name("if")) {
      const size_t at = cur().offset;
      ++i_;
      SHOAL_TEMPLATE_TRY(cond, parse_or());
      std::vector<expr> args{std::move(e), std::move(cond)};
      if (at_name("else")) {
        ++i_;
        SHOAL_TEMPLATE_TRY(other, parse_expression());
        args.push_back(std::move(other));
      }
      e = make(expr_kind::cond, "", std::move(args), at);
    }
    --depth_;
    return e;
  }

  // One left-associative binary level: operators `ops` (operator or name tokens) over `next`.
  template <typename Next>
  exp_expr parse_level(std::initializer_list<std::string_view> ops, expr_kind kind, Next next) {
    SHOAL_TEMPLATE_TRY(lhs, (this->*next)());
    while (true) {
      const auto it = std::find_if(ops.begin(), ops.end(), [&](std::string_view o) {
        return (cur().kind == tok::op || cur().kind == tok::name) && cur().text == o;
      });
      if (it == ops.end()) return lhs;
      const size_t at = cur().offset;
      ++i_;
      SHOAL_TEMPLATE_TRY(rhs, (this->*next)());
      lhs = make(kind, std::string(*it), {std::move(lhs), std::move(rhs)}, at);
      SHOAL_TEMPLATE_CHECK(check_height(lhs));
    }
  }

  exp_expr parse_or() { return parse_level({"or"}, expr_kind::logic, &parser::parse_and); }
  exp_expr parse_and() { return parse_level({"and"}, expr_kind::logic, &parser::parse_not); }
  exp_expr parse_not() {
    if (!at_name("not")) return parse_compare();
    const size_t at = cur().offset;
    ++i_;
    if (++depth_ > max_depth) return fail("expression nested too deeply", at);
    SHOAL_TEMPLATE_TRY(e, parse_not());
    --depth_;
    return make(expr_kind::unary, "not", {std::move(e)}, at);
  }
  exp_expr parse_compare() {
    SHOAL_TEMPLATE_TRY(lhs, parse_math1());
    while (true) {
      std::string op;
      if (cur().kind == tok::op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == "<=" || cur().text == ">" || cur().text == ">="))
        op = cur().text;
      else if (at_name("in"))
        op = "in";
      else if (at_name("not") && peek().kind == tok::name && peek().text == "in")
        op = "not in", ++i_;
      else
        return lhs;
      const size_t at = cur().offset;
      ++i_;
      SHOAL_TEMPLATE_TRY(rhs, parse_math1());
      lhs = make(expr_kind::binary, op, {std::move(lhs), std::move(rhs)}, at);
      SHOAL_TEMPLATE_CHECK(check_height(lhs));
    }
  }
  exp_expr parse_math1() { return parse_level({"+", "-"}, expr_kind::binary, &parser::parse_concat); }
  exp_expr parse_concat() { return parse_level({"~"}, expr_kind::binary, &parser::parse_math2); }
  exp_expr parse_math2() { return parse_level({"*", "/", "//", "%"}, expr_kind::binary, &parser::parse_pow); }
  exp_expr parse_pow() {
    SHOAL_TEMPLATE_TRY(e, parse_unary(true));
    if (at_op("**")) return fail("'**' is not supported", cur().offset);
    return e;
  }

  exp_expr parse_unary(bool with_filter) {
    expr e;
    if (at_op("-") || at_op("+")) {
      const token& t = t_[i_++];
      if (++depth_ > max_depth) return fail("expression nested too deeply", t.offset);
      SHOAL_TEMPLATE_TRY(inner, parse_unary(false));
      --depth_;
      e = make(expr_kind::unary, t.text, {std::move(inner)}, t.offset);
    } else {
      SHOAL_TEMPLATE_TRY(p, parse_primary());
      e = std::move(p);
    }
    SHOAL_TEMPLATE_TRY(post, parse_postfix(std::move(e), with_filter));
    return post;
  }

  exp_expr parse_primary() {
    const token& t = cur();
    expr e;
    e.offset = t.offset;
    if (t.kind == tok::name) {
      ++i_;
      if (t.text == "true" || t.text == "True") e.lit.v = true;
      else if (t.text == "false" || t.text == "False") e.lit.v = false;
      else if (t.text == "none" || t.text == "None") e.lit.v = detail::none_t{};
      else e.kind = expr_kind::name, e.text = t.text;
      return e;
    }
    if (t.kind == tok::string) {
      std::string s;
      while (cur().kind == tok::string) s += t_[i_++].text;  // adjacent literals concatenate
      e.lit.v = std::move(s);
      return e;
    }
    if (t.kind == tok::number) {
      ++i_;
      e.lit = t.num;
      return e;
    }
    if (at_op("(")) {
      ++i_;
      SHOAL_TEMPLATE_TRY(inner, parse_expression());
      if (at_op(",")) return fail("tuples are not supported", cur().offset);
      SHOAL_TEMPLATE_CHECK(expect_op(")"));
      return inner;
    }
    if (at_op("[")) return parse_list();
    if (at_op("{")) return fail("dict literals are not supported", t.offset);
    return fail("unexpected " + describe(t) + " in expression", t.offset);
  }

  exp_expr parse_list() {
    expr e = make(expr_kind::list, "", {}, cur().offset);
    ++i_;
    while (!at_op("]")) {
      if (!e.args.empty()) {
        SHOAL_TEMPLATE_CHECK(expect_op(","));
        if (at_op("]")) break;
      }
      SHOAL_TEMPLATE_TRY(item, parse_expression());
      e.args.push_back(std::move(item));
    }
    ++i_;
    set_height(e);
    return e;
  }

  // Attributes, subscripts and calls; then (with_filter) filters and tests, in any order.
  exp_expr parse_postfix(expr e, bool with_filter) {
    while (true) {
      SHOAL_TEMPLATE_CHECK(check_height(e));
      const size_t at = cur().offset;
      if (at_op(".")) {
        ++i_;
        SHOAL_TEMPLATE_TRY(attr, expect_name());
        e = make(expr_kind::attr, attr, {std::move(e)}, at);
      } else if (at_op("[")) {
        ++i_;
        if (at_op(":")) return fail("slices are not supported", cur().offset);
        SHOAL_TEMPLATE_TRY(index, parse_expression());
        if (at_op(":")) return fail("slices are not supported", cur().offset);
        SHOAL_TEMPLATE_CHECK(expect_op("]"));
        e = make(expr_kind::subscript, "", {std::move(e), std::move(index)}, at);
      } else if (at_op("(")) {
        SHOAL_TEMPLATE_TRY(call, parse_call(make(expr_kind::call, "", {std::move(e)}, e.offset)));
        e = std::move(call);
      } else if (with_filter && at_op("|")) {
        ++i_;
        const size_t name_at = cur().offset;
        SHOAL_TEMPLATE_TRY(name, expect_name());
        if (!known(detail::filter_names, name)) return fail("unknown filter '" + name + "'", name_at);
        expr f = make(expr_kind::filter, name, {std::move(e)}, at);
        if (at_op("(")) {
          SHOAL_TEMPLATE_TRY(call, parse_call(std::move(f)));
          f = std::move(call);
        }
        e = std::move(f);
      } else if (with_filter && at_name("is")) {
        ++i_;
        const bool negated = at_name("not");
        if (negated) ++i_;
        const size_t name_at = cur().offset;
        SHOAL_TEMPLATE_TRY(name, expect_name());
        if (!known(detail::test_names, name)) return fail("unknown test '" + name + "'", name_at);
        if (at_op("(") || cur().kind == tok::string || cur().kind == tok::number)
          return fail("tests with arguments ('is " + name + " ...') are not supported", cur().offset);
        e = make(expr_kind::test, name, {std::move(e)}, at);
        e.negated = negated;
      } else {
        return e;
      }
    }
  }

  // `(a, b, k=v)` appended to e.args (keyword names in e.kwarg_names).
  exp_expr parse_call(expr e) {
    ++i_;  // (
    bool first = true;
    while (!at_op(")")) {
      if (!first) {
        SHOAL_TEMPLATE_CHECK(expect_op(","));
        if (at_op(")")) break;
      }
      first = false;
      if (cur().kind == tok::name && peek().kind == tok::op && peek().text == "=") {
        e.kwarg_names.push_back(cur().text);
        i_ += 2;
      } else if (!e.kwarg_names.empty()) {
        return fail("positional argument after keyword argument", cur().offset);
      }
      SHOAL_TEMPLATE_TRY(arg, parse_expression());
      e.args.push_back(std::move(arg));
    }
    ++i_;
    set_height(e);
    return e;
  }

  std::vector<token> t_;
  size_t i_ = 0;
  int depth_ = 0;
};

std::expected<std::string, std::string> read_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::unexpected("cannot read " + path.string());
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// A special token as HF writes it: "text", {"content": "text", ...} or null/absent ("").
std::expected<std::string, std::string> special_token(const nlohmann::json& cfg, const char* key,
                                                      const std::string& file) {
  const auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return std::unexpected(file + ": field '" + key + "' must be a string or {\"content\": string}");
}

}  // namespace

std::expected<chat_template, std::string> chat_template::parse(std::string_view source,
                                                               const template_options& options) {
  const std::string src = normalise_newlines(source);
  SHOAL_TEMPLATE_TRY(tokens, lexer(src, options).run());
  SHOAL_TEMPLATE_TRY(program, parser(std::move(tokens)).run());
  return chat_template(std::make_shared<const detail::template_program>(std::move(program)));
}

std::expected<chat_template_config, std::string> load_chat_template(
    const std::filesystem::path& tokenizer_config_json, const template_options& options) {
  const std::string file = tokenizer_config_json.string();
  SHOAL_TEMPLATE_TRY(text, read_file(tokenizer_config_json));
  const nlohmann::json cfg = nlohmann::json::parse(text, nullptr, false);
  if (cfg.is_discarded() || !cfg.is_object()) return std::unexpected(file + ": not a JSON object");
  std::string source;
  if (const auto ct = cfg.find("chat_template"); ct != cfg.end() && ct->is_string()) {
    source = ct->get<std::string>();
  } else if (ct != cfg.end() && ct->is_array()) {  // [{name, template}]: "default", else the first
    for (const auto& e : *ct) {
      if (!e.is_object() || !e.contains("template") || !e["template"].is_string()) continue;
      if (source.empty() || (e.contains("name") && e["name"] == "default")) source = e["template"].get<std::string>();
    }
  } else if (ct != cfg.end() && !ct->is_null()) {
    return std::unexpected(file + ": field 'chat_template' must be a string or a list of {name, template}");
  }
  if (source.empty()) return std::unexpected(file + ": no chat_template");
  SHOAL_TEMPLATE_TRY(bos, special_token(cfg, "bos_token", file));
  SHOAL_TEMPLATE_TRY(eos, special_token(cfg, "eos_token", file));
  auto tmpl = chat_template::parse(source, options);
  if (!tmpl) return std::unexpected(file + ": " + tmpl.error());
  return chat_template_config{std::move(*tmpl), std::move(bos), std::move(eos)};
}

}  // namespace shoal::runtime
