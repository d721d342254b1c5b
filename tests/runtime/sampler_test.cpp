// Sampler and stop checker: greedy ties, determinism per (seed, step), the empirical
// distribution against softmax, top-k / top-p support, validation messages naming the field,
// and every stop condition with its precedence.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "runtime/core/sampler.hpp"

using namespace shoal::runtime;

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();

std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  double m = -1e300, sum = 0;
  for (float l : logits) m = std::max(m, double(l));
  std::vector<double> p;
  for (float l : logits) p.push_back(std::exp((l - m) / temperature));
  for (double x : p) sum += x;
  for (double& x : p) x /= sum;
  return p;
}

// Token frequencies over `steps` draws of one sequence.
std::vector<double> frequencies(const std::vector<float>& logits, const sampling_params& p,
                                uint64_t seed, int64_t steps) {
  std::vector<double> f(logits.size(), 0.0);
  for (int64_t s = 0; s < steps; ++s) f[size_t(sample_token(logits, p, seed, s))] += 1.0;
  for (double& x : f) x /= double(steps);
  return f;
}

std::vector<float> random_logits(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

sampling_params with_temperature(float t) {
  sampling_params p;
  p.temperature = t;
  return p;
}

}  // namespace

TEST_CASE("greedy is argmax, ties to the lower id, NaN ranks lowest") {
  sampling_params p;  // temperature 0
  std::vector<float> a{1.0f, 3.0f, 3.0f, 2.0f};
  CHECK(sample_token(a, p, 7, 0) == 1);
  std::vector<float> flat(10, 0.25f);
  CHECK(sample_token(flat, p, 7, 0) == 0);
  std::vector<float> with_nan{std::nanf(""), -5.0f, -1.0f, -inf};
  CHECK(sample_token(with_nan, p, 7, 0) == 2);
  std::vector<float> last{-1.0f, -1.0f, 0.0f};
  CHECK(sample_token(last, p, 1, 99) == 2);
  // Greedy ignores the seed and the step.
  for (int64_t s = 0; s < 50; ++s) CHECK(sample_token(a, p, uint64_t(s) * 31, s) == 1);
}

TEST_CASE("uniform_at is a pure function into the unit interval and differs across steps and seeds") {
  std::set<double> seen;
  for (int64_t s = 0; s < 1000; ++s) {
    double u = uniform_at(12345, s);
    CHECK(u >= 0.0);
    CHECK(u < 1.0);
    CHECK(u == uniform_at(12345, s));
    seen.insert(u);
  }
  CHECK(seen.size() == 1000);
  CHECK(uniform_at(1, 0) != uniform_at(2, 0));
  double mean = 0;
  for (int64_t s = 0; s < 100000; ++s) mean += uniform_at(99, s);
  CHECK(mean / 100000 == doctest::Approx(0.5).epsilon(0.01));
}

TEST_CASE("same (seed, step) gives the same token whatever the batch, steps give a distribution") {
  auto p = with_temperature(1.0f);
  std::vector<float> logits(5, 0.0f);  // uniform
  // The same row embedded in a larger "batch" buffer at another offset.
  std::vector<float> batch(3 * 5);
  for (size_t i = 0; i < batch.size(); ++i) batch[i] = i / 5 == 1 ? 0.0f : float(i);
  std::span<const float> row(batch.data() + 5, 5);
  std::set<int32_t> drawn;
  for (int64_t s = 0; s < 200; ++s) {
    int32_t t = sample_token(logits, p, 42, s);
    CHECK(t == sample_token(logits, p, 42, s));
    CHECK(t == sample_token(row, p, 42, s));
    drawn.insert(t);
  }
  CHECK(drawn.size() == 5);
  // Different seeds give different streams.
  int same = 0;
  for (int64_t s = 0; s < 200; ++s) same += sample_token(logits, p, 42, s) == sample_token(logits, p, 43, s);
  CHECK(same < 80);  // ≈ 40 expected for independent uniform draws over 5 tokens
}

TEST_CASE("empirical distribution over 20000 steps matches softmax (temperature 1 and 0.7)") {
  std::vector<float> logits{0.5f, -1.0f, 2.0f, 0.0f, 1.0f};
  for (float t : {1.0f, 0.7f}) {
    CAPTURE(t);
    auto f = frequencies(logits, with_temperature(t), 2024, 20000);
    auto q = softmax(logits, t);
    for (size_t i = 0; i < q.size(); ++i) {
      CAPTURE(i);
      // σ ≤ sqrt(0.25 / 20000) ≈ 0.0035; 0.012 is ≈ 3.4σ, and a relative 10% for small p.
      CHECK(std::fabs(f[i] - q[i]) < 0.012);
      CHECK(std::fabs(f[i] - q[i]) < 0.1 * q[i] + 0.003);
    }
  }
}

TEST_CASE("top_k = 1 and a tiny top_p are greedy") {
  for (uint32_t seed = 0; seed < 20; ++seed) {
    auto logits = random_logits(1000, seed, 3.0f);
    logits[seed * 7] = logits[seed * 7 + 1] = 30.0f;  // a tie at the top: lower id wins
    int32_t greedy = sample_token(logits, sampling_params{}, seed, 0);
    CHECK(greedy == int32_t(seed * 7));
    auto k1 = with_temperature(1.5f);
    k1.top_k = 1;
    auto p_tiny = with_temperature(1.5f);
    p_tiny.top_p = 1e-6f;
    for (int64_t s = 0; s < 20; ++s) {
      CHECK(sample_token(logits, k1, seed, s) == greedy);
      CHECK(sample_token(logits, p_tiny, seed, s) == greedy);
    }
  }
}

TEST_CASE("top_k restricts the support to the k largest and keeps their relative weights") {
  auto logits = random_logits(1000, 5, 2.0f);
  std::vector<int32_t> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  std::set<int32_t> top5(order.begin(), order.begin() + 5);
  auto p = with_temperature(3.0f);  // flatten so that all five are drawn
  p.top_k = 5;
  std::set<int32_t> drawn;
  for (int64_t s = 0; s < 2000; ++s) {
    int32_t t = sample_token(logits, p, 11, s);
    CHECK(top5.count(t) == 1);
    drawn.insert(t);
  }
  CHECK(drawn == top5);
  // top_k ≥ vocab is off: same tokens as no top_k.
  auto off = with_temperature(1.0f), big = off;
  big.top_k = 5000;
  for (int64_t s = 0; s < 100; ++s) CHECK(sample_token(logits, big, 3, s) == sample_token(logits, off, 3, s));
}

TEST_CASE("top_p keeps the smallest (prob desc, id asc) prefix reaching the mass, renormalised") {
  std::vector<float> logits{std::log(0.15f), std::log(0.5f), std::log(0.05f), std::log(0.3f)};
  auto p = with_temperature(1.0f);
  p.top_p = 0.7f;  // 0.5 + 0.3 = 0.8 ≥ 0.7: support {1, 3} with weights 0.625 / 0.375
  auto f = frequencies(logits, p, 77, 20000);
  CHECK(f[0] == 0.0);
  CHECK(f[2] == 0.0);
  CHECK(f[1] == doctest::Approx(0.625).epsilon(0.03));
  CHECK(f[3] == doctest::Approx(0.375).epsilon(0.04));
  // Equal probabilities: the prefix is ordered by id, and mass exactly at top_p stops it.
  std::vector<float> two{0.0f, 0.0f};
  p.top_p = 0.5f;
  for (int64_t s = 0; s < 100; ++s) CHECK(sample_token(two, p, 5, s) == 0);
  std::vector<float> four{1.0f, 2.0f, 2.0f, 1.0f};
  auto q = with_temperature(1.0f);
  q.top_p = 0.6f;  // probs ≈ (0.134, 0.366, 0.366, 0.134): ids 1 and 2 reach 0.73
  std::set<int32_t> drawn;
  for (int64_t s = 0; s < 500; ++s) drawn.insert(sample_token(four, q, 8, s));
  CHECK(drawn == std::set<int32_t>{1, 2});
}

TEST_CASE("top_k and top_p together at vocab 129280, masked logits never drawn") {
  const size_t vocab = 129280;
  auto logits = random_logits(vocab, 9, 4.0f);
  for (size_t i = 0; i < vocab; i += 3) logits[i] = -inf;  // masked
  std::vector<int32_t> order(vocab);
  for (size_t i = 0; i < vocab; ++i) order[i] = int32_t(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  std::set<int32_t> top50(order.begin(), order.begin() + 50);
  auto p = with_temperature(2.0f);
  p.top_k = 50;
  p.top_p = 0.9f;
  auto nucleus = with_temperature(0.8f);
  nucleus.top_p = 0.95f;
  for (int64_t s = 0; s < 60; ++s) {
    int32_t t = sample_token(logits, p, 1, s);
    CHECK(top50.count(t) == 1);
    CHECK(t % 3 != 0);
    int32_t u = sample_token(logits, nucleus, 1, s);
    CHECK(u % 3 != 0);
    CHECK(u == sample_token(logits, nucleus, 1, s));
  }
  // A single finite logit is always drawn, whatever the params.
  std::vector<float> one(100, -inf);
  one[42] = -3.0f;
  CHECK(sample_token(one, p, 1, 0) == 42);
  CHECK(sample_token(one, nucleus, 1, 1) == 42);
}

// The pipeline written literally, with a full sort everywhere and the same arithmetic (float
// weights, double sums in the same orders), to check the selection shortcuts against.
int32_t reference_sample(const std::vector<float>& logits, const sampling_params& p, uint64_t seed,
                         int64_t step) {
  std::vector<std::pair<float, int32_t>> c;  // (value, id)
  for (size_t i = 0; i < logits.size(); ++i) c.push_back({logits[i], int32_t(i)});
  auto by_rank = [](auto& a, auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  if (p.top_k > 0 && size_t(p.top_k) < c.size()) {
    std::sort(c.begin(), c.end(), by_rank);
    c.resize(size_t(p.top_k));
  }
  float m = -inf;
  for (auto& x : c) m = std::max(m, x.first);
  for (auto& x : c) x.first = std::exp((x.first - m) / p.temperature);
  std::erase_if(c, [](auto& x) { return x.first == 0.0f; });
  double total = 0;
  for (auto& x : c) total += x.first;
  if (p.top_p < 1.0f) {
    std::sort(c.begin(), c.end(), by_rank);
    double mass = 0;
    size_t keep = 0;
    while (keep < c.size() && mass < double(p.top_p) * total) mass += c[keep++].first;
    c.resize(keep);
  }
  total = 0;
  for (auto& x : c) total += x.first;
  double target = uniform_at(seed, step) * total, mass = 0;
  for (auto& x : c)
    if ((mass += x.first) > target) return x.second;
  return c.back().second;
}

TEST_CASE("sample_token equals the literal full-sort pipeline (nucleus larger than the first head)") {
  for (uint32_t seed = 0; seed < 6; ++seed) {
    auto logits = random_logits(5000, 100 + seed, seed % 2 ? 0.5f : 3.0f);
    logits[seed] = logits[seed + 10];  // a tie somewhere
    for (auto [t, k, top_p] : {std::tuple{1.0f, 0, 0.9f}, {0.5f, 0, 0.99f}, {1.3f, 700, 0.8f},
                               {1.0f, 40, 1.0f}, {2.0f, 0, 1.0f}, {0.8f, 3000, 0.3f}}) {
      sampling_params p;
      p.temperature = t;
      p.top_k = k;
      p.top_p = top_p;
      CAPTURE(seed);
      CAPTURE(k);
      CAPTURE(top_p);
      for (int64_t s = 0; s < 8; ++s)
        CHECK(sample_token(logits, p, seed, s) == reference_sample(logits, p, seed, s));
    }
  }
}

TEST_CASE("logit_bias and the presence / frequency penalties adjust the logits before sampling") {
  std::vector<float> logits = {0.0f, 3.0f, 1.0f, 2.9f, -1.0f};
  sampling_params p;  // greedy
  CHECK(sample_token(logits, p, 1, 0) == 1);
  p.logit_bias = {{4, 100.0f}};  // +100 makes a token win greedily
  CHECK(sample_token(logits, p, 1, 0) == 4);
  p.logit_bias = {{1, -100.0f}};  // −100 removes one in practice
  CHECK(sample_token(logits, p, 1, 0) == 3);
  p.logit_bias.clear();
  // Token 1 generated twice: frequency 0.1 × 2 = 0.2 pushes it below token 3 (2.9 > 2.8).
  const std::vector<int32_t> generated = {1, 2, 1};
  p.frequency_penalty = 0.1f;
  CHECK(sample_token(logits, p, 1, 0, generated) == 3);
  CHECK(sample_token(logits, p, 1, 0) == 1);  // nothing generated yet: no penalty
  p.frequency_penalty = 0;
  p.presence_penalty = 0.05f;  // once per token present: 3 − 0.05 > 2.9, still token 1
  CHECK(sample_token(logits, p, 1, 0, generated) == 1);
  p.presence_penalty = 0.2f;
  CHECK(sample_token(logits, p, 1, 0, generated) == 3);
  p.presence_penalty = -1.0f;  // negative: encourages repeats (token 2 at 1 + 1 stays below 3 + 1)
  CHECK(sample_token(logits, p, 1, 0, generated) == 1);
  // At temperature > 0 the adjusted logits are what is sampled: +100 on one token is all the mass.
  sampling_params t;
  t.temperature = 1.0f;
  t.logit_bias = {{0, 100.0f}};
  for (int64_t step = 0; step < 50; ++step) CHECK(sample_token(logits, t, 7, step) == 0);
}

TEST_CASE("validate names the bad field") {
  const int64_t vocab = 50;
  CHECK_FALSE(validate(sampling_params{}, vocab).has_value());
  auto message_for = [&](auto edit) {
    sampling_params p;
    edit(p);
    auto m = validate(p, vocab);
    REQUIRE(m.has_value());
    return *m;
  };
  CHECK(message_for([](auto& p) { p.temperature = -0.5f; }).starts_with("temperature"));
  CHECK(message_for([](auto& p) { p.temperature = inf; }).starts_with("temperature"));
  CHECK(message_for([](auto& p) { p.temperature = std::nanf(""); }).starts_with("temperature"));
  CHECK(message_for([](auto& p) { p.top_p = 0.0f; }) == "top_p must be in (0, 1], got 0");
  CHECK(message_for([](auto& p) { p.top_p = 1.5f; }).starts_with("top_p"));
  CHECK(message_for([](auto& p) { p.top_p = std::nanf(""); }).starts_with("top_p"));
  CHECK(message_for([](auto& p) { p.top_k = -1; }).starts_with("top_k"));
  CHECK(message_for([](auto& p) { p.max_tokens = 0; }) == "max_tokens must be >= 1, got 0");
  CHECK(message_for([](auto& p) { p.stop_token_ids = {3, 50}; }) ==
        "stop_token_ids[1] = 50 is outside the vocabulary [0, 50)");
  CHECK(message_for([](auto& p) { p.stop_token_ids = {-1}; }).starts_with("stop_token_ids[0]"));
  CHECK(message_for([](auto& p) { p.stop_strings = {"a", ""}; }) == "stop_strings[1] is empty");
  CHECK(message_for([](auto& p) { p.logit_bias = {{50, 1.0f}}; }).starts_with("logit_bias token 50"));
  CHECK(message_for([](auto& p) { p.logit_bias = {{3, 100.5f}}; }).starts_with("logit_bias of token 3"));
  CHECK(message_for([](auto& p) { p.logit_bias = {{3, 1.0f}, {3, 2.0f}}; }) == "logit_bias names token 3 twice");
  CHECK(message_for([](auto& p) { p.presence_penalty = 3; }).starts_with("presence_penalty"));
  CHECK(message_for([](auto& p) { p.frequency_penalty = std::nanf(""); }).starts_with("frequency_penalty"));
  sampling_params ok;
  ok.temperature = 0.7f;
  ok.top_k = 40;
  ok.top_p = 1.0f;
  ok.stop_token_ids = {0, 49};
  ok.stop_strings = {"\n\n"};
  CHECK_FALSE(validate(ok, vocab).has_value());
  CHECK(validate(ok, 0).value().starts_with("vocab"));
  ok.seed = 5;
  CHECK(sequence_seed(ok, 99) == 5);
  CHECK(sequence_seed(sampling_params{}, 99) == 99);
}

TEST_CASE("stop checker: eos, ignore_eos, stop ids, stop strings across tokens, length") {
  const int32_t eos = 2;
  sampling_params p;
  p.max_tokens = 4;
  stop_checker c(p, eos);
  CHECK(c.check(std::vector<int32_t>{}, "").reason == finish_reason::none);
  CHECK(c.check({5}, "a").reason == finish_reason::none);
  CHECK(c.check({5, 2}, "a").reason == finish_reason::stop);
  CHECK_FALSE(c.check({5, 2}, "a").truncate_at.has_value());
  CHECK(c.check({2, 5}, "a").reason == finish_reason::none);  // only the last token counts
  CHECK(c.check({5, 6, 7, 8}, "abcd").reason == finish_reason::length);
  CHECK(c.check({5, 6, 7, 2}, "abc").reason == finish_reason::stop);  // stop beats length

  p.ignore_eos = true;
  p.stop_token_ids = {9};
  stop_checker ignoring(p, eos);
  CHECK(ignoring.check({5, 2}, "a").reason == finish_reason::none);
  CHECK(ignoring.check({5, 2, 2, 2}, "a").reason == finish_reason::length);
  CHECK(ignoring.check({5, 9}, "a").reason == finish_reason::stop);

  sampling_params s;
  s.max_tokens = 100;
  s.stop_strings = {"world", "lo w"};
  stop_checker strings(s, eos);
  // Tokens "Hel" "lo wor" "ld!": "lo w" completes first, at byte 3.
  CHECK(strings.check({1, 3}, "Hello wor").reason == finish_reason::stop);
  CHECK(strings.check({1, 3}, "Hello wor").truncate_at == size_t(3));
  s.stop_strings = {"world"};
  stop_checker world(s, eos);
  CHECK(world.check({1, 3}, "Hello wor").reason == finish_reason::none);
  auto r = world.check({1, 3, 4}, "Hello world!");
  CHECK(r.reason == finish_reason::stop);
  CHECK(r.truncate_at == size_t(6));
  // The earliest match wins regardless of list order.
  s.stop_strings = {"!", "ell"};
  CHECK(stop_checker(s, eos).check({1}, "Hello!").truncate_at == size_t(1));
}

TEST_CASE("finish_reason to_string") {
  CHECK(std::string(to_string(finish_reason::none)) == "none");
  CHECK(std::string(to_string(finish_reason::stop)) == "stop");
  CHECK(std::string(to_string(finish_reason::length)) == "length");
  CHECK(std::string(to_string(finish_reason::aborted)) == "aborted");
  CHECK(std::string(to_string(finish_reason::error)) == "error");
}

TEST_CASE("logprobs_of: the log-softmax at the token and the likeliest tokens, most likely first, ties to the lower id") {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, -2.0f, std::numeric_limits<float>::quiet_NaN()};
  const auto lp = logprobs_of(logits, 3, 3);
  double z = 0;
  for (float x : {1.0f, 3.0f, 3.0f, -2.0f}) z += std::exp(static_cast<double>(x));
  CHECK(lp.logprob == doctest::Approx(-2.0 - std::log(z)));
  REQUIRE(lp.top.size() == 3);
  CHECK(lp.top[0].first == 1);
  CHECK(lp.top[1].first == 2);
  CHECK(lp.top[2].first == 0);
  CHECK(lp.top[0].second == doctest::Approx(3.0 - std::log(z)));
  CHECK(lp.top[2].second == doctest::Approx(1.0 - std::log(z)));
  double mass = 0;
  for (int32_t t = 0; t < 5; ++t) mass += std::exp(static_cast<double>(logprobs_of(logits, t, 0).logprob));
  CHECK(mass == doctest::Approx(1.0));
  CHECK(logprobs_of(logits, 4, 0).logprob == -std::numeric_limits<float>::infinity());  // NaN counts as −inf
  CHECK(logprobs_of(logits, 0, 0).top.empty());
  CHECK(logprobs_of(logits, 0, 9).top.size() == 5);
  sampling_params p;
  p.logprobs = 21;
  CHECK(validate(p, 5).value_or("").find("logprobs") != std::string::npos);
  p.logprobs = -1;
  CHECK_FALSE(validate(p, 5));
}
