// Structured output in the engine: a random-weight model's output, greedy and sampled, matches
// the request's JSON schema, regex or grammar and ends as stop; bad constraints are refused at
// add_request, naming the problem.
#include <doctest/doctest.h>

#include <regex>

#include <nlohmann/json.hpp>

#include "model/tokenizer.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/structured/grammar.hpp"
#include "tests/support/tiny_models.hpp"

using namespace shoal;
using namespace shoal::runtime;

namespace {

using test::byte_tokenizer;

completion run(engine& e, const std::vector<int32_t>& prompt, const sampling_params& p) {
  auto id = e.add_request(prompt, p);
  REQUIRE_MESSAGE(id, (id ? "" : id.error().message));
  auto done = e.run_to_completion();
  REQUIRE(done.size() == 1);
  return done[0];
}

}  // namespace

TEST_CASE("structured output: JSON schema, regex and EBNF outputs of a random model match, greedy and sampled") {
  for (const char* preset : {"tiny", "v3-tiny"}) {
    auto w = test::tiny_model(preset);
    auto tok = byte_tokenizer();
    engine e(w, test::exact_engine_config(64), tok);
    const std::string schema = R"({"type":"object","properties":{
        "name":{"type":"string","maxLength":6},"n":{"type":"integer"},"ok":{"type":"boolean"},
        "tags":{"type":"array","items":{"enum":["x","y"]},"maxItems":3}},
      "required":["name","n","ok"],"additionalProperties":false})";
    for (uint64_t seed = 0; seed < 6; ++seed) {
      sampling_params p;
      p.max_tokens = 200;
      p.temperature = seed == 0 ? 0.0f : 1.0f;
      p.seed = seed;
      p.constraint = {constraint_kind::json_schema, schema};
      auto got = run(e, test::random_tokens(12, static_cast<uint32_t>(seed)), p);
      CAPTURE(got.text);
      CHECK(got.reason == finish_reason::stop);
      auto j = nlohmann::json::parse(got.text, nullptr, false);
      REQUIRE_FALSE(j.is_discarded());
      REQUIRE(j.is_object());
      CHECK(j["name"].is_string());
      CHECK(j["n"].is_number_integer());
      CHECK(j["ok"].is_boolean());
      for (const auto& [k, v] : j.items()) CHECK((k == "name" || k == "n" || k == "ok" || k == "tags"));
      if (j.contains("tags")) CHECK(j["tags"].size() <= 3);
    }
    for (uint64_t seed = 0; seed < 4; ++seed) {
      sampling_params p;
      p.max_tokens = 40;
      p.temperature = seed == 0 ? 0.0f : 1.0f;
      p.seed = seed;
      p.ignore_eos = true;  // the grammar still ends it: nothing may follow a whole match
      p.constraint = {constraint_kind::regex, "[a-c]{3}-(0|[1-9][0-9]?)"};
      auto got = run(e, test::random_tokens(9, 40 + static_cast<uint32_t>(seed)), p);
      CAPTURE(got.text);
      CHECK(std::regex_match(got.text, std::regex("[a-c]{3}-(0|[1-9][0-9]?)")));
      CHECK(got.reason == finish_reason::stop);
    }
    sampling_params p;
    p.max_tokens = 60;
    p.constraint = {constraint_kind::ebnf, "root ::= \"say \" word (\", \" word){0,2} \".\"\nword ::= [a-z]{1,5}"};
    auto got = run(e, test::random_tokens(9, 3), p);
    CAPTURE(got.text);
    CHECK(std::regex_match(got.text, std::regex("say [a-z]{1,5}(, [a-z]{1,5}){0,2}\\.")));
  }
}

TEST_CASE("structured output: bad constraints and engines without a tokenizer are refused at add_request") {
  auto w = test::tiny_model("tiny");
  engine e(w, test::exact_engine_config(64), byte_tokenizer());
  sampling_params p;
  p.constraint = {constraint_kind::json_schema, R"({"type":"integer","minimum":0})"};
  auto r = e.add_request({1, 2, 3}, p);
  REQUIRE_FALSE(r);
  CHECK(r.error().message == "json_schema: unsupported keyword \"minimum\" at /");
  p.constraint = {constraint_kind::regex, "a("};
  r = e.add_request({1, 2, 3}, p);
  REQUIRE_FALSE(r);
  CHECK(r.error().message == "regex: unterminated group at offset 1");
  CHECK_FALSE(e.has_work());
  engine blind(w, test::exact_engine_config(64));
  p.constraint = {constraint_kind::json_object, ""};
  r = blind.add_request({1, 2, 3}, p);
  REQUIRE_FALSE(r);
  CHECK(r.error().message == "structured output needs a tokenizer, and this engine has none");
}
