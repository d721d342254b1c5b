// Evaluator of parsed chat templates (chat_template::render): walks the statement tree with a
// stack of scopes and Python value semantics as Jinja2 exposes them: `{{ none }}` prints "None",
// undefined prints "" and is iterable as empty but fails on attribute access or arithmetic, a
// `set` inside a for loop stays in the loop, `and`/`or` return an operand, lengths count code
// points. Every failure is an error value carrying the offset of the expression at fault.
#include "runtime/serve/chat_template.hpp"

#include "runtime/serve/chat_template_ast.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>

namespace shoal::runtime {

namespace {

using namespace detail;
using result = std::expected<value, std::string>;

enum class vk : uint8_t { undefined, none, boolean, integer, floating, string, list, map, ns };
vk kind_of(const value& v) { return static_cast<vk>(v.v.index()); }

const char* type_name(const value& v) {
  static constexpr const char* names[] = {"undefined", "NoneType", "bool", "int", "float", "str",
                                          "list", "dict", "Namespace"};
  return names[v.v.index()];
}

std::unexpected<std::string> fail(const std::string& what, size_t offset) {
  return std::unexpected("chat template: " + what + " at offset " + std::to_string(offset));
}

value make_string(std::string s) { return value{std::move(s)}; }
const std::string& str(const value& v) { return std::get<std::string>(v.v); }
const value_list& list(const value& v) { return *std::get<std::shared_ptr<const value_list>>(v.v); }
const value_map& map(const value& v) { return *std::get<std::shared_ptr<const value_map>>(v.v); }

const value* find(const value_map& m, std::string_view key) {
  for (const auto& [k, v] : m)
    if (k == key) return &v;
  return nullptr;
}

// bool, int and float as a number (Python's bool is an int); nullopt for anything else.
bool is_number(const value& v) {
  const vk k = kind_of(v);
  return k == vk::boolean || k == vk::integer || k == vk::floating;
}
bool is_integral(const value& v) { return kind_of(v) == vk::boolean || kind_of(v) == vk::integer; }
int64_t as_int(const value& v) {
  return kind_of(v) == vk::boolean ? int64_t{std::get<bool>(v.v)} : std::get<int64_t>(v.v);
}
double as_double(const value& v) {
  return kind_of(v) == vk::floating ? std::get<double>(v.v) : static_cast<double>(as_int(v));
}

size_t utf8_length(std::string_view s) {
  return std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

// Python's repr(float): shortest round-trip digits, scientific below 1e-4 and from 1e16.
std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, end);  // "-1.2345e+02"
  const size_t e = sci.find('e');
  const int exp = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : sci.substr(0, e))
    if (std::isdigit(static_cast<unsigned char>(c))) digits += c;
  const std::string sign = d < 0 ? "-" : "";
  if (exp < -4 || exp >= 16) {
    std::string m = digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "");
    return sign + m + "e" + (exp < 0 ? "-" : "+") + (std::abs(exp) < 10 ? "0" : "") + std::to_string(std::abs(exp));
  }
  if (exp < 0) return sign + "0." + std::string(-exp - 1, '0') + digits;
  if (static_cast<int>(digits.size()) <= exp + 1) return sign + digits + std::string(exp + 1 - digits.size(), '0') + ".0";
  return sign + digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
}

std::string repr(const value& v, int depth = 0);

// str(v) as `{{ v }}` prints it.
std::string to_output(const value& v) {
  switch (kind_of(v)) {
    case vk::undefined: return "";
    case vk::none: return "None";
    case vk::boolean: return std::get<bool>(v.v) ? "True" : "False";
    case vk::integer: return std::to_string(std::get<int64_t>(v.v));
    case vk::floating: return float_repr(std::get<double>(v.v));
    case vk::string: return str(v);
    default: return repr(v);
  }
}

std::string repr_string(const std::string& s) {
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    if (c == q || c == '\\') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\x", out += hex[(c >> 4) & 0xF], out += hex[c & 0xF];
    } else out += c;
  }
  return out + q;
}

// Python's repr of `v`. A namespace can hold itself (`set ns.n = ns`): past 64 levels the
// rest prints as "..." (Python prints a recursive container as "{...}").
std::string repr(const value& v, int depth) {
  if (depth > 64) return "...";
  switch (kind_of(v)) {
    case vk::string: return repr_string(str(v));
    case vk::list: {
      std::string out = "[";
      for (const value& x : list(v)) out += (out.size() > 1 ? ", " : "") + repr(x, depth + 1);
      return out + "]";
    }
    case vk::map: {
      std::string out = "{";
      for (const auto& [k, x] : map(v)) out += (out.size() > 1 ? ", " : "") + repr_string(k) + ": " + repr(x, depth + 1);
      return out + "}";
    }
    case vk::ns: {
      std::string out = "<Namespace {";
      for (const auto& [k, x] : std::get<std::shared_ptr<namespace_object>>(v.v)->attrs)
        out += (out.size() > 12 ? ", " : "") + repr_string(k) + ": " + repr(x, depth + 1);
      return out + "}>";
    }
    default: return to_output(v);
  }
}

bool truthy(const value& v) {
  switch (kind_of(v)) {
    case vk::undefined:
    case vk::none: return false;
    case vk::boolean: return std::get<bool>(v.v);
    case vk::integer: return std::get<int64_t>(v.v) != 0;
    case vk::floating: return std::get<double>(v.v) != 0.0;
    case vk::string: return !str(v).empty();
    case vk::list: return !list(v).empty();
    case vk::map: return !map(v).empty();
    case vk::ns: return true;
  }
  return false;
}

bool equals(const value& a, const value& b) {
  if (is_number(a) && is_number(b))
    return is_integral(a) && is_integral(b) ? as_int(a) == as_int(b) : as_double(a) == as_double(b);
  if (kind_of(a) != kind_of(b)) return false;
  switch (kind_of(a)) {
    case vk::undefined:
    case vk::none: return true;
    case vk::string: return str(a) == str(b);
    case vk::list:
      return std::equal(list(a).begin(), list(a).end(), list(b).begin(), list(b).end(), equals);
    case vk::map: {
      if (map(a).size() != map(b).size()) return false;
      for (const auto& [k, x] : map(a))
        if (const value* y = find(map(b), k); !y || !equals(x, *y)) return false;
      return true;
    }
    case vk::ns: return std::get<std::shared_ptr<namespace_object>>(a.v) == std::get<std::shared_ptr<namespace_object>>(b.v);
    default: return false;
  }
}

std::string strip(std::string s, std::string_view chars, bool left, bool right) {
  if (right) s.erase(s.find_last_not_of(chars) + 1);
  if (left) s.erase(0, std::min(s.size(), s.find_first_not_of(chars)));
  return s;
}
constexpr std::string_view whitespace = " \t\n\r\f\v";

// Code points of a UTF-8 string (Python iterates strings by character).
value_list characters(const std::string& s) {
  value_list out;
  for (size_t i = 0; i < s.size();) {
    size_t n = 1;
    while (i + n < s.size() && (static_cast<unsigned char>(s[i + n]) & 0xC0) == 0x80) ++n;
    out.push_back(make_string(s.substr(i, n)));
    i += n;
  }
  return out;
}

result length_of(const value& v, size_t offset) {
  switch (kind_of(v)) {
    case vk::undefined: return value{int64_t{0}};
    case vk::string: return value{static_cast<int64_t>(utf8_length(str(v)))};
    case vk::list: return value{static_cast<int64_t>(list(v).size())};
    case vk::map: return value{static_cast<int64_t>(map(v).size())};
    default: return fail(std::string("object of type '") + type_name(v) + "' has no len()", offset);
  }
}

std::string lower_ascii(std::string s, bool upper) {
  for (char& c : s) c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
  return s;
}

result apply_filter(const std::string& name, const value& v, const std::vector<value>& args, size_t offset) {
  if (name == "length" || name == "count") return length_of(v, offset);
  if (name == "string") return make_string(to_output(v));
  if (name == "lower" || name == "upper") return make_string(lower_ascii(to_output(v), name == "upper"));
  // trim([chars])
  if (!args.empty() && kind_of(args[0]) != vk::string) return fail("trim() expects a string argument", offset);
  return make_string(strip(to_output(v), args.empty() ? whitespace : std::string_view(str(args[0])), true, true));
}

bool apply_test(const std::string& name, const value& v) {
  const vk k = kind_of(v);
  if (name == "defined") return k != vk::undefined;
  if (name == "undefined") return k == vk::undefined;
  if (name == "none") return k == vk::none;
  if (name == "string") return k == vk::string;
  if (name == "number") return is_number(v);
  if (name == "boolean") return k == vk::boolean;
  if (name == "mapping") return k == vk::map;
  if (name == "sequence") return k == vk::string || k == vk::list || k == vk::map;
  if (name == "iterable") return k == vk::string || k == vk::list || k == vk::map || k == vk::undefined;
  if (name == "true") return k == vk::boolean && std::get<bool>(v.v);
  return k == vk::boolean && !std::get<bool>(v.v);  // "false"; the parser admits no other name
}

// Python's floor division and modulo on ints.
int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

constexpr size_t max_string_bytes = size_t{1} << 26;

result arithmetic(const std::string& op, const value& a, const value& b, size_t offset) {
  const auto type_error = [&] {
    return fail(std::string("unsupported operand types for ") + op + ": '" + type_name(a) + "' and '" +
                    type_name(b) + "'", offset);
  };
  if (kind_of(a) == vk::undefined || kind_of(b) == vk::undefined)
    return fail("undefined value used in '" + op + "'", offset);
  if (is_number(a) && is_number(b)) {
    const bool ints = is_integral(a) && is_integral(b);
    if ((op == "/" || op == "//" || op == "%") && as_double(b) == 0) return fail("division by zero", offset);
    if (op == "/") return value{as_double(a) / as_double(b)};
    if (ints) {
      const int64_t x = as_int(a), y = as_int(b);
      if (op == "+") return value{x + y};
      if (op == "-") return value{x - y};
      if (op == "*") return value{x * y};
      if (op == "//") return value{floor_div(x, y)};
      return value{x - floor_div(x, y) * y};  // %
    }
    const double x = as_double(a), y = as_double(b);
    if (op == "+") return value{x + y};
    if (op == "-") return value{x - y};
    if (op == "*") return value{x * y};
    if (op == "//") return value{std::floor(x / y)};
    return value{x - std::floor(x / y) * y};
  }
  if (op == "+" && kind_of(a) == vk::string && kind_of(b) == vk::string) {
    if (str(a).size() + str(b).size() > max_string_bytes) return fail("string too long", offset);
    return make_string(str(a) + str(b));
  }
  if (op == "+" && kind_of(a) == vk::list && kind_of(b) == vk::list) {
    value_list out = list(a);
    out.insert(out.end(), list(b).begin(), list(b).end());
    return value{std::make_shared<const value_list>(std::move(out))};
  }
  if (op == "*" && (kind_of(a) == vk::string) != (kind_of(b) == vk::string) &&
      (is_integral(a) || is_integral(b))) {
    const std::string& s = kind_of(a) == vk::string ? str(a) : str(b);
    const int64_t n = std::max<int64_t>(0, is_integral(a) ? as_int(a) : as_int(b));
    if (static_cast<double>(s.size()) * static_cast<double>(n) > max_string_bytes) return fail("string too long", offset);
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += s;
    return make_string(std::move(out));
  }
  return type_error();
}

result compare(const std::string& op, const value& a, const value& b, size_t offset) {
  int c = 0;
  if (is_number(a) && is_number(b)) {
    const double x = as_double(a), y = as_double(b);
    c = x < y ? -1 : x > y ? 1 : 0;
  } else if (kind_of(a) == vk::string && kind_of(b) == vk::string) {
    c = str(a).compare(str(b));  // UTF-8 byte order is code-point order
  } else {
    return fail(std::string("'") + op + "' not supported between '" + type_name(a) + "' and '" + type_name(b) + "'", offset);
  }
  const bool r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
  return value{r};
}

result contains(const value& container, const value& item, size_t offset) {
  switch (kind_of(container)) {
    case vk::undefined: return value{false};
    case vk::string:
      if (kind_of(item) != vk::string) return fail("'in <string>' requires a string on the left", offset);
      return value{str(container).find(str(item)) != std::string::npos};
    case vk::list:
      return value{std::any_of(list(container).begin(), list(container).end(),
                               [&](const value& x) { return equals(x, item); })};
    case vk::map:
      return value{kind_of(item) == vk::string && find(map(container), str(item)) != nullptr};
    default:
      return fail(std::string("argument of type '") + type_name(container) + "' is not iterable", offset);
  }
}

// x.name or x[name]: missing keys are undefined (as Jinja's getattr/getitem); only
// undefined itself fails.
result get_member(const value& obj, const value& key, size_t offset) {
  const vk k = kind_of(obj);
  if (k == vk::undefined) return fail("cannot read '" + to_output(key) + "' of an undefined value", offset);
  if (k == vk::map && kind_of(key) == vk::string) {
    const value* v = find(map(obj), str(key));
    return v ? *v : value{};
  }
  if (k == vk::ns && kind_of(key) == vk::string) {
    const value* v = find(std::get<std::shared_ptr<namespace_object>>(obj.v)->attrs, str(key));
    return v ? *v : value{};
  }
  if ((k == vk::list || k == vk::string) && is_integral(key)) {
    const value_list chars = k == vk::string ? characters(str(obj)) : value_list{};
    const value_list& items = k == vk::string ? chars : list(obj);
    int64_t i = as_int(key);
    if (i < 0) i += static_cast<int64_t>(items.size());
    if (i < 0 || i >= static_cast<int64_t>(items.size())) return value{};
    return items[i];
  }
  return value{};
}

result string_method(const std::string& s, const std::string& name, const std::vector<value>& args, size_t offset) {
  const auto arg_string = [&](size_t i) -> const std::string* {
    return args.size() > i && kind_of(args[i]) == vk::string ? &str(args[i]) : nullptr;
  };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    if (!args.empty() && !arg_string(0)) return fail(name + "() expects a string argument", offset);
    const std::string_view chars = args.empty() ? whitespace : std::string_view(*arg_string(0));
    return make_string(strip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "startswith" || name == "endswith") {
    if (args.size() != 1 || !arg_string(0)) return fail(name + "() expects one string argument", offset);
    const std::string& p = *arg_string(0);
    return value{name == "startswith" ? s.starts_with(p) : s.ends_with(p)};
  }
  if (name == "lower" || name == "upper") return make_string(lower_ascii(s, name == "upper"));
  return fail("unsupported string method '" + name + "'", offset);
}

class evaluator {
 public:
  explicit evaluator(value_map globals) { scopes_.push_back(std::move(globals)); }
  // A template may store a namespace in an attribute of itself or of another namespace
  // (`{% set ns.x = ns %}`): a shared_ptr cycle. Every namespace this render made is emptied
  // when it ends, so none outlives it (none can escape: a render returns text).
  ~evaluator() {
    for (const auto& ns : namespaces_) ns->attrs.clear();
  }
  evaluator(const evaluator&) = delete;
  evaluator& operator=(const evaluator&) = delete;

  std::expected<void, std::string> exec(const std::vector<stmt>& body, std::string& out) {
    for (const stmt& s : body) {
      switch (s.kind) {
        case stmt_kind::text: out += s.text; break;
        case stmt_kind::output: {
          SHOAL_TEMPLATE_TRY(v, eval(s.exprs[0]));
          out += to_output(v);
          if (out.size() > max_string_bytes) return fail("output too long", s.offset);
          break;
        }
        case stmt_kind::if_: {
          for (size_t i = 0; i < s.bodies.size(); ++i) {
            bool take = i >= s.exprs.size();  // the else branch
            if (!take) {
              SHOAL_TEMPLATE_TRY(c, eval(s.exprs[i]));
              take = truthy(c);
            }
            if (take) {
              SHOAL_TEMPLATE_CHECK(exec(s.bodies[i], out));
              break;
            }
          }
          break;
        }
        case stmt_kind::for_: SHOAL_TEMPLATE_CHECK(exec_for(s, out)); break;
        case stmt_kind::set: SHOAL_TEMPLATE_CHECK(exec_set(s)); break;
      }
    }
    return {};
  }

 private:
  std::expected<void, std::string> exec_for(const stmt& s, std::string& out) {
    SHOAL_TEMPLATE_TRY(iterable, eval(s.exprs[0]));
    value_list items;
    switch (kind_of(iterable)) {
      case vk::undefined: break;
      case vk::list: items = list(iterable); break;
      case vk::string: items = characters(str(iterable)); break;
      case vk::map:
        for (const auto& [k, v] : map(iterable)) items.push_back(make_string(k));
        break;
      default:
        return fail(std::string("'") + type_name(iterable) + "' object is not iterable", s.exprs[0].offset);
    }
    if (items.empty()) return exec(s.bodies[1], out);
    scopes_.emplace_back();
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      value_map loop = {{"index0", value{i}},         {"index", value{i + 1}},
                        {"revindex0", value{n - i - 1}}, {"revindex", value{n - i}},
                        {"first", value{i == 0}},     {"last", value{i == n - 1}},
                        {"length", value{n}}};
      assign(s.text, items[i]);
      assign("loop", value{std::make_shared<const value_map>(std::move(loop))});
      if (auto r = exec(s.bodies[0], out); !r) return r;
    }
    scopes_.pop_back();
    return {};
  }

  std::expected<void, std::string> exec_set(const stmt& s) {
    SHOAL_TEMPLATE_TRY(v, eval(s.exprs[0]));
    if (s.attr.empty()) {
      assign(s.text, std::move(v));
      return {};
    }
    const value target = lookup(s.text);
    if (kind_of(target) != vk::ns)
      return fail("cannot assign attribute '" + s.attr + "' on '" + s.text + "', which is not a namespace", s.offset);
    value_map& attrs = std::get<std::shared_ptr<namespace_object>>(target.v)->attrs;
    const auto it = std::find_if(attrs.begin(), attrs.end(), [&](const auto& kv) { return kv.first == s.attr; });
    if (it != attrs.end()) it->second = std::move(v);
    else attrs.emplace_back(s.attr, std::move(v));
    return {};
  }

  value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
      if (const value* v = find(*it, name)) return *v;
    return value{};
  }

  void assign(const std::string& name, value v) {
    for (auto& [k, x] : scopes_.back())
      if (k == name) return void(x = std::move(v));
    scopes_.back().emplace_back(name, std::move(v));
  }

  result eval_args(const expr& e, size_t first, std::vector<value>& out) {
    for (size_t i = first; i < e.args.size(); ++i) {
      SHOAL_TEMPLATE_TRY(v, eval(e.args[i]));
      out.push_back(std::move(v));
    }
    return value{};
  }

  result eval_call(const expr& e) {
    const expr& callee = e.args[0];
    std::vector<value> args;
    SHOAL_TEMPLATE_TRY(ok, eval_args(e, 1, args));
    const size_t n_positional = args.size() - e.kwarg_names.size();
    if (callee.kind == expr_kind::name && callee.text == "namespace" && kind_of(lookup("namespace")) == vk::undefined) {
      if (n_positional != 0) return fail("namespace() takes keyword arguments only", e.offset);
      auto ns = std::make_shared<namespace_object>();
      for (size_t i = 0; i < args.size(); ++i) ns->attrs.emplace_back(e.kwarg_names[i], std::move(args[i]));
      namespaces_.push_back(ns);
      return value{std::move(ns)};
    }
    if (callee.kind == expr_kind::name && callee.text == "raise_exception") {
      return fail("raise_exception('" + (args.empty() ? std::string() : to_output(args[0])) + "')", e.offset);
    }
    if (callee.kind == expr_kind::attr && e.kwarg_names.empty()) {
      SHOAL_TEMPLATE_TRY(obj, eval(callee.args[0]));
      if (kind_of(obj) == vk::string) return string_method(str(obj), callee.text, args, e.offset);
      return fail(std::string("unsupported method '") + callee.text + "' of '" + type_name(obj) + "'", e.offset);
    }
    return fail("unsupported call", e.offset);
  }

  result eval_binary(const expr& e) {
    SHOAL_TEMPLATE_TRY(a, eval(e.args[0]));
    SHOAL_TEMPLATE_TRY(b, eval(e.args[1]));
    const std::string& op = e.text;
    if (op == "~") return make_string(to_output(a) + to_output(b));
    if (op == "==" || op == "!=") return value{equals(a, b) == (op == "==")};
    if (op == "<" || op == "<=" || op == ">" || op == ">=") return compare(op, a, b, e.offset);
    if (op == "in" || op == "not in") {
      SHOAL_TEMPLATE_TRY(r, contains(b, a, e.offset));
      return value{std::get<bool>(r.v) == (op == "in")};
    }
    return arithmetic(op, a, b, e.offset);
  }

  result eval(const expr& e) {
    switch (e.kind) {
      case expr_kind::literal: return e.lit;
      case expr_kind::name: return lookup(e.text);
      case expr_kind::list: {
        std::vector<value> items;
        SHOAL_TEMPLATE_TRY(ok, eval_args(e, 0, items));
        return value{std::make_shared<const value_list>(std::move(items))};
      }
      case expr_kind::attr: {
        SHOAL_TEMPLATE_TRY(obj, eval(e.args[0]));
        return get_member(obj, make_string(e.text), e.offset);
      }
      case expr_kind::subscript: {
        SHOAL_TEMPLATE_TRY(obj, eval(e.args[0]));
        SHOAL_TEMPLATE_TRY(key, eval(e.args[1]));
        return get_member(obj, key, e.offset);
      }
      case expr_kind::call: return eval_call(e);
      case expr_kind::filter: {
        SHOAL_TEMPLATE_TRY(v, eval(e.args[0]));
        std::vector<value> args;
        SHOAL_TEMPLATE_TRY(ok, eval_args(e, 1, args));
        return apply_filter(e.text, v, args, e.offset);
      }
      case expr_kind::test: {
        SHOAL_TEMPLATE_TRY(v, eval(e.args[0]));
        return value{apply_test(e.text, v) != e.negated};
      }
      case expr_kind::unary: {
        SHOAL_TEMPLATE_TRY(v, eval(e.args[0]));
        if (e.text == "not") return value{!truthy(v)};
        if (!is_number(v)) return fail(std::string("bad operand type for unary ") + e.text + ": '" + type_name(v) + "'", e.offset);
        if (e.text == "+") return is_integral(v) ? value{as_int(v)} : v;
        return is_integral(v) ? value{-as_int(v)} : value{-as_double(v)};
      }
      case expr_kind::binary: return eval_binary(e);
      case expr_kind::logic: {
        SHOAL_TEMPLATE_TRY(a, eval(e.args[0]));
        if (truthy(a) == (e.text == "or")) return a;
        return eval(e.args[1]);
      }
      case expr_kind::cond: {
        SHOAL_TEMPLATE_TRY(c, eval(e.args[1]));
        if (truthy(c)) return eval(e.args[0]);
        return e.args.size() > 2 ? eval(e.args[2]) : result(value{});
      }
    }
    return fail("unknown expression", e.offset);
  }

  std::vector<value_map> scopes_;
  std::vector<std::shared_ptr<namespace_object>> namespaces_;  // made by this render (see ~evaluator)
};

}  // namespace

std::expected<std::string, std::string> chat_template::render(const std::vector<chat_message>& messages,
                                                              bool add_generation_prompt,
                                                              const std::string& bos_token,
                                                              const std::string& eos_token) const {
  value_list msgs;
  for (const chat_message& m : messages) {
    value_map fields = {{"role", make_string(m.role)},
                        {"content", m.content ? make_string(*m.content) : value{none_t{}}}};
    if (!m.tool_calls.empty()) {
      value_list calls;
      for (const tool_call& c : m.tool_calls) {
        value_map fn = {{"name", make_string(c.name)}, {"arguments", make_string(c.arguments)}};
        value_map call = {{"id", make_string(c.id)},
                          {"type", make_string("function")},
                          {"function", value{std::make_shared<const value_map>(std::move(fn))}}};
        calls.push_back(value{std::make_shared<const value_map>(std::move(call))});
      }
      fields.emplace_back("tool_calls", value{std::make_shared<const value_list>(std::move(calls))});
    }
    msgs.push_back(value{std::make_shared<const value_map>(std::move(fields))});
  }
  value_map globals = {{"messages", value{std::make_shared<const value_list>(std::move(msgs))}},
                       {"add_generation_prompt", value{add_generation_prompt}},
                       {"bos_token", make_string(bos_token)},
                       {"eos_token", make_string(eos_token)}};
  std::string out;
  SHOAL_TEMPLATE_CHECK(evaluator(std::move(globals)).exec(program_->body, out));
  return out;
}

}  // namespace shoal::runtime
