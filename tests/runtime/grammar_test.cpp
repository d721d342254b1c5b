// The grammar engine: EBNF, regex and JSON-schema front ends (languages and errors with their
// positions), the matcher (bytes, tokens, rollback, end), and the token mask against a brute
// force over the whole vocabulary; tool calls in the DeepSeek-V3 format.
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>

#include <nlohmann/json.hpp>

#include "model/tokenizer.hpp"
#include "runtime/structured/grammar.hpp"
#include "runtime/structured/tool_calls.hpp"
#include "tests/support/process.hpp"

using namespace shoal::runtime;

namespace {

std::shared_ptr<compiled_grammar> compiled(constraint_spec spec, std::shared_ptr<const token_vocab> v) {
  auto r = compile_for(spec, std::move(v));
  if (auto* e = std::get_if<grammar_error>(&r)) FAIL("compile: " << e->text());
  return std::get<std::shared_ptr<compiled_grammar>>(r);
}

// 256 single bytes, then multi-byte tokens (JSON pieces, words, a split UTF-8 character), a
// special token and eos.
std::shared_ptr<const token_vocab> small_vocab() {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  for (const char* t : {"{\"", "\":", "\",", "\"}", "\"]", "[\"", "ab", "abc", "true", "false", "null", "\\u", "\\n",
                        "12", "0.", "e+", "}}", "]]", ", ", ": ", "\xc3", "\xc3\xa9", "\xa9\"", "xyz", "{}", "[]"})
    bytes.emplace_back(t);
  std::vector<bool> special(bytes.size(), false);
  bytes.emplace_back("<special>");
  special.push_back(true);
  bytes.emplace_back("<eos>");
  special.push_back(true);
  return std::make_shared<token_vocab>(bytes, special, static_cast<int32_t>(bytes.size() - 1));
}

bool matches(const std::shared_ptr<compiled_grammar>& g, std::string_view s) {
  grammar_matcher m(g);
  return m.accept_bytes(s) && m.can_end();
}

bool matches(constraint_spec spec, std::string_view s) { return matches(compiled(std::move(spec), small_vocab()), s); }

std::string error_of(constraint_spec spec) {
  grammar g;
  auto e = compile(spec, g);
  return e ? e->text() : std::string("(compiled)");
}

bool bit(const std::vector<uint64_t>& m, int32_t t) { return (m[static_cast<size_t>(t) >> 6] >> (t & 63)) & 1; }

// Walks `steps` random tokens through the grammar; at each state the mask must equal a brute
// force of accept_token over every token. Returns the text walked.
std::string check_masks(const std::shared_ptr<compiled_grammar>& g, uint32_t seed, int steps) {
  const auto& v = *g->vocab;
  grammar_matcher m(g);
  std::mt19937 rng(seed);
  std::string text;
  std::vector<uint64_t> mask((static_cast<size_t>(v.size()) + 63) / 64);
  for (int s = 0; s < steps && !m.terminated(); ++s) {
    m.fill_mask(mask);
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < v.size(); ++t) {
      const bool ok = m.accept_token(t);
      if (ok) m.rollback(1);
      CHECK_MESSAGE(ok == bit(mask, t), "token " << t << " after '" << text << "'");
      if (ok) allowed.push_back(t);
    }
    if (allowed.empty()) break;
    const int32_t pick = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
    REQUIRE(m.accept_token(pick));
    if (pick != v.eos_id()) text += v.bytes(pick);
  }
  return text;
}

}  // namespace

TEST_CASE("ebnf: literals, classes, groups, repetition and recursion") {
  constraint_spec g{constraint_kind::ebnf, R"g(
    # a tiny arithmetic language
    root   ::= expr ("=" num)?
    expr   ::= term (("+" | "-") term)*
    term   ::= num | "(" expr ")"
    num    ::= [0-9]{1,3}
  )g"};
  auto cg = compiled(g, small_vocab());
  CHECK(matches(cg, "1+2"));
  CHECK(matches(cg, "(1+(22-333))=7"));
  CHECK(matches(cg, "999"));
  CHECK_FALSE(matches(cg, "1000"));
  CHECK_FALSE(matches(cg, "1+"));
  CHECK_FALSE(matches(cg, "(1"));
  CHECK_FALSE(matches(cg, ""));
  constraint_spec u{constraint_kind::ebnf, "root ::= [^a-c\\n]+ \"\\u00e9\" 'x'? .\n"};
  CHECK(matches(u, "zz\xc3\xa9q"));
  CHECK(matches(u, "\xe2\x82\xac\xc3\xa9x\xf0\x9f\x98\x80"));
  CHECK_FALSE(matches(u, "ab\xc3\xa9q"));
  CHECK_FALSE(matches(u, "z\xc3\xa9"));
  constraint_spec e{constraint_kind::ebnf, "root ::= \"a\"{2,} \"b\"{0,2} \"c\"{3}"};
  CHECK(matches(e, "aaaaaccc"));
  CHECK(matches(e, "aabbccc"));
  CHECK_FALSE(matches(e, "abccc"));
  CHECK_FALSE(matches(e, "aabbbccc"));
}

TEST_CASE("ebnf: errors name the problem and its line and column") {
  CHECK(error_of({constraint_kind::ebnf, "root ::= foo\n"}) == "rule 'foo' is used but not defined at line 1, column 10");
  CHECK(error_of({constraint_kind::ebnf, "start ::= \"a\""}) == "the grammar has no rule 'root' at line 1, column 1");
  CHECK(error_of({constraint_kind::ebnf, "root ::= \"a\"\nroot ::= \"b\""}) ==
        "rule 'root' is defined twice at line 2, column 1");
  CHECK(error_of({constraint_kind::ebnf, "root ::= \"a\n\""}) == "unterminated string literal at line 1, column 10");
  CHECK(error_of({constraint_kind::ebnf, "root ::= (\"a\" | \"b\""}) == "unterminated group at line 1, column 10");
  CHECK(error_of({constraint_kind::ebnf, "root ::= [z-a]"}) == "range out of order at line 1, column 10");
  CHECK(error_of({constraint_kind::ebnf, "root = \"a\""}) == "expected '::=' after rule name 'root' at line 1, column 6");
  CHECK(error_of({constraint_kind::ebnf, "root ::= \"a\" @"}) == "unexpected character '@' at line 1, column 14");
  CHECK(error_of({constraint_kind::ebnf, "root ::= root \"a\" | \"b\""}) == "rule 'root' can recurse without consuming input");
  CHECK(error_of({constraint_kind::ebnf, "root ::= x* \"a\"\nx ::= \"\""}).find("can recurse without consuming") !=
        std::string::npos);
  CHECK(error_of({constraint_kind::ebnf, "root ::= \"a\"{3,2}"}) == "repetition range out of order at line 1, column 13");
  CHECK(error_of({constraint_kind::ebnf, "root ::= \"\\q\""}) == "unknown escape \\q at line 1, column 11");
}

TEST_CASE("regex: the whole output matches exactly what std::regex (ECMAScript) matches, over ASCII") {
  const std::vector<std::string> patterns = {
    "a*b",          "(ab|cd)+",   "[a-c]{2,4}",    "x?y*z",       "\\d+(\\.\\d{1,2})?", "[^ab]*",
    "(a|b)*abb",    "\\w+@\\w+\\.com", "a{3}",     "a{2,}",       "(?:ab)?c",           "[\\-_]+",
    "\\s*\\S+",     "(a|)b",      "[.]\\.",        ".?.?",        "(x|y|)(z|)",        "\\x41\\u0042[^\\W\\d]",
    "((a|b)c)*",    "a+?b??",     "[a-]+[\\]a]*",    "0|[1-9]\\d*",  "(?<g>ab)+",
  };
  const std::string alphabet = "abcxyzAB01_-. \n@";
  std::mt19937 rng(7);
  auto vocab = small_vocab();
  for (const auto& p : patterns) {
    std::regex re;
    try {
      re = std::regex(p, std::regex::ECMAScript);
    } catch (const std::regex_error&) {
      continue;  // std::regex refuses some ECMAScript forms ([]a], named groups)
    }
    auto cg = compiled({constraint_kind::regex, p}, vocab);
    int agree = 0;
    for (int n = 0; n < 600; ++n) {
      std::string s;
      const size_t len = std::uniform_int_distribution<size_t>(0, 7)(rng);
      for (size_t k = 0; k < len; ++k) s += alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
      const bool want = std::regex_match(s, re);
      CHECK_MESSAGE(matches(cg, s) == want, "pattern " << p << " on '" << s << "'");
      agree += matches(cg, s) == want;
    }
    CHECK(agree == 600);
  }
  CHECK(matches({constraint_kind::regex, "[a-]+[\\]a]*"}, "-a]]a"));
  CHECK(matches({constraint_kind::regex, "(?<g>ab)+"}, "abab"));
  CHECK(matches({constraint_kind::regex, "[\\u00e0-\\u00ff]\\u{1F600}"}, "\xc3\xa9\xf0\x9f\x98\x80"));
  CHECK_FALSE(matches({constraint_kind::regex, "[\\u00e0-\\u00ff]"}, "\xc3\x9f"));
  CHECK(matches({constraint_kind::regex, "^ab$"}, "ab"));
}

TEST_CASE("regex: errors name the problem and its offset") {
  CHECK(error_of({constraint_kind::regex, "(ab"}) == "unterminated group at offset 0");
  CHECK(error_of({constraint_kind::regex, "ab)"}) == "unmatched ')' at offset 2");
  CHECK(error_of({constraint_kind::regex, "[ab"}) == "unterminated character class at offset 0");
  CHECK(error_of({constraint_kind::regex, "*a"}) == "nothing to repeat at offset 0");
  CHECK(error_of({constraint_kind::regex, "a**"}) == "nothing to repeat at offset 2");
  CHECK(error_of({constraint_kind::regex, "(a)\\1"}) == "backreferences are not supported at offset 3");
  CHECK(error_of({constraint_kind::regex, "a(?=b)"}) == "lookaround and other (? groups are not supported at offset 1");
  CHECK(error_of({constraint_kind::regex, "a{3,1}"}) == "quantifier range out of order at offset 0");
  CHECK(error_of({constraint_kind::regex, "a{5000}"}) == "repetition counts above 1000 are not supported at offset 0");
  CHECK(error_of({constraint_kind::regex, "[z-a]"}) == "range out of order at offset 4");
  CHECK(error_of({constraint_kind::regex, "a^b"}) == "anchors are supported only at the start and end of the pattern at offset 1");
  CHECK(error_of({constraint_kind::regex, "a[]"}) == "an empty character class matches nothing at offset 1");
  CHECK(error_of({constraint_kind::regex, "\\q"}) == "unknown escape \\q at offset 0");
  CHECK(error_of({constraint_kind::regex, "a\\bc"}) == "word boundaries (\\b) are not supported at offset 1");
  CHECK(error_of({constraint_kind::regex, "(a*)*"}).find("can recurse without consuming input") != std::string::npos);
}

TEST_CASE("json schema: objects keep declared order, optional properties may be left out, types and literals") {
  constraint_spec s{constraint_kind::json_schema, R"({
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 3}, "age": {"type": "integer"},
                   "tags": {"type": "array", "items": {"enum": ["a", 1, null]}, "maxItems": 2},
                   "ok": {"type": ["boolean", "null"]}, "k": {"const": {"x": [1.5, "y"]}}},
    "required": ["name", "k"],
    "additionalProperties": false
  })"};
  auto cg = compiled(s, small_vocab());
  CHECK(matches(cg, R"({"name":"abc","k":{"x":[1.5,"y"]}})"));
  CHECK(matches(cg, R"({"name": "", "age": -12, "tags": ["a", null], "ok": null, "k": {"x":[1.5,"y"]}})"));
  CHECK(matches(cg, R"({"name":"\u00e9\n","ok":true,"k":{"x":[1.5,"y"]}})"));
  CHECK_FALSE(matches(cg, R"({"name":"abcd","k":{"x":[1.5,"y"]}})"));       // maxLength
  CHECK_FALSE(matches(cg, R"({"age":1,"name":"a","k":{"x":[1.5,"y"]}})"));  // order
  CHECK_FALSE(matches(cg, R"({"name":"a"})"));                              // required k
  CHECK_FALSE(matches(cg, R"({"name":"a","tags":[1,1,1],"k":{"x":[1.5,"y"]}})"));
  CHECK_FALSE(matches(cg, R"({"name":"a","age":01,"k":{"x":[1.5,"y"]}})"));
  CHECK_FALSE(matches(cg, R"({"name":"a","extra":1,"k":{"x":[1.5,"y"]}})"));
  CHECK_FALSE(matches(cg, R"({"name":"\ud800","k":{"x":[1.5,"y"]}})"));  // a lone surrogate escape
  constraint_spec any{constraint_kind::json_object, ""};
  CHECK(matches(any, R"({"a":[1,{"b":null}],"c":"d\"e","f":-0.5e+10})"));
  CHECK_FALSE(matches(any, R"([1])"));
  CHECK_FALSE(matches(any, R"({"a":1,})"));
}

TEST_CASE("json schema: pattern, $ref recursion, anyOf and extra properties") {
  constraint_spec s{constraint_kind::json_schema, R"({
    "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                       "required": ["v"]}},
    "type": "object",
    "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
                   "q": {"type": "string", "pattern": "\"x"},
                   "tree": {"$ref": "#/$defs/node"},
                   "u": {"anyOf": [{"type": "number"}, {"type": "string", "minLength": 2, "maxLength": 2}]},
                   "m": {"type": "object", "additionalProperties": {"type": "boolean"}}},
    "required": ["id"]
  })"};
  auto cg = compiled(s, small_vocab());
  CHECK(matches(cg, R"({"id":"AB-123"})"));
  CHECK(matches(cg, R"({"id":"XY-000","q":"ab\"xyz","tree":{"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]},"u":"ok","m":{"a":true,"b":false}})"));
  CHECK(matches(cg, R"({"id":"XY-000","u":2.5e-3,"m":{}})"));
  CHECK_FALSE(matches(cg, R"({"id":"AB-1234"})"));
  CHECK_FALSE(matches(cg, R"({"id":"AB-123","q":"abc"})"));
  CHECK_FALSE(matches(cg, R"({"id":"AB-123","tree":{"kids":[]}})"));
  CHECK_FALSE(matches(cg, R"({"id":"AB-123","u":"abc"})"));
  CHECK_FALSE(matches(cg, R"({"id":"AB-123","m":{"a":1}})"));
}

TEST_CASE("json schema: unsupported or bad schemas are refused with the keyword and its path") {
  using K = constraint_kind;
  CHECK(error_of({K::json_schema, R"({"type":"integer","minimum":3})"}) == "unsupported keyword \"minimum\" at /");
  CHECK(error_of({K::json_schema, R"({"properties":{"a":{"type":"string","format":"email"}}})"}) ==
        "unsupported keyword \"format\" at /properties/a");
  CHECK(error_of({K::json_schema, R"({"type":"strnig"})"}) == "unknown type \"strnig\" at /type");
  CHECK(error_of({K::json_schema, R"({"type":"object","required":["x"]})"}) ==
        "required property \"x\" is not in properties at /required");
  CHECK(error_of({K::json_schema, R"({"$ref":"#/$defs/missing"})"}) == "$ref \"#/$defs/missing\" points at nothing at /");
  CHECK(error_of({K::json_schema, R"({"$ref":"http://example.com/s.json"})"}) ==
        "only local $ref (\"#...\") is supported, got \"http://example.com/s.json\" at /");
  CHECK(error_of({K::json_schema, R"({"type":"string","pattern":"(a"})"}) ==
        "pattern: unterminated group at offset 0 at /pattern");
  CHECK(error_of({K::json_schema, R"({"type":"integer","maxLength":3})"}) ==
        "maxLength applies to type string, which the schema does not allow at /");
  CHECK(error_of({K::json_schema, R"({"type":"string","minLength":5,"maxLength":2})"}) ==
        "minLength is above maxLength at /");
  CHECK(error_of({K::json_schema, R"({"enum":[1,2],"type":"string"})"}) == "no enum value matches the schema's type at /enum");
  CHECK(error_of({K::json_schema, "false"}) == "the schema false matches nothing at /");
  CHECK(error_of({K::json_schema, R"({"type": "object",)"}).rfind("the schema is not valid JSON", 0) == 0);
  CHECK(error_of({K::json_schema, R"({"items":[{"type":"string"}]})"}) ==
        "items as an array (tuple form) is not supported at /items");
  CHECK(error_of({K::json_schema, R"({"anyOf":[{"type":"string"}],"type":"string"})"}) ==
        "anyOf together with other keywords is not supported at /");
}

TEST_CASE("matcher: tokens, eos only at a whole match, rollback, special tokens refused") {
  auto v = small_vocab();
  auto cg = compiled({constraint_kind::regex, "(ab)+"}, v);
  grammar_matcher m(cg);
  const int32_t ab = 256 + 6, abc = 256 + 7, eos = v->eos_id(), special = v->eos_id() - 1;
  CHECK_FALSE(m.accept_token(eos));
  CHECK_FALSE(m.accept_token(abc));
  CHECK_FALSE(m.accept_token(special));
  REQUIRE(m.accept_token(ab));
  CHECK(m.can_end());
  CHECK_FALSE(m.terminated());
  REQUIRE(m.accept_token('a'));
  CHECK_FALSE(m.can_end());
  REQUIRE(m.accept_token('b'));
  CHECK(m.history() == 3);
  m.rollback(2);
  CHECK(m.history() == 1);
  CHECK(m.can_end());
  REQUIRE(m.accept_token(eos));
  CHECK(m.terminated());
  CHECK_FALSE(m.accept_token('a'));
  auto fixed = compiled({constraint_kind::regex, "ab"}, v);
  grammar_matcher f(fixed);
  REQUIRE(f.accept_token(ab));
  CHECK(f.terminated());  // nothing can follow
}

TEST_CASE("mask: equals accept_token over the whole vocabulary along random walks") {
  auto v = small_vocab();
  const std::vector<constraint_spec> specs = {
    {constraint_kind::json_object, ""},
    {constraint_kind::json_schema, R"({"type":"object","properties":{"a":{"type":"string","maxLength":4},
       "b":{"type":"array","items":{"type":"number"},"maxItems":3},"c":{"enum":["x\u00e9",true]}},"required":["a"]})"},
    {constraint_kind::regex, "(abc|ab)*x?[\\u00e0-\\u00ff]{0,2}\"?"},
    {constraint_kind::ebnf, "root ::= (\"ab\" | [0-9]+ \".\")* \"}}\" tail\ntail ::= \"\" | \"xyz\" tail"},
  };
  for (size_t i = 0; i < specs.size(); ++i) {
    auto cg = compiled(specs[i], v);
    for (uint32_t seed = 0; seed < 4; ++seed) check_masks(cg, seed * 31 + static_cast<uint32_t>(i), 40);
    CHECK(cg->cache_walks > 0);
  }
}

namespace {

// A random walk under the mask: eos half the time it is allowed, otherwise tokens holding ASCII
// punctuation (closing quotes and brackets, '@', '.') but no opening bracket 40 times likelier
// than the rest, so walks end.
std::string random_sample(const std::shared_ptr<compiled_grammar>& g, std::mt19937& rng, int max_tokens,
                          double& mask_s, int64_t& masks) {
  const auto& v = *g->vocab;
  grammar_matcher m(g);
  std::vector<uint64_t> mask((static_cast<size_t>(v.size()) + 63) / 64);
  std::string text;
  std::vector<int32_t> ids;
  std::vector<double> weights;
  for (int s = 0; s < max_tokens && !m.terminated(); ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    m.fill_mask(mask);
    mask_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++masks;
    ids.clear();
    weights.clear();
    bool eos = false;
    for (size_t w = 0; w < mask.size(); ++w)
      for (uint64_t bits = mask[w]; bits; bits &= bits - 1) {
        const auto t = static_cast<int32_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(bits)));
        if (t == v.eos_id()) {
          eos = true;
          continue;
        }
        ids.push_back(t);
        const std::string& b = v.bytes(t);
        const bool opens = b.find_first_of("{[") != std::string::npos;
        const bool punct = std::any_of(b.begin(), b.end(), [](char c) { return std::ispunct(static_cast<unsigned char>(c)) != 0; });
        weights.push_back(!opens && punct ? 40.0 : 1.0);
      }
    REQUIRE_MESSAGE((eos || !ids.empty()), "no token continues '" << text << "'");
    int32_t pick;
    if (eos && (ids.empty() || std::bernoulli_distribution(0.5)(rng))) pick = v.eos_id();
    else pick = ids[std::discrete_distribution<size_t>(weights.begin(), weights.end())(rng)];
    REQUIRE(m.accept_token(pick));
    if (pick != v.eos_id()) text += v.bytes(pick);
  }
  CHECK_MESSAGE(m.terminated(), "walk did not end: " << text);
  return text;
}

std::shared_ptr<const token_vocab> deepseek_vocab() {
  auto tok = shoal::model::tokenizer::load(std::string(SHOAL_SHARED_DIR) + "/tokenizers/deepseek-v3/tokenizer.json");
  REQUIRE_MESSAGE(tok, "the DeepSeek-V3 tokenizer in ../shared/tokenizers");
  return make_token_vocab(*tok, tok->vocab_size(), tok->eos_id());
}

}  // namespace

TEST_CASE("json schema: samples of 36 schemas, over a byte vocabulary and DeepSeek-V3's, all validate under jsonschema") {
  namespace fs = std::filesystem;
  const fs::path schemas_file = fs::path(SHOAL_SOURCE_DIR) / "tests/runtime/data/json_schemas.json";
  const auto schemas = nlohmann::ordered_json::parse(shoal::test::read_text(schemas_file));
  REQUIRE(schemas.size() >= 30);
  shoal::test::temp_dir dir;
  const fs::path samples = dir.path / "samples.jsonl";
  std::ofstream out(samples);
  std::mt19937 rng(2026);
  int written = 0;
  struct run {
    std::shared_ptr<const token_vocab> vocab;
    int per_schema;
    double mask_s = 0;
    int64_t masks = 0;
  };
  std::vector<run> runs = {{small_vocab(), 14}, {deepseek_vocab(), 2}};
  for (auto& r : runs)
    for (size_t i = 0; i < schemas.size(); ++i) {
      auto cg = compiled({constraint_kind::json_schema, schemas[i].dump()}, r.vocab);
      for (int k = 0; k < r.per_schema; ++k) {
        const std::string text = random_sample(cg, rng, 3000, r.mask_s, r.masks);
        out << nlohmann::json{{"schema", i}, {"text", text}}.dump() << "\n";
        ++written;
      }
    }
  out.close();
  MESSAGE(written << " samples; mask per token: " << 1e6 * runs[0].mask_s / static_cast<double>(runs[0].masks)
                  << " us (byte vocabulary), " << 1e6 * runs[1].mask_s / static_cast<double>(runs[1].masks)
                  << " us (DeepSeek-V3, " << runs[1].vocab->size() << " tokens, per-position caches filled on first use)");
  CHECK(written >= 500);
  const fs::path log = dir.path / "validate.out", errs = dir.path / "validate.err";
  shoal::test::child_process p({"/usr/bin/python3", (fs::path(SHOAL_SOURCE_DIR) / "tests/runtime/validate_json_samples.py").string(),
                                schemas_file.string(), samples.string()},
                               log, errs);
  auto rc = p.wait_exit(std::chrono::seconds(300));
  const std::string report = shoal::test::read_text(log) + shoal::test::read_text(errs);
  CHECK_MESSAGE(rc == 0, report);
  CHECK_MESSAGE(report.find(std::to_string(written) + " of " + std::to_string(written) + " samples valid over " +
                            std::to_string(schemas.size()) + " schemas") != std::string::npos,
                report);
}

// -- tool calls ---------------------------------------------------------------------------------

namespace {

std::string call_text(const std::string& name, const std::string& args) {
  return special_token_bytes(tool_call_begin_token) + "function" + special_token_bytes(tool_sep_token) + name +
         "\n```json\n" + args + "\n```" + special_token_bytes(tool_call_end_token);
}

std::string calls_text(const std::vector<std::string>& calls) {
  std::string s = special_token_bytes(tool_calls_begin_token);
  for (size_t i = 0; i < calls.size(); ++i) s += (i ? "\n" : "") + calls[i];
  return s + special_token_bytes(tool_calls_end_token);
}

tool_config two_tools() {
  tool_config t;
  t.functions = {{"get_weather", "The weather in a city",
                  R"({"type":"object","properties":{"city":{"type":"string","maxLength":12}},"required":["city"],"additionalProperties":false})"},
                 {"add", "", R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"],"additionalProperties":false})"}};
  t.mode = tool_mode::required;
  return t;
}

}  // namespace

TEST_CASE("tool calls: the DeepSeek-V3 call format, each function's arguments held to its schema") {
  tool_config t = two_tools();
  const std::string weather = call_text("get_weather", R"({"city":"Paris"})");
  const std::string add = call_text("add", R"({"a":1, "b":-2})");
  auto g = compiled(tool_constraint(t, {}), small_vocab());
  CHECK(matches(g, calls_text({weather})));
  CHECK(matches(g, calls_text({weather, add, add})));
  CHECK_FALSE(matches(g, calls_text({call_text("get_weather", R"({"town":"Paris"})")})));  // off its schema
  CHECK_FALSE(matches(g, calls_text({call_text("add", R"({"city":"Paris"})")})));          // another's arguments
  CHECK_FALSE(matches(g, calls_text({call_text("nope", "{}")})));
  CHECK_FALSE(matches(g, calls_text({})));                                                  // required: one at least
  CHECK_FALSE(matches(g, R"({"city":"Paris"})"));                                          // no plain content
  // The tokens' text as plain UTF-8 is not the tokens.
  CHECK_FALSE(matches(g, std::string(tool_calls_begin_token) + std::string(tool_call_begin_token)));
  t.parallel = false;
  auto one = compiled(tool_constraint(t, {}), small_vocab());
  CHECK(matches(one, calls_text({add})));
  CHECK_FALSE(matches(one, calls_text({add, add})));
  t.mode = tool_mode::function, t.function = "add", t.parallel = true;
  auto named = compiled(tool_constraint(t, {}), small_vocab());
  CHECK(matches(named, calls_text({add})));
  CHECK_FALSE(matches(named, calls_text({weather})));
  CHECK_FALSE(matches(named, calls_text({add, add})));  // a named function: one call of it
  t.mode = tool_mode::auto_;
  auto free_text = compiled(tool_constraint(t, {}), small_vocab());
  CHECK(matches(free_text, "It is sunny, no call needed."));
  CHECK(matches(free_text, ""));
  CHECK(matches(free_text, calls_text({weather, add})));
  CHECK_FALSE(matches(free_text, "text then " + calls_text({weather})));  // content or calls, not both
  auto json_content = compiled(tool_constraint(t, {constraint_kind::json_object, ""}), small_vocab());
  CHECK(matches(json_content, R"({"x":1})"));
  CHECK(matches(json_content, calls_text({weather})));
  CHECK_FALSE(matches(json_content, "plain text"));

  tool_config bad = two_tools();
  bad.functions[1].parameters = R"({"type":"integer","maximum":3})";
  CHECK(error_of(tool_constraint(bad, {})) == "unsupported keyword \"maximum\" at /functions/1/parameters /");
  bad = two_tools();
  bad.mode = tool_mode::function, bad.function = "zzz";
  CHECK(error_of(tool_constraint(bad, {})) == "no function named 'zzz' at /functions");
  CHECK(error_of({constraint_kind::tool_calls, "[]"}) == "a tool-call constraint must be an object with 'mode' and 'functions'");
}

TEST_CASE("tool calls: the mask lets the tool-call tokens through exactly where a call goes, no raw 0xFF byte ever") {
  // A byte vocabulary (byte 0xFF among them) plus the five tool-call tokens as make_token_vocab
  // spells added tokens.
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  const std::vector<std::string_view> tokens = {tool_calls_begin_token, tool_calls_end_token, tool_call_begin_token,
                                                tool_call_end_token, tool_sep_token};
  for (auto t : tokens) bytes.push_back(special_token_bytes(t));
  bytes.push_back("\xFF<x>\xFF");  // not a special token's spelling: never usable
  bytes.emplace_back("<eos>");
  std::vector<bool> special(bytes.size(), false);
  special.back() = true;
  auto v = std::make_shared<token_vocab>(bytes, special, static_cast<int32_t>(bytes.size() - 1));
  const auto id_of = [&](std::string_view t) { return static_cast<int32_t>(256 + (std::find(tokens.begin(), tokens.end(), t) - tokens.begin())); };
  auto allowed = [&](grammar_matcher& m) {
    std::vector<uint64_t> mask((static_cast<size_t>(v->size()) + 63) / 64);
    m.fill_mask(mask);
    std::vector<int32_t> out;
    for (int32_t t = 0; t < v->size(); ++t)
      if (bit(mask, t)) out.push_back(t);
    return out;
  };
  grammar_matcher m(compiled(tool_constraint(two_tools(), {}), v));
  CHECK(allowed(m) == std::vector<int32_t>{id_of(tool_calls_begin_token)});
  REQUIRE(m.accept_token(id_of(tool_calls_begin_token)));
  CHECK(allowed(m) == std::vector<int32_t>{id_of(tool_call_begin_token)});
  CHECK_FALSE(m.accept_token(0xFF));  // the raw byte cannot start spelling one out
  grammar_matcher text(compiled(tool_constraint([] { auto t = two_tools(); t.mode = tool_mode::auto_; return t; }(), {}), v));
  auto first = allowed(text);
  CHECK(std::find(first.begin(), first.end(), id_of(tool_calls_begin_token)) != first.end());
  CHECK(std::find(first.begin(), first.end(), id_of(tool_sep_token)) == first.end());
  CHECK(std::find(first.begin(), first.end(), 0xFF) == first.end());
  CHECK(std::find(first.begin(), first.end(), static_cast<int32_t>(bytes.size() - 2)) == first.end());

  // No other front end ever takes a byte from 0xF8 up, so none can reach a tool-call token.
  for (const constraint_spec& spec : std::vector<constraint_spec>{
           {constraint_kind::regex, "."}, {constraint_kind::regex, "[^a]*"}, {constraint_kind::regex, "[\\s\\S]\\W"},
           {constraint_kind::ebnf, "root ::= . [^x] \"\\xff\" [\\x00-\\U0010FFFF]"},
           {constraint_kind::json_object, ""}, {constraint_kind::json_schema, R"({"type":"string"})"}}) {
    grammar g;
    REQUIRE_MESSAGE(!compile(spec, g), spec.source);
    for (const auto& c : g.classes)
      for (unsigned b = 0xF8; b <= 0xFF; ++b) CHECK_MESSAGE(!grammar::has(c, static_cast<uint8_t>(b)), spec.source << " byte " << b);
  }
}
