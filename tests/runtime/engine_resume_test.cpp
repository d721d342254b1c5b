// A request re-routed from a failed engine arrives with the output its client already has
// (engine::add_request's `resumed`): the new engine prefills it after the prompt and must go on
// exactly as the first engine would have, emitting only what follows. Checked against
// uninterrupted runs: greedy and seeded sampling with penalties, stop strings that span the
// resume point, structured output, and refusals of resumed output that cannot be.
#include <doctest/doctest.h>

#include "model/tokenizer.hpp"
#include "runtime/engine/engine.hpp"
#include "tests/support/tiny_models.hpp"

using namespace shoal;
using namespace shoal::runtime;

namespace {

std::string listed(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t t : v) s += std::to_string(t) + " ";
  return s;
}

struct run_result {
  completion done;
  std::vector<int32_t> emitted;  // the tokens of the events, in order
};

run_result run(engine& e, const std::vector<int32_t>& prompt, const sampling_params& p,
               std::span<const int32_t> resumed = {}) {
  auto id = e.add_request(request_id(1), prompt, p, traffic_class::chat, {}, resumed);
  REQUIRE_MESSAGE(id, (id ? "" : id.error().message));
  run_result out;
  while (e.has_work())
    for (const auto& ev : e.step())
      if (ev.id == *id && ev.token >= 0) out.emitted.push_back(ev.token);
  out.done = e.result(*id);
  return out;
}

// The uninterrupted run, then one resumed after each of `cuts` tokens: same completion, and
// the resumed engine emits only the tokens after the cut.
void check_resumes(const std::shared_ptr<const model::model_weights>& w, const std::shared_ptr<const model::tokenizer>& tok,
                   const std::vector<int32_t>& prompt, const sampling_params& p, std::vector<size_t> cuts) {
  engine whole(w, test::exact_engine_config(64), tok);
  const run_result ref = run(whole, prompt, p);
  REQUIRE(ref.done.output.size() >= 4);
  for (size_t k : cuts) {
    if (k >= ref.done.output.size()) k = ref.done.output.size() - 1;
    CAPTURE(k);
    engine resumed(w, test::exact_engine_config(64), tok);
    const run_result got = run(resumed, prompt, p, std::span(ref.done.output).first(k));
    const std::string want = listed(ref.done.output), have = listed(got.done.output);
    CAPTURE(want);
    CAPTURE(have);
    CHECK(got.done.output == ref.done.output);
    CHECK(got.done.text == ref.done.text);
    CHECK(got.done.reason == ref.done.reason);
    CHECK(got.emitted == std::vector<int32_t>(ref.done.output.begin() + static_cast<std::ptrdiff_t>(k), ref.done.output.end()));
  }
}

}  // namespace

TEST_CASE("resumed request: continues exactly as the uninterrupted run, greedy and seeded with penalties, both architectures") {
  for (std::string preset : {"tiny", "v3-tiny"}) {
    CAPTURE(preset);
    auto w = test::tiny_model(preset);
    const auto prompt = test::random_tokens(23, 4);
    sampling_params greedy;
    greedy.max_tokens = 20;
    greedy.ignore_eos = true;
    check_resumes(w, nullptr, prompt, greedy, {1, 7, 19});
    sampling_params sampled = greedy;
    sampled.temperature = 1.0f;
    sampled.top_p = 0.9f;
    sampled.seed = 77;
    sampled.frequency_penalty = 0.7f;  // counts the resumed tokens as output
    sampled.presence_penalty = 0.3f;
    check_resumes(w, nullptr, prompt, sampled, {1, 5, 12});
  }
}

TEST_CASE("resumed request: a stop string that begins in the resumed output and ends after it stops where it would have") {
  auto w = test::tiny_model("tiny");
  auto tok = test::byte_tokenizer();
  const auto prompt = test::random_tokens(20, 5);
  sampling_params p;
  p.max_tokens = 32;
  p.ignore_eos = true;
  engine plain(w, test::exact_engine_config(64), tok);
  const run_result free_run = run(plain, prompt, p);
  const std::string& text = free_run.done.text;
  std::vector<size_t> end_of(1, 0);  // end_of[k]: bytes of the first k tokens' text
  for (int32_t t : free_run.done.output) end_of.push_back(end_of.back() + tok->decode_token(t).size());
  REQUIRE(end_of.back() == text.size());
  // A 3-byte stop string whose first match starts on the last byte of the first k tokens: it
  // spans the cut after k tokens.
  size_t k = 0;
  for (size_t c = 2; c + 1 < end_of.size() && k == 0; ++c)
    if (end_of[c] >= 1 && end_of[c] + 2 <= text.size() && text.find(text.substr(end_of[c] - 1, 3)) == end_of[c] - 1) k = c;
  REQUIRE(k > 0);
  p.stop_strings = {text.substr(end_of[k] - 1, 3)};
  check_resumes(w, tok, prompt, p, {k});
  engine stopping(w, test::exact_engine_config(64), tok);
  const run_result stopped = run(stopping, prompt, p, std::span(free_run.done.output).first(k));
  CHECK(stopped.done.reason == finish_reason::stop);
  CHECK(stopped.done.text == text.substr(0, end_of[k] - 1));
}

TEST_CASE("resumed request: structured output goes on inside its grammar") {
  auto w = test::tiny_model("tiny");
  auto tok = test::byte_tokenizer();
  sampling_params p;
  p.max_tokens = 40;
  p.temperature = 1.0f;
  p.seed = 3;
  p.ignore_eos = true;
  p.constraint = {constraint_kind::regex, "[a-c]{6}-(0|[1-9][0-9]{0,3})"};
  check_resumes(w, tok, test::random_tokens(9, 41), p, {2, 7});
}

TEST_CASE("resumed request: output that cannot be resumed is refused, naming why, and nothing is queued") {
  auto w = test::tiny_model("tiny");
  engine e(w, test::exact_engine_config(64));
  sampling_params p;
  p.max_tokens = 4;
  auto refused = [&](std::vector<int32_t> resumed, const char* says) {
    auto r = e.add_request(request_id(5), test::random_tokens(8, 1), p, traffic_class::chat, {}, resumed);
    REQUIRE_FALSE(r);
    CAPTURE(r.error().message);
    CHECK(r.error().message.find(says) != std::string::npos);
  };
  refused({1, 2, 3, 4}, "max_tokens is 4");
  refused({1, 999}, "resumed output token 1 (id 999) is outside the vocabulary");
  refused({static_cast<int32_t>(w->config.eos_token_id)}, "is a stop token");
  CHECK_FALSE(e.has_work());
}
