// DSpark speculative decoding: greedy speculation is bit-exact against plain decoding on both
// architectures (MTP drafts, which the random weights make mostly wrong, and self drafts,
// mostly right), sampled speculation is lossless (chi-square against the target model's
// exact distribution), seeded speculation is batch-invariant, and the adaptive policy keeps
// the accepted length of fixed-5 while verifying fewer drafts under MISSION.md's statistics.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "runtime/engine/engine.hpp"
#include "runtime/core/speculative.hpp"

#include <nlohmann/json.hpp>
#include "tests/support/tiny_models.hpp"

using namespace shoal;
using runtime::engine;
using runtime::engine_config;
using runtime::sampling_params;
using runtime::spec_mode;

namespace {

struct run_result {
  std::map<int64_t, std::vector<int32_t>> tokens;
  std::map<int64_t, std::vector<std::vector<float>>> logits;
  std::map<int64_t, std::string> text;
  runtime::engine_stats stats;
};

run_result run_all(const std::shared_ptr<model::model_weights>& w, const engine_config& cfg,
                   const std::vector<std::vector<int32_t>>& prompts, const std::vector<sampling_params>& params,
                   std::shared_ptr<const model::tokenizer> tok = nullptr) {
  engine e(w, cfg, std::move(tok));
  std::vector<int64_t> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto id = e.add_request(prompts[i], params[i]);
    REQUIRE(id.has_value());
    ids.push_back(id->value);
  }
  run_result out;
  while (e.has_work())
    for (auto& ev : e.step()) {
      if (ev.token < 0) continue;
      const size_t i = static_cast<size_t>(std::find(ids.begin(), ids.end(), ev.id.value) - ids.begin());
      out.tokens[static_cast<int64_t>(i)].push_back(ev.token);
      out.logits[static_cast<int64_t>(i)].push_back(std::move(ev.logits));
    }
  for (size_t i = 0; i < ids.size(); ++i) out.text[static_cast<int64_t>(i)] = e.result(shoal::request_id(ids[i])).text;
  out.stats = e.stats();
  return out;
}

engine_config spec_config(spec_mode mode, int64_t nextn, bool self = false, double noise = 0) {
  engine_config c = test::exact_engine_config(512);
  c.spec.mode = mode;
  c.spec.nextn = nextn;
  c.spec.self_draft = self;
  c.spec.self_draft_noise = noise;
  return c;
}

// Upper 0.1% point of chi-square with df degrees of freedom (Wilson–Hilferty).
double chi2_critical(int64_t df) {
  const double z = 3.090, k = static_cast<double>(df);
  const double t = 1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k));
  return k * t * t * t;
}

// Pearson's statistic of `counts` against `expected` probabilities (bins below 5 expected
// merged into one) and its degrees of freedom.
std::pair<double, int64_t> chi2(const std::map<int32_t, int64_t>& counts, const std::map<int32_t, double>& expected,
                                int64_t n) {
  double stat = 0, rest_e = 0, rest_o = 0;
  int64_t bins = 0;
  for (const auto& [tok, p] : expected) {
    const double e = p * double(n);
    const double o = counts.contains(tok) ? double(counts.at(tok)) : 0.0;
    if (e < 5) {
      rest_e += e;
      rest_o += o;
      continue;
    }
    stat += (o - e) * (o - e) / e;
    ++bins;
  }
  for (const auto& [tok, c] : counts)
    if (!expected.contains(tok)) rest_o += double(c);  // outside the support: must not happen
  if (rest_e > 0 || rest_o > 0) {
    stat += (rest_o - rest_e) * (rest_o - rest_e) / std::max(rest_e, 1e-9);
    ++bins;
  }
  return {stat, bins - 1};
}

}  // namespace

TEST_CASE("speculative greedy decoding equals plain greedy decoding bit for bit (both architectures)") {
  for (const char* preset : {"tiny", "v3-tiny"}) {
    CAPTURE(preset);
    auto w = test::tiny_model(preset);
    std::vector<std::vector<int32_t>> prompts;
    std::vector<sampling_params> params;
    for (uint32_t i = 0; i < 5; ++i) {
      prompts.push_back(test::random_tokens(7 + 13 * i, 40 + i));
      sampling_params p;
      p.max_tokens = 22 + static_cast<int32_t>(i);
      p.ignore_eos = true;
      if (i == 3) p.frequency_penalty = 0.7f;  // penalties see the accepted drafts
      params.push_back(p);
    }
    const run_result plain = run_all(w, test::exact_engine_config(512), prompts, params);
    struct source {
      const char* name;
      bool self;
      double noise;
    };
    for (source s : {source{"mtp", false, 0.0}, source{"self", true, 0.0}, source{"self, noise 0.4", true, 0.4}}) {
      CAPTURE(s.name);
      const run_result spec = run_all(w, spec_config(spec_mode::fixed, 5, s.self, s.noise), prompts, params);
      for (size_t i = 0; i < prompts.size(); ++i) {
        CAPTURE(i);
        REQUIRE(spec.tokens.at(int64_t(i)) == plain.tokens.at(int64_t(i)));
        CHECK(spec.logits.at(int64_t(i)) == plain.logits.at(int64_t(i)));  // the same bits at every position
      }
      MESSAGE(std::string(preset) << " " << s.name << ": steps " << spec.stats.steps << " (plain " << plain.stats.steps
                     << "), verified/step " << spec.stats.spec.verified_per_step() << ", accepted/step "
                     << spec.stats.spec.accepted_per_step());
      CHECK(spec.stats.spec.verified > 0);
      CHECK(spec.stats.steps < plain.stats.steps + (s.self ? 0 : 1));
      if (s.self && s.noise == 0) CHECK(spec.stats.spec.accepted_per_step() > 3.0);
      if (s.self && s.noise > 0) {  // about 0.6 acceptance per draft
        CHECK(spec.stats.spec.accepted_per_step() > 0.5);
        CHECK(spec.stats.spec.accepted_per_step() < 3.0);
      }
    }
  }
}

TEST_CASE("lossless speculative sampling: chi-square of the 2nd and 3rd tokens against the exact distribution") {
  auto w = test::tiny_model("tiny");
  const std::vector<int32_t> prompt = test::random_tokens(12, 77);
  sampling_params base;
  base.temperature = 1.0f;
  base.top_k = 4;
  base.max_tokens = 3;
  base.ignore_eos = true;
  // The exact marginals of output tokens 1 and 2: sums over the paths of the tokens before.
  auto dist = [&](const std::vector<int32_t>& seq, const std::vector<int32_t>& generated) {
    auto logits = model::forward_full(*w, seq, {true, false}).logits;
    return runtime::distribution_of(logits, base, generated);
  };
  std::map<int32_t, double> p1, p2;
  const auto d0 = dist(prompt, {});
  for (size_t a = 0; a < d0.ids.size(); ++a) {
    auto s1 = prompt;
    s1.push_back(d0.ids[a]);
    const auto d1 = dist(s1, {d0.ids[a]});
    for (size_t b = 0; b < d1.ids.size(); ++b) {
      const double pab = d0.weights[a] / d0.total * d1.weights[b] / d1.total;
      p1[d1.ids[b]] += pab;
      auto s2 = s1;
      s2.push_back(d1.ids[b]);
      const auto d2 = dist(s2, {d0.ids[a], d1.ids[b]});
      for (size_t c = 0; c < d2.ids.size(); ++c) p2[d2.ids[c]] += pab * d2.weights[c] / d2.total;
    }
  }
  const int64_t n = 1600;
  std::vector<std::vector<int32_t>> prompts(n, prompt);
  std::vector<sampling_params> params(n, base);
  for (int64_t i = 0; i < n; ++i) params[static_cast<size_t>(i)].seed = 5000 + static_cast<uint64_t>(i);
  const double noise = 0.5;
  for (bool speculative : {false, true}) {
    CAPTURE(speculative);
    engine_config cfg = speculative ? spec_config(spec_mode::fixed, 2, true, noise) : test::exact_engine_config(512);
    cfg.capture_logits = false;
    const run_result r = run_all(w, cfg, prompts, params);
    std::map<int32_t, int64_t> c1, c2;
    for (const auto& [i, toks] : r.tokens) {
      REQUIRE(toks.size() == 3);
      ++c1[toks[1]];
      ++c2[toks[2]];
    }
    auto [s1, df1] = chi2(c1, p1, n);
    auto [s2, df2] = chi2(c2, p2, n);
    MESSAGE("token 1: chi2 " << s1 << " df " << df1 << "; token 2: chi2 " << s2 << " df " << df2);
    CHECK(s1 < chi2_critical(df1));
    CHECK(s2 < chi2_critical(df2));
    if (speculative) {
      // Both outcomes happened often: drafts accepted and rejected (acceptance ≈ 1 − noise).
      CHECK(r.stats.spec.accepted > r.stats.spec.verified / 4);
      CHECK(r.stats.spec.accepted < r.stats.spec.verified * 3 / 4);
      // The test has power: the draft's own distribution (what accepting every draft would
      // give) is far from the samples.
      std::map<int32_t, double> q1;
      for (int32_t t = 0; t < 300; ++t) q1[t] = noise / 300.0;
      for (const auto& [t, p] : p1) q1[t] += (1 - noise) * p;
      CHECK(chi2(c1, q1, n).first > 10 * chi2_critical(chi2(c1, q1, n).second));
    }
  }
}

TEST_CASE("seeded speculative sampling is batch-invariant (fixed verify length, batch-invariant kernels)") {
  for (const char* preset : {"tiny", "v3-tiny"}) {
    CAPTURE(preset);
    auto w = test::tiny_model(preset);
    std::vector<std::vector<int32_t>> prompts;
    std::vector<sampling_params> params;
    for (uint32_t i = 0; i < 8; ++i) {
      prompts.push_back(test::random_tokens(5 + 9 * i, 300 + i));
      sampling_params p;
      p.max_tokens = 14;
      p.temperature = 0.9f;
      p.ignore_eos = true;
      p.seed = 700 + i;
      params.push_back(p);
    }
    auto cfg = spec_config(spec_mode::fixed, 3, true, 0.3);
    cfg.cache.prefix_caching = false;
    std::vector<std::vector<int32_t>> alone;
    for (size_t i = 0; i < prompts.size(); ++i)
      alone.push_back(run_all(w, cfg, {prompts[i]}, {params[i]}).tokens.at(0));
    for (int64_t batch : {8, 3}) {
      CAPTURE(batch);
      cfg.sched.max_running = batch;
      const run_result r = run_all(w, cfg, prompts, params);
      for (size_t i = 0; i < prompts.size(); ++i) CHECK(r.tokens.at(int64_t(i)) == alone[i]);
    }
  }
}

TEST_CASE("structured output under speculation: the grammar masks each verified position, greedy output unchanged") {
  auto w = test::tiny_model("tiny");
  auto tok = test::byte_tokenizer();
  const std::string schema = R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"enum":["x","yz"]}},
    "required":["a","b"],"additionalProperties":false})";
  std::vector<std::vector<int32_t>> prompts;
  std::vector<sampling_params> params;
  for (uint32_t i = 0; i < 6; ++i) {
    prompts.push_back(test::random_tokens(10 + i, 900 + i));
    sampling_params p;
    p.max_tokens = 60;
    p.temperature = i < 3 ? 0.0f : 1.0f;
    p.seed = i;
    p.constraint = {runtime::constraint_kind::json_schema, schema};
    params.push_back(p);
  }
  const run_result plain = run_all(w, test::exact_engine_config(512), prompts, params, tok);
  const run_result spec = run_all(w, spec_config(spec_mode::fixed, 4, true, 0.3), prompts, params, tok);
  CHECK(spec.stats.spec.accepted > 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    CAPTURE(i);
    const std::string& text = spec.text.at(int64_t(i));
    CAPTURE(text);
    if (params[i].temperature == 0) CHECK(spec.tokens.at(int64_t(i)) == plain.tokens.at(int64_t(i)));
    auto j = nlohmann::json::parse(text, nullptr, false);
    REQUIRE_FALSE(j.is_discarded());
    CHECK(j["a"].is_number_integer());
    CHECK((j["b"] == "x" || j["b"] == "yz"));
  }
}

TEST_CASE("blocks and window snapshots written under speculation are exact: a later prompt that extends the output hits them") {
  for (const char* preset : {"tiny", "v3-tiny"}) {
    CAPTURE(preset);
    auto w = test::tiny_model(preset);
    auto cfg = spec_config(spec_mode::fixed, 5, true, 0.4);
    cfg.sched.max_chunk = 16;
    engine e(w, cfg), cold(w, test::exact_engine_config(512));
    sampling_params p;
    p.max_tokens = 40;
    p.ignore_eos = true;
    const auto prompt = test::random_tokens(37, 5);
    std::vector<int32_t> out;
    for (auto& ev : test::run_alone(e, prompt, p)) out.push_back(ev.token);
    REQUIRE(out.size() == 40);
    CHECK(e.stats().spec.verified > e.stats().spec.accepted);  // rejections rolled the caches back
    auto second = prompt;
    second.insert(second.end(), out.begin(), out.begin() + 35);
    const auto extra = test::random_tokens(9, 6);
    second.insert(second.end(), extra.begin(), extra.end());
    p.max_tokens = 6;
    const uint64_t hits_before = e.stats().cache.hit_tokens;
    auto hit = test::run_alone(e, second, p);
    auto ref = test::run_alone(cold, second, p);
    CHECK(e.stats().cache.hit_tokens - hits_before >= 64);  // the blocks of prompt + output
    CHECK(e.stats().cache.replays == 0);  // every boundary's window snapshot was taken
    REQUIRE(hit.size() == ref.size());
    for (size_t i = 0; i < hit.size(); ++i) {
      CHECK(hit[i].token == ref[i].token);
      CHECK(hit[i].logits == ref[i].logits);
    }
  }
}

TEST_CASE("incremental MTP drafting equals the chain recomputed over the whole sequence (deepseek_v3)") {
  auto w = test::tiny_model("v3-tiny");
  const model::model_config& c = w->config;
  std::vector<int32_t> tokens = test::random_tokens(9, 3);
  model::sequence_cache cache;
  cache.init(c, std::max<int64_t>(model::min_ring_tokens(c), 1));
  model::kv_pages pages(model::kv_format_of(c, model::kv_dtype::fp32), 64);
  cache.pages = &pages;
  std::vector<float> hidden;  // main-model rows of positions 0 … computed − 1
  const model::forward_options fo{true, false, nullptr};
  model::mtp_state state;
  std::mt19937 rng(4);
  auto argmax = [](std::span<const float> l) { return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin()); };
  int64_t last_n = 0;
  for (int step = 0; step < 10; ++step) {
    CAPTURE(step);
    const int64_t n = static_cast<int64_t>(tokens.size()) - 1;  // the newest token stays out of the caches
    last_n = n;
    while (static_cast<int64_t>(cache.blocks.size()) * c.block_size < n) {
      REQUIRE(static_cast<int32_t>(cache.blocks.size()) < pages.num_blocks());
      cache.blocks.push_back(static_cast<int32_t>(cache.blocks.size()));
    }
    model::forward_item it{&cache, std::span<const int32_t>(tokens).subspan(static_cast<size_t>(cache.computed),
                                                                             static_cast<size_t>(n - cache.computed)),
                           0, 0, false, true, {}};
    auto res = model::forward(*w, std::span<model::forward_item>(&it, 1), fo);
    hidden.insert(hidden.end(), res.hidden[0].begin(), res.hidden[0].end());
    std::vector<std::vector<float>> whole, step_logits;
    model::mtp_chain_item a{tokens, hidden.data(), 0, &cache};
    auto da = model::mtp_chain(*w, std::span<const model::mtp_chain_item>(&a, 1), 4,
                               [&](size_t, int64_t, std::span<const float> l, float) {
                                 whole.emplace_back(l.begin(), l.end());
                                 return argmax(l);
                               }, fo);
    model::mtp_step_item b{tokens, hidden.data(), 0, &cache, &state};
    auto db = model::mtp_chain_step(*w, std::span<const model::mtp_step_item>(&b, 1), 4, 1000,
                                    [&](size_t, int64_t, std::span<const float> l, float) {
                                      step_logits.emplace_back(l.begin(), l.end());
                                      return argmax(l);
                                    }, fo);
    REQUIRE(da[0].size() == 4);
    REQUIRE(db[0].size() == 4);
    for (size_t k = 0; k < 4; ++k) {
      CAPTURE(k);
      CHECK(db[0][k].token == da[0][k].token);
      CHECK(test::rel_diff(step_logits[k], whole[k]) < 1e-5);
    }
    // Accept 0–3 drafts and a correction, as verification would.
    const size_t accepted = rng() % 4;
    for (size_t j = 0; j < accepted; ++j) tokens.push_back(da[0][j].token);
    tokens.push_back(static_cast<int32_t>(rng() % 256));
  }
  // Depth k's entries are final below n − k, the last n the chain saw.
  CHECK(state.frontier[0] == last_n);
  CHECK(state.frontier[3] == last_n - 3);
}

TEST_CASE("rejection sampling reproduces the target distribution exactly (analytic)") {
  runtime::token_distribution p{{0, 1, 2, 3}, {0.5f, 0.25f, 0.15f, 0.10f}, 1.0};
  runtime::token_distribution q{{0, 1, 2, 3, 4}, {0.1f, 0.5f, 0.2f, 0.1f, 0.1f}, 1.0};
  const auto res = runtime::residual(p, q);
  double reject = 0;
  for (int32_t x = 0; x < 5; ++x) reject += q.prob(x) * (1 - std::min(1.0, p.prob(x) / std::max(q.prob(x), 1e-300)));
  for (int32_t x = 0; x < 5; ++x) {
    const double out = q.prob(x) * std::min(1.0, p.prob(x) / q.prob(x)) + reject * res.prob(x);
    CHECK(out == doctest::Approx(p.prob(x)).epsilon(1e-6));
  }
  // u decides: p(1)/q(1) = 0.5
  CHECK(runtime::accept_draft(p, q, 1, 0.49));
  CHECK_FALSE(runtime::accept_draft(p, q, 1, 0.51));
  CHECK_FALSE(runtime::accept_draft(p, q, 4, 0.0));  // outside the target's support
}

TEST_CASE("verify-length policy: cheap tokens verify everything, dear ones nothing, each request a prefix") {
  std::vector<runtime::spec_candidate> c = {{{0.9f, 0.8f, 0.1f}, 100}, {{0.2f, 0.9f}, 100}, {{0.99f, 0.99f, 0.99f}, 100}};
  CHECK(runtime::choose_verify_lengths(c, runtime::cost_model(1.0, 0, 0, 0), 3) == std::vector<int64_t>{3, 2, 3});
  CHECK(runtime::choose_verify_lengths(c, runtime::cost_model(0.0, 1.0, 0, 0), 3) == std::vector<int64_t>{0, 0, 0});
  // Step cost 1 + 0.1 per token: worth a draft when its yield beats the rate × 0.1.
  auto k = runtime::choose_verify_lengths(c, runtime::cost_model(1.0, 0.1, 0, 0), 3);
  CHECK(k == std::vector<int64_t>{2, 0, 3});
  CHECK(runtime::expected_accepted(std::vector<float>{0.5f, 0.5f}, 2) == doctest::Approx(0.75));
  runtime::acceptance_estimate est;
  est.record(3, 1);  // depth 0 accepted, depth 1 rejected, depth 2 never tested
  est.record(2, 2);
  CHECK(est.at(0) == doctest::Approx(1.0));
  CHECK(est.at(1) == doctest::Approx(0.5));
  CHECK(est.at(2) == doctest::Approx(0.5));  // prior: not seen
}

TEST_CASE("adaptive DSpark at 60 sequences: 3.2-4.4 of 5 drafts verified, accepted length within 3% of fixed-5") {
  const auto synth = runtime::production_acceptance();
  // A production-like step: 13.8 ms fixed + 13.5 µs per verified token (MISSION.md: about
  // 53 steps/s at 60 sequences and 13,730 tok/s per rank, a quarter of the step per token).
  const runtime::cost_model cost(13.8e-3, 13.5e-6, 0, 0);
  const int64_t seqs = 60, steps = 500, nextn = 5;
  double fixed_acc = 0, adapt_acc = 0, adapt_ver = 0, fixed_time = 0, adapt_time = 0;
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<runtime::spec_candidate> c(static_cast<size_t>(seqs));
    std::vector<int64_t> first_reject(static_cast<size_t>(seqs), nextn);
    for (int64_t i = 0; i < seqs; ++i) {
      for (int64_t j = 0; j < nextn; ++j) {
        const float p = synth.confidence(static_cast<uint64_t>(i), s, j);
        c[static_cast<size_t>(i)].confidence.push_back(p);
        if (first_reject[static_cast<size_t>(i)] == nextn && !synth.accepted(static_cast<uint64_t>(i), s, j, p))
          first_reject[static_cast<size_t>(i)] = j;
      }
      c[static_cast<size_t>(i)].context = 1000;
    }
    const auto k = runtime::choose_verify_lengths(c, cost, seqs);
    int64_t verified = 0, acc_f = 0, acc_a = 0;
    for (int64_t i = 0; i < seqs; ++i) {
      acc_f += first_reject[static_cast<size_t>(i)];
      acc_a += std::min(first_reject[static_cast<size_t>(i)], k[static_cast<size_t>(i)]);
      verified += k[static_cast<size_t>(i)];
    }
    fixed_acc += double(acc_f);
    adapt_acc += double(acc_a);
    adapt_ver += double(verified);
    fixed_time += cost.predict(seqs * (1 + nextn), 1000);
    adapt_time += cost.predict(seqs + verified, 1000);
  }
  const double n = double(seqs * steps);
  MESSAGE("fixed-5: accepted " << fixed_acc / n << "; adaptive: verified " << adapt_ver / n << ", accepted "
                               << adapt_acc / n << "; tokens/s adaptive / fixed "
                               << ((n + adapt_acc) / adapt_time) / ((n + fixed_acc) / fixed_time));
  CHECK(fixed_acc / n == doctest::Approx(3.29).epsilon(0.03));
  CHECK(adapt_ver / n >= 3.2);
  CHECK(adapt_ver / n <= 4.4);
  CHECK(adapt_acc >= 0.97 * fixed_acc);
  CHECK((n + adapt_acc) / adapt_time > (n + fixed_acc) / fixed_time);  // the point of it
}

// auto_verify with steady, known rates: the prior first, then each choice measured (a switch
// is not), the better kept; trials of the other at 256, 512 and 1,024 steps later while they
// confirm it, each trial's second step measured; a trial that finds the other better moves the
// choice there.
TEST_CASE("auto_verify: measured both ways, keeps the faster, retries with back-off, follows a change") {
  runtime::auto_verify a(16);
  double on_rate = 100, off_rate = 300;  // tokens per second of step: verification loses
  std::vector<int64_t> trial_steps;       // steps (from 1) on which it verified after settling
  int64_t step = 0;
  auto run = [&](int64_t steps) {
    for (int64_t i = 0; i < steps; ++i) {
      const bool v = a.choose(4);
      ++step;
      if (step > 10 && v) trial_steps.push_back(step);
      a.measure(4, v, true, v ? on_rate : off_rate);
    }
  };
  // 4 decodes: below the prior's 16, so it verifies none first.
  CHECK_FALSE(a.choose(4));
  a.measure(4, false, true, off_rate);
  step = 1;
  run(2000);
  CHECK(a.rate(4, false) == doctest::Approx(off_rate));
  CHECK(a.rate(4, true) == doctest::Approx(on_rate));
  // Trials of 2 steps each, the gaps doubling: 512, then 1,024 steps from the decision after
  // one trial to the next trial.
  REQUIRE(trial_steps.size() == 6);
  for (size_t t = 0; t < 6; t += 2) CHECK(trial_steps[t + 1] == trial_steps[t] + 1);
  CHECK(trial_steps[2] == trial_steps[1] + 1 + 512);
  CHECK(trial_steps[4] == trial_steps[3] + 1 + 1024);
  // Verification becomes the better choice: a trial measures it, and the choice follows.
  on_rate = 1000;
  trial_steps.clear();
  run(3000);
  REQUIRE(!trial_steps.empty());
  bool settled_on = true;
  for (int i = 0; i < 20; ++i) {
    const bool v = a.choose(4);
    settled_on = settled_on && v;
    a.measure(4, v, true, v ? on_rate : off_rate);
  }
  CHECK(settled_on);
  // Another bucket has its own measurements: 40 decodes start from the prior (verify).
  CHECK(a.choose(40));
  // A step with prefill in it, or of another choice than the last, is not measured.
  runtime::auto_verify b(16);
  b.measure(4, false, false, 50);
  CHECK(b.rate(4, false) == 0);
  b.measure(4, true, true, 50);  // the first verified step after unverified ones: a switch
  CHECK(b.rate(4, true) == 0);
  b.measure(4, true, true, 60);
  CHECK(b.rate(4, true) == doctest::Approx(60));
}
