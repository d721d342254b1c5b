// JSON schema → grammar: the JSON building blocks (json_rules) and the schema compiler. Each
// schema becomes a rule; a local $ref becomes the referenced schema's rule (made once, so
// recursive schemas are recursive rules). Objects keep the declared property order: required
// properties always appear, optional ones may be left out, extra properties only where
// additionalProperties allows them (or an object declares no properties at all).
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "runtime/structured/grammar_internal.hpp"

namespace shoal::runtime {

using grammar_detail::json_rules;
using grammar_detail::ranges;
using json = nlohmann::ordered_json;  // properties keep their declared order

namespace grammar_detail {

std::string line_column(std::string_view text, size_t offset) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(col);
}

uint32_t json_rules::sp() {
  if (!sp_) sp_ = b_.choice({b_.literal(" "), {}}, "sp");
  return *sp_;
}

namespace {

uint32_t hex_rule(grammar_builder& b) {
  return b.codepoints({{'0', '9'}, {'a', 'f'}, {'A', 'F'}}, "hex");
}

}  // namespace

uint32_t json_rules::chr() {
  if (chr_) return *chr_;
  const uint32_t raw = b_.codepoints({{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}}, "char");
  const uint32_t hex = hex_rule(b_);
  // \u escapes: no surrogate (first digit d/D with a second digit 8-f).
  const uint32_t lead = b_.codepoints({{'0', '9'}, {'a', 'c'}, {'A', 'C'}, {'e', 'f'}, {'E', 'F'}}, "hex-lead");
  const uint32_t d = b_.codepoints({{'d', 'd'}, {'D', 'D'}}, "hex-d");
  const uint32_t low = b_.codepoints({{'0', '7'}}, "hex-low");
  const uint32_t u4 = b_.choice({{b_.ref(lead), b_.ref(hex), b_.ref(hex), b_.ref(hex)},
                                 {b_.ref(d), b_.ref(low), b_.ref(hex), b_.ref(hex)}},
                                "u-escape");
  const uint32_t simple = b_.codepoints({{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {'b', 'b'}, {'f', 'f'}, {'n', 'n'},
                                         {'r', 'r'}, {'t', 't'}},
                                        "escape-char");
  auto esc = b_.literal("\\");
  auto esc_u = b_.literal("\\u");
  esc.push_back(b_.ref(simple));
  esc_u.push_back(b_.ref(u4));
  chr_ = b_.choice({{b_.ref(raw)}, esc, esc_u}, "string-char");
  return *chr_;
}

uint32_t json_rules::string() {
  if (string_) return *string_;
  const uint32_t chars = b_.repeat(chr(), 0, -1, "string-chars");
  auto s = b_.literal("\"");
  s.push_back(b_.ref(chars));
  b_.append_literal(s, "\"");
  string_ = b_.choice({s}, "string");
  return *string_;
}

uint32_t json_rules::integer() {
  if (integer_) return *integer_;
  const uint32_t digit = b_.codepoints({{'0', '9'}}, "digit");
  const uint32_t nonzero = b_.codepoints({{'1', '9'}}, "digit1-9");
  const uint32_t more = b_.repeat(digit, 0, 15, "digits");
  const uint32_t minus = b_.choice({b_.literal("-"), {}}, "minus");
  integer_ = b_.choice({{b_.ref(minus), b_.byte('0')}, {b_.ref(minus), b_.ref(nonzero), b_.ref(more)}}, "integer");
  return *integer_;
}

uint32_t json_rules::number() {
  if (number_) return *number_;
  const uint32_t digit = b_.codepoints({{'0', '9'}}, "digit");
  const uint32_t frac_digits = b_.repeat(digit, 1, 16, "fraction-digits");
  const uint32_t exp_digits = b_.repeat(digit, 1, 3, "exponent-digits");
  const uint32_t frac = b_.choice({{b_.byte('.'), b_.ref(frac_digits)}, {}}, "fraction");
  const uint32_t e = b_.codepoints({{'e', 'e'}, {'E', 'E'}}, "e");
  const uint32_t sign = b_.choice({b_.literal("+"), b_.literal("-"), {}}, "exponent-sign");
  const uint32_t exp = b_.choice({{b_.ref(e), b_.ref(sign), b_.ref(exp_digits)}, {}}, "exponent");
  number_ = b_.choice({{b_.ref(integer()), b_.ref(frac), b_.ref(exp)}}, "number");
  return *number_;
}

uint32_t json_rules::value() {
  if (value_) return *value_;
  value_ = b_.rule("value");
  for (uint32_t r : {object(), array(), string(), number()}) b_.alt(*value_, {b_.ref(r)});
  for (const char* lit : {"true", "false", "null"}) b_.alt(*value_, b_.literal(lit));
  return *value_;
}

uint32_t json_rules::object() {
  if (object_) return *object_;
  object_ = b_.rule("object");
  const uint32_t v = value();  // object_ is set first: value() refers back to it
  auto member = [&] {
    grammar_builder::sequence m{b_.ref(string())};
    b_.append_literal(m, ":");
    m.push_back(b_.ref(sp()));
    m.push_back(b_.ref(v));
    return m;
  };
  auto more = member();
  more.insert(more.begin(), b_.ref(sp()));
  more.insert(more.begin(), b_.byte(','));
  const uint32_t tail = b_.repeat(b_.choice({more}, "member-more"), 0, -1, "members");
  b_.alt(*object_, b_.literal("{}"));
  auto full = b_.literal("{");
  for (auto it : member()) full.push_back(it);
  full.push_back(b_.ref(tail));
  b_.append_literal(full, "}");
  b_.alt(*object_, full);
  return *object_;
}

uint32_t json_rules::array() {
  if (array_) return *array_;
  array_ = b_.rule("array");
  const uint32_t v = value();
  const uint32_t tail = b_.repeat(b_.choice({{b_.byte(','), b_.ref(sp()), b_.ref(v)}}, "item-more"), 0, -1, "items");
  b_.alt(*array_, b_.literal("[]"));
  auto full = b_.literal("[");
  full.push_back(b_.ref(v));
  full.push_back(b_.ref(tail));
  b_.append_literal(full, "]");
  b_.alt(*array_, full);
  return *array_;
}

uint32_t json_rules::string_codepoints(const ranges& set, const std::string& name) {
  // Raw: the set less the controls, '"' and '\'; escaped: those three kinds as JSON writes them.
  ranges raw;
  std::vector<uint32_t> escaped;
  for (auto [lo, hi] : set) {
    for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x5C); ++c)
      if (c < 0x20 || c == '"' || c == '\\') escaped.push_back(c);
    auto add = [&](uint32_t a, uint32_t z) {
      a = std::max(a, lo);
      z = std::min(z, hi);
      if (a <= z) raw.emplace_back(a, z);
    };
    add(0x20, 0x21);
    add(0x23, 0x5B);
    add(0x5D, 0x10FFFF);
  }
  const uint32_t r = b_.rule(name);
  if (!raw.empty()) b_.alt(r, {b_.ref(b_.codepoints(raw, name + "-raw"))});
  std::sort(escaped.begin(), escaped.end());
  escaped.erase(std::unique(escaped.begin(), escaped.end()), escaped.end());
  for (uint32_t c : escaped) {
    const char* hex = "0123456789abcdef";
    std::string e = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r"
                  : std::string("\\u00") + hex[c >> 4] + hex[c & 15];
    b_.alt(r, b_.literal(e));
  }
  if (raw.empty() && escaped.empty()) return b_.codepoints({}, name + "-none");  // no alternative: refused at finish
  return r;
}

}  // namespace grammar_detail

namespace {

// JSON pointer escaping of one token.
std::string pointer_token(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

const std::set<std::string>& annotations() {
  static const std::set<std::string> a = {"title", "description", "$schema", "$id", "$comment", "examples",
                                          "default", "deprecated", "readOnly", "writeOnly", "$defs", "definitions"};
  return a;
}

struct schema_compiler {
  grammar_builder& b;
  json_rules j;
  const json& root;
  std::map<std::string, uint32_t> refs;  // JSON pointer → rule
  std::optional<grammar_error> err;
  int depth = 0;

  std::optional<uint32_t> fail(std::string msg, const std::string& where) {
    if (!err) err = grammar_error{std::move(msg), where.empty() ? "/" : where};
    return std::nullopt;
  }

  std::optional<uint32_t> literal_rule(const json& v, const std::string& name) {
    return b.choice({b.literal(v.dump())}, name);
  }

  static bool type_matches(const json& v, const std::string& t) {
    if (t == "string") return v.is_string();
    if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
    if (t == "number") return v.is_number();
    if (t == "boolean") return v.is_boolean();
    if (t == "null") return v.is_null();
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    return false;
  }

  std::optional<int64_t> count(const json& s, const char* key, const std::string& where) {
    auto it = s.find(key);
    if (it == s.end()) return std::nullopt;
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 10000) {
      fail(std::string(key) + " must be an integer in [0, 10000]", where);
      return std::nullopt;
    }
    return it->get<int64_t>();
  }

  std::optional<uint32_t> resolve(const std::string& ref, const std::string& where) {
    if (auto it = refs.find(ref); it != refs.end()) return it->second;
    if (ref.empty() || ref[0] != '#') return fail("only local $ref (\"#...\") is supported, got \"" + ref + "\"", where);
    const json* target = &root;
    std::string pointer = ref.substr(1);
    if (!pointer.empty()) {
      try {
        target = &root.at(json::json_pointer(pointer));
      } catch (const std::exception&) {
        return fail("$ref \"" + ref + "\" points at nothing", where);
      }
    }
    const uint32_t r = b.rule("ref:" + pointer);
    refs.emplace(ref, r);  // before compiling: a recursive schema refers back to this rule
    auto body = compile(*target, pointer.empty() ? "" : pointer);
    if (!body) return std::nullopt;
    b.alt(r, {b.ref(*body)});
    return r;
  }

  std::optional<uint32_t> compile(const json& s, const std::string& where) {
    if (err) return std::nullopt;
    if (++depth > 64) return fail("schema nested deeper than 64", where);
    struct leave {
      int& d;
      ~leave() { --d; }
    } guard{depth};
    if (s.is_boolean()) {
      if (s.get<bool>()) return j.value();
      return fail("the schema false matches nothing", where);
    }
    if (!s.is_object()) return fail("a schema must be an object or a boolean", where);
    auto present = keywords(s, where);
    if (!present) return std::nullopt;
    if (present->contains("$ref") || present->contains("anyOf") || present->contains("oneOf"))
      return combinator(s, where);
    std::vector<std::string> types;
    if (!read_types(s, where, types)) return std::nullopt;
    if (present->contains("const") || present->contains("enum")) return value_rule(s, *present, types, where);
    return typed_rule(s, *present, std::move(types), where);
  }

  // The schema's keywords (annotations skipped); nullopt (failed) on an unsupported one, or a
  // combinator beside others.
  std::optional<std::set<std::string>> keywords(const json& s, const std::string& where) {
    static const std::set<std::string> known = {"type", "properties", "required", "additionalProperties", "items",
                                                "minItems", "maxItems", "minLength", "maxLength", "pattern",
                                                "enum", "const", "anyOf", "oneOf", "$ref"};
    std::set<std::string> present;
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (annotations().contains(it.key())) continue;
      if (!known.contains(it.key())) return fail("unsupported keyword \"" + it.key() + "\"", where), std::nullopt;
      present.insert(it.key());
    }
    for (const char* combinator : {"$ref", "anyOf", "oneOf"})
      if (present.contains(combinator) && present.size() > 1)
        return fail(std::string(combinator) + " together with other keywords is not supported", where), std::nullopt;
    return present;
  }

  // $ref, anyOf or oneOf (alone in their schema).
  std::optional<uint32_t> combinator(const json& s, const std::string& where) {
    if (auto it = s.find("$ref"); it != s.end()) {
      if (!it->is_string()) return fail("$ref must be a string", where + "/$ref");
      return resolve(it->get<std::string>(), where);
    }
    const char* name = s.contains("anyOf") ? "anyOf" : "oneOf";
    const json& list = s[name];
    if (!list.is_array() || list.empty()) return fail(std::string(name) + " must be a non-empty array", where);
    std::vector<grammar_builder::sequence> alts;
    for (size_t i = 0; i < list.size(); ++i) {
      auto r = compile(list[i], where + "/" + name + "/" + std::to_string(i));
      if (!r) return std::nullopt;
      alts.push_back({b.ref(*r)});
    }
    return b.choice(std::move(alts), where + "/" + name);
  }

  // "type" (a name or a list of names) into `types`; false (failed) when malformed.
  bool read_types(const json& s, const std::string& where, std::vector<std::string>& types) {
    auto it = s.find("type");
    if (it == s.end()) return true;
    if (it->is_string()) {
      types.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const auto& t : *it) {
        if (!t.is_string()) return fail("type must be a string or an array of strings", where + "/type"), false;
        types.push_back(t.get<std::string>());
      }
    } else {
      return fail("type must be a string or an array of strings", where + "/type"), false;
    }
    static const std::set<std::string> names = {"string", "integer", "number", "boolean", "null", "object", "array"};
    for (const auto& t : types)
      if (!names.contains(t)) return fail("unknown type \"" + t + "\"", where + "/type"), false;
    if (types.empty()) return fail("type must not be an empty array", where + "/type"), false;
    return true;
  }

  // const or enum: the listed values that the schema's types allow.
  std::optional<uint32_t> value_rule(const json& s, const std::set<std::string>& present,
                                     const std::vector<std::string>& types, const std::string& where) {
    auto allowed = [&](const json& v) {
      return types.empty() || std::any_of(types.begin(), types.end(), [&](const std::string& t) { return type_matches(v, t); });
    };
    if (auto it = s.find("const"); it != s.end()) {
      if (present.contains("enum")) return fail("const together with enum is not supported", where);
      if (!allowed(*it)) return fail("const does not match the schema's type", where + "/const");
      return literal_rule(*it, where + "/const");
    }
    const json& values = s["enum"];
    if (!values.is_array() || values.empty()) return fail("enum must be a non-empty array", where + "/enum");
    std::vector<grammar_builder::sequence> alts;
    for (const auto& v : values)
      if (allowed(v)) alts.push_back(b.literal(v.dump()));
    if (alts.empty()) return fail("no enum value matches the schema's type", where + "/enum");
    return b.choice(std::move(alts), where + "/enum");
  }

  // The schema's types (listed, else inferred from its keywords, else any value), each by its
  // own rule; a keyword that applies to none of them is refused rather than ignored.
  std::optional<uint32_t> typed_rule(const json& s, const std::set<std::string>& present, std::vector<std::string> types,
                                     const std::string& where) {
    if (types.empty()) {
      if (present.contains("properties") || present.contains("required") || present.contains("additionalProperties"))
        types.push_back("object");
      if (present.contains("items") || present.contains("minItems") || present.contains("maxItems"))
        types.push_back("array");
      if (present.contains("minLength") || present.contains("maxLength") || present.contains("pattern"))
        types.push_back("string");
      if (types.empty()) return j.value();
    }
    auto needs = [&](const char* key, const char* type) -> bool {
      if (present.contains(key) && std::find(types.begin(), types.end(), type) == types.end()) {
        fail(std::string(key) + " applies to type " + type + ", which the schema does not allow", where);
        return false;
      }
      return true;
    };
    for (const char* k : {"properties", "required", "additionalProperties"})
      if (!needs(k, "object")) return std::nullopt;
    for (const char* k : {"items", "minItems", "maxItems"})
      if (!needs(k, "array")) return std::nullopt;
    for (const char* k : {"minLength", "maxLength", "pattern"})
      if (!needs(k, "string")) return std::nullopt;
    std::vector<grammar_builder::sequence> alts;
    for (const auto& t : types) {
      std::optional<uint32_t> r;
      if (t == "string") r = string_schema(s, where);
      else if (t == "integer") r = j.integer();
      else if (t == "number") r = j.number();
      else if (t == "boolean") r = b.choice({b.literal("true"), b.literal("false")}, "boolean");
      else if (t == "null") r = b.choice({b.literal("null")}, "null");
      else if (t == "object") r = object_schema(s, where);
      else if (t == "array") r = array_schema(s, where);
      if (!r) return std::nullopt;
      alts.push_back({b.ref(*r)});
    }
    return alts.size() == 1 ? alts[0][0].arg : b.choice(std::move(alts), where + "/type");
  }

  std::optional<uint32_t> string_schema(const json& s, const std::string& where) {
    auto min = count(s, "minLength", where + "/minLength");
    auto max = count(s, "maxLength", where + "/maxLength");
    if (err) return std::nullopt;
    if (auto it = s.find("pattern"); it != s.end()) {
      if (!it->is_string()) return fail("pattern must be a string", where + "/pattern");
      if (min || max) return fail("pattern together with minLength/maxLength is not supported", where);
      grammar_error e;
      auto body = grammar_detail::regex_rule(b, it->get<std::string>(), true, e);
      if (!body) return fail("pattern: " + e.text(), where + "/pattern");
      auto q = b.literal("\"");
      q.push_back(b.ref(*body));
      b.append_literal(q, "\"");
      return b.choice({q}, where + "/pattern");
    }
    if (!min && !max) return j.string();
    if (min && max && *min > *max) return fail("minLength is above maxLength", where);
    const uint32_t chars = b.repeat(j.chr(), min.value_or(0), max ? *max : -1, where + "/chars");
    auto q = b.literal("\"");
    q.push_back(b.ref(chars));
    b.append_literal(q, "\"");
    return b.choice({q}, where + "/string");
  }

  std::optional<uint32_t> array_schema(const json& s, const std::string& where) {
    auto min = count(s, "minItems", where + "/minItems");
    auto max = count(s, "maxItems", where + "/maxItems");
    if (err) return std::nullopt;
    if (min && max && *min > *max) return fail("minItems is above maxItems", where);
    uint32_t item = 0;
    if (auto it = s.find("items"); it != s.end()) {
      if (it->is_array()) return fail("items as an array (tuple form) is not supported", where + "/items");
      auto r = compile(*it, where + "/items");
      if (!r) return std::nullopt;
      item = *r;
    } else {
      item = j.value();
    }
    const int64_t lo = min.value_or(0);
    const int64_t hi = max ? *max : -1;
    const uint32_t more = b.choice({{b.byte(','), b.ref(j.sp()), b.ref(item)}}, where + "/item-more");
    const uint32_t r = b.rule(where + "/array");
    if (lo == 0) b.alt(r, b.literal("[]"));
    if (hi != 0) {
      auto full = b.literal("[");
      full.push_back(b.ref(item));
      full.push_back(b.ref(b.repeat(more, std::max<int64_t>(lo - 1, 0), hi < 0 ? -1 : hi - 1, where + "/items")));
      b.append_literal(full, "]");
      b.alt(r, full);
    }
    return r;
  }

  struct object_members {
    std::vector<std::pair<std::string, uint32_t>> props;  // compiled, in declared order
    std::set<std::string> required;
    std::optional<uint32_t> extra;  // the value rule of extra properties, when allowed
  };
  std::optional<object_members> fail_members(std::string msg, const std::string& where) {
    fail(std::move(msg), where);
    return std::nullopt;
  }

  // An object schema's properties, required names and extra-property rule.
  std::optional<object_members> members_of(const json& s, const std::string& where) {
    object_members o;
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) return fail_members("required must be an array of strings", where + "/required");
      for (const auto& n : *it) {
        if (!n.is_string()) return fail_members("required must be an array of strings", where + "/required");
        o.required.insert(n.get<std::string>());
      }
    }
    auto pit = s.find("properties");
    if (pit != s.end()) {
      if (!pit->is_object()) return fail_members("properties must be an object", where + "/properties");
      for (auto it = pit->begin(); it != pit->end(); ++it) {
        auto r = compile(it.value(), where + "/properties/" + pointer_token(it.key()));
        if (!r) return std::nullopt;
        o.props.emplace_back(it.key(), *r);
      }
    }
    for (const auto& n : o.required)
      if (std::none_of(o.props.begin(), o.props.end(), [&](const auto& p) { return p.first == n; }))
        return fail_members("required property \"" + n + "\" is not in properties", where + "/required");
    if (auto it = s.find("additionalProperties"); it != s.end()) {
      if (!(it->is_boolean() && !it->get<bool>())) {
        auto r = compile(*it, where + "/additionalProperties");
        if (!r) return std::nullopt;
        o.extra = *r;
      }
    } else if (pit == s.end()) {
      o.extra = j.value();
    }
    return o;
  }

  std::optional<uint32_t> object_schema(const json& s, const std::string& where) {
    auto members = members_of(s, where);
    if (!members) return std::nullopt;
    const auto& [props, required, extra] = *members;
    // rest(i, after): properties i.. given whether one was already written (a comma first).
    std::map<std::pair<size_t, bool>, uint32_t> memo;
    auto comma = [&](grammar_builder::sequence& q, bool after) {
      if (after) {
        q.push_back(b.byte(','));
        q.push_back(b.ref(j.sp()));
      }
    };
    std::optional<uint32_t> extras_after;
    std::function<uint32_t(size_t, bool)> rest = [&](size_t i, bool after) -> uint32_t {
      if (auto m = memo.find({i, after}); m != memo.end()) return m->second;
      const uint32_t r = b.rule(where + "/rest");
      memo.emplace(std::make_pair(i, after), r);
      if (i == props.size()) {
        b.alt(r, {});
        if (extra) {
          grammar_builder::sequence q;
          comma(q, after);
          q.push_back(b.ref(j.string()));
          b.append_literal(q, ":");
          q.push_back(b.ref(j.sp()));
          q.push_back(b.ref(*extra));
          if (!extras_after) {
            const uint32_t more = b.choice({{b.byte(','), b.ref(j.sp()), b.ref(j.string()), b.byte(':'), b.ref(j.sp()),
                                             b.ref(*extra)}},
                                           where + "/extra-more");
            extras_after = b.repeat(more, 0, -1, where + "/extras");
          }
          q.push_back(b.ref(*extras_after));
          b.alt(r, q);
        }
        return r;
      }
      grammar_builder::sequence q;
      comma(q, after);
      b.append_literal(q, json(props[i].first).dump() + ":");
      q.push_back(b.ref(j.sp()));
      q.push_back(b.ref(props[i].second));
      q.push_back(b.ref(rest(i + 1, true)));
      b.alt(r, q);
      if (!required.contains(props[i].first)) b.alt(r, {b.ref(rest(i + 1, after))});
      return r;
    };
    auto q = b.literal("{");
    q.push_back(b.ref(rest(0, false)));
    b.append_literal(q, "}");
    return b.choice({q}, where + "/object");
  }
};

}  // namespace

std::optional<grammar_error> compile_json_schema(std::string_view text, grammar& out) {
  json schema;
  try {
    schema = json::parse(text);
  } catch (const json::parse_error& e) {
    return grammar_error{std::string("the schema is not valid JSON: ") + e.what(),
                         grammar_detail::line_column(text, e.byte > 0 ? e.byte - 1 : 0)};
  }
  grammar_builder b;
  schema_compiler c{b, json_rules(b), schema, {}, std::nullopt};
  auto root = c.compile(schema, "");
  if (!root) return c.err.value_or(grammar_error{"the schema compiled to nothing", ""});
  return b.finish(*root, out);
}

std::optional<grammar_error> compile_json_object(grammar& out) {
  grammar_builder b;
  json_rules j(b);
  return b.finish(j.object(), out);
}

}  // namespace shoal::runtime
