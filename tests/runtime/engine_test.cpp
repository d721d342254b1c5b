// Engine-level outcomes on the tiny presets: prefix-cache hits give the same logits as a cold
// computation (bit-exact in batch-invariant mode), batch invariance of seeded sampling,
// preemption without deadlock or changed outputs, async == sync scheduling, bounded replay
// within its stated bound, and clear errors for bad requests.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "runtime/engine/engine.hpp"
#include "tests/support/tiny_models.hpp"

using namespace shoal;
using runtime::engine;
using runtime::engine_config;
using runtime::sampling_params;

namespace {

engine_config base_config(int64_t blocks = 256, model::kv_dtype kv = model::kv_dtype::fp32) {
  return test::exact_engine_config(blocks, kv);
}

sampling_params greedy(int32_t n) {
  sampling_params p;
  p.max_tokens = n;
  p.ignore_eos = true;
  return p;
}

std::vector<runtime::token_event> run_one(engine& e, const std::vector<int32_t>& prompt, const sampling_params& p) {
  return test::run_alone(e, prompt, p);
}

}  // namespace

TEST_CASE("prefix-cache hit gives the same next-token logits as no hit (bit-exact, both architectures, every KV format)") {
  for (auto kv : {model::kv_dtype::fp32, model::kv_dtype::bf16, model::kv_dtype::fp8})
  for (const char* preset : {"v3-tiny", "tiny"}) {
    for (bool exact : {true, false}) {
      CAPTURE(preset);
      CAPTURE(exact);
      CAPTURE(model::to_string(kv));
      auto w = test::tiny_model(preset);
      auto cfg = base_config(256, kv);
      cfg.cache.exact_swa = exact;
      cfg.sched.max_chunk = 16;  // chunk boundaries leave window snapshots behind
      engine warm(w, cfg), cold(w, cfg);
      auto first = test::random_tokens(96, 11);
      run_one(warm, first, greedy(4));
      auto second = first;
      auto extra = test::random_tokens(60, 12);
      second.insert(second.end(), extra.begin(), extra.end());
      auto hit = run_one(warm, second, greedy(6));
      auto ref = run_one(cold, second, greedy(6));
      CHECK(warm.stats().cache.hit_tokens > 0);
      CHECK(warm.stats().cache.replays == 0);  // the window came from a snapshot
      REQUIRE(hit.size() == ref.size());
      for (size_t i = 0; i < hit.size(); ++i) {
        CHECK(hit[i].token == ref[i].token);
        CHECK(hit[i].logits == ref[i].logits);
      }
    }
  }
}

TEST_CASE("batch invariance: 16 seeded sequences sample the same tokens alone and in any batch (every KV format)") {
  for (auto kv : {model::kv_dtype::fp32, model::kv_dtype::bf16, model::kv_dtype::fp8})
  for (const char* preset : {"tiny", "v3-tiny"}) {
    auto w = test::tiny_model(preset);
    std::vector<std::vector<int32_t>> prompts;
    for (uint32_t i = 0; i < 16; ++i) prompts.push_back(test::random_tokens(5 + 7 * i, 100 + i));
    auto params_of = [](size_t i) {
      sampling_params p;
      p.max_tokens = 12;
      p.temperature = 0.9f;
      p.top_p = 0.95f;
      p.ignore_eos = true;
      p.seed = 1000 + i;
      return p;
    };
    std::vector<std::vector<int32_t>> alone;
    for (size_t i = 0; i < 16; ++i) {
      auto cfg = base_config(256, kv);
      cfg.cache.prefix_caching = false;
      engine e(w, cfg);
      std::vector<int32_t> out;
      for (auto& ev : run_one(e, prompts[i], params_of(i))) out.push_back(ev.token);
      alone.push_back(out);
    }
    for (auto [batch, order_seed] : {std::pair{16, 1u}, {5, 2u}, {3, 3u}}) {
      std::vector<size_t> order(16);
      for (size_t i = 0; i < 16; ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), std::mt19937(order_seed));
      auto cfg = base_config(256, kv);
      cfg.cache.prefix_caching = false;
      cfg.sched.max_running = batch;
      engine e(w, cfg);
      std::map<int64_t, size_t> which;
      for (size_t i : order) which[e.add_request(prompts[i], params_of(i))->value] = i;
      for (auto& c : e.run_to_completion()) {
        CAPTURE(preset);
        CAPTURE(batch);
        CHECK(c.output == alone[which[c.id.value]]);
      }
    }
  }
}

TEST_CASE("preemption under block pressure: every request completes with unchanged output") {
  auto w = test::tiny_model("tiny");
  std::vector<std::vector<int32_t>> prompts;
  for (uint32_t i = 0; i < 8; ++i) prompts.push_back(test::random_tokens(30 + 3 * i, 200 + i));
  auto run = [&](int64_t blocks) {
    auto cfg = base_config(blocks);
    cfg.cache.prefix_caching = false;
    engine e(w, cfg);
    for (auto& p : prompts) REQUIRE(e.add_request(p, greedy(40)).has_value());
    auto done = e.run_to_completion();
    return std::pair{done, e.stats()};
  };
  auto [roomy, roomy_stats] = run(256);
  auto [tight, tight_stats] = run(12);  // 12 blocks of 16 tokens: at most ~2 sequences fit
  CHECK(roomy_stats.cache.preemptions == 0);
  CHECK(tight_stats.cache.preemptions > 0);
  REQUIRE(tight.size() == roomy.size());
  for (size_t i = 0; i < tight.size(); ++i) {
    CHECK(tight[i].output.size() == 40);
    CHECK(tight[i].output == roomy[i].output);
  }
  CHECK(tight_stats.blocks_free == 12);
}

TEST_CASE("async scheduling produces exactly the outputs of synchronous scheduling") {
  for (const char* preset : {"tiny", "v3-tiny"}) {
    auto w = test::tiny_model(preset);
    std::vector<std::vector<runtime::completion>> results;
    for (bool async : {false, true}) {
      auto cfg = base_config(64);
      cfg.async_scheduling = async;
      cfg.sched.max_chunk = 24;
      engine e(w, cfg);
      for (uint32_t i = 0; i < 10; ++i) {
        sampling_params p = greedy(10 + static_cast<int32_t>(i));
        REQUIRE(e.add_request(test::random_tokens(20 + 9 * i, 300 + i), p).has_value());
      }
      results.push_back(e.run_to_completion());
    }
    REQUIRE(results[0].size() == results[1].size());
    for (size_t i = 0; i < results[0].size(); ++i) CHECK(results[0][i].output == results[1][i].output);
  }
}

TEST_CASE("decode steps fitted from the engine's own steps (the decode balancer's weights), chunking untouched") {
  auto w = test::tiny_model("v3-tiny");
  auto cfg = base_config(256);
  cfg.batch_invariant = true;
  cfg.cost_fit.decode = true;
  cfg.cost_fit.min_samples = 8;
  engine e(w, cfg);
  CHECK(e.stats().decode_cost.source == "none");
  // Requests join one at a time, each decoding a while: decode steps of 1 … 6 sequences.
  for (uint32_t i = 0; i < 6; ++i) {
    REQUIRE(e.add_request(test::random_tokens(8 + i, 300 + i), greedy(40)).has_value());
    for (int s = 0; s < 6; ++s) e.step();
  }
  e.run_to_completion();
  const runtime::cost_stats c = e.stats().decode_cost;
  REQUIRE_MESSAGE(c.source == "fitted", c.detail);
  CHECK(c.samples >= 32);  // 4 × min_samples decode steps
  CHECK(c.coef.size() == 4);
  CHECK(c.detail.find("decode steps") != std::string::npos);
  CHECK(e.stats().cost.source == "none");  // prefill chunks are not sized by it
}

TEST_CASE("step-cost model fitted from the engine's own steps: chunks follow it once fitted, outputs unchanged") {
  auto w = test::tiny_model("v3-tiny");
  std::vector<std::vector<runtime::completion>> results;
  for (bool fit : {false, true}) {
    auto cfg = base_config(256);
    cfg.batch_invariant = true;
    std::optional<runtime::cost_model> kept;
    cfg.cost_fit.enabled = fit;
    cfg.cost_fit.min_samples = 8;
    cfg.cost_fit.step_budget_s = 1e-9;  // once fitted: one token of prefill per step
    cfg.cost_fit.fitted = [&](const runtime::cost_model& m) { kept = m; };
    engine e(w, cfg);
    CHECK(e.stats().cost.source == "none");
    // One request at a time, each prefilled in one step: prompts of varied lengths on 0, 1 or 2
    // cached blocks of a shared prefix (samples of varied n and p).
    const auto shared = test::random_tokens(3 * w->config.block_size, 77);
    std::vector<runtime::completion> done;
    for (uint32_t i = 0; i < 12 && !kept; ++i) {
      std::vector<int32_t> prompt(shared.begin(), shared.begin() + (i % 3) * w->config.block_size);
      const auto tail = test::random_tokens(6 + 11 * i, 700 + i);
      prompt.insert(prompt.end(), tail.begin(), tail.end());
      REQUIRE(e.add_request(prompt, greedy(2)).has_value());
      for (auto& c : e.run_to_completion()) done.push_back(c);
    }
    results.push_back(done);
    const runtime::cost_stats c = e.stats().cost;
    if (!fit) {
      CHECK(c.source == "none");
      CHECK_FALSE(kept);
      continue;
    }
    REQUIRE(kept);
    CHECK(c.source == "fitted");
    CHECK(c.samples >= 8);
    CHECK(kept->quality().samples == c.samples);
    // After the fit the 1 ns budget leaves one prefill token per step: a prompt added now
    // takes one step per token.
    const uint64_t steps = e.stats().steps;
    REQUIRE(e.add_request(test::random_tokens(10, 999), greedy(1)).has_value());
    e.run_to_completion();
    CHECK(e.stats().steps - steps >= 10);
  }
  REQUIRE(results[1].size() <= results[0].size());
  for (size_t i = 0; i < results[1].size(); ++i) CHECK(results[0][i].output == results[1][i].output);
}

TEST_CASE("bounded replay: divergence from exact reconstruction stays below the stated bound") {
  // Bound (tiny preset, replay 16 = W): mean KL(exact || replay) of the next-token distribution
  // below 0.05 nats over 20 prompts. `shoal bench replay` reports the figure on 100 prompts.
  auto w = test::tiny_model("tiny");
  double kl_sum = 0;
  int replayed = 0;
  for (uint32_t i = 0; i < 20; ++i) {
    auto prompt = test::random_tokens(80 + 5 * i, 400 + i);
    auto exact_cfg = base_config();
    exact_cfg.cache.exact_swa = true;
    engine exact(w, exact_cfg);
    auto ref = run_one(exact, prompt, greedy(1));
    auto cfg = base_config();
    cfg.cache.swa_snapshots = 0;  // no window snapshots: every hit replays
    engine e(w, cfg);
    auto head = std::vector<int32_t>(prompt.begin(), prompt.begin() + 64);
    run_one(e, head, greedy(1));
    auto rep = run_one(e, prompt, greedy(1));
    replayed += static_cast<int>(e.stats().cache.replays);
    auto softmax = [](const std::vector<float>& l) {
      double mx = *std::max_element(l.begin(), l.end()), s = 0;
      std::vector<double> p(l.size());
      for (size_t k = 0; k < l.size(); ++k) s += (p[k] = std::exp(l[k] - mx));
      for (auto& x : p) x /= s;
      return p;
    };
    auto p = softmax(ref[0].logits), q = softmax(rep[0].logits);
    double kl = 0;
    for (size_t k = 0; k < p.size(); ++k) kl += p[k] * std::log(p[k] / q[k]);
    kl_sum += kl;
  }
  CHECK(replayed == 20);
  MESSAGE("mean KL(exact || replay) = " << kl_sum / 20);
  CHECK(kl_sum / 20 < 0.05);
}

TEST_CASE("abort: waiting and running requests finish as aborted and free their blocks") {
  for (bool async : {false, true}) {
    auto w = test::tiny_model("tiny");
    auto cfg = base_config(64);
    cfg.async_scheduling = async;
    engine e(w, cfg);
    auto a = e.add_request(test::random_tokens(20, 1), greedy(50));
    auto b = e.add_request(test::random_tokens(20, 2), greedy(50));
    e.step();
    e.step();
    CHECK(e.abort(*a));
    while (e.has_work()) e.step();
    CHECK(e.result(*a).reason == runtime::finish_reason::aborted);
    CHECK(e.result(*a).output.size() < 50);
    CHECK(e.result(*b).reason == runtime::finish_reason::length);
    CHECK(e.result(*b).output.size() == 50);
    CHECK(e.stats().blocks_free == 64);
    CHECK_FALSE(e.abort(*a));  // already finished
  }
}

TEST_CASE("bad requests get errors naming the problem, and leave nothing queued") {
  auto w = test::tiny_model("tiny");
  engine e(w, base_config(16));
  auto check_err = [&](std::vector<int32_t> prompt, sampling_params p, const char* needle) {
    auto r = e.add_request(std::move(prompt), p);
    REQUIRE_FALSE(r.has_value());
    CAPTURE(r.error().message);
    CHECK(r.error().message.find(needle) != std::string::npos);
  };
  check_err({}, greedy(4), "empty");
  check_err({1, 2, 999}, greedy(4), "vocabulary");
  check_err({1, 2, -1}, greedy(4), "vocabulary");
  sampling_params bad = greedy(4);
  bad.temperature = -1;
  check_err({1, 2}, bad, "temperature");
  check_err({1, 2}, greedy(600), "context");
  check_err(test::random_tokens(200, 1), greedy(100), "blocks");
  CHECK_FALSE(e.has_work());
}

TEST_CASE("stop strings end a request in the engine at the first match, text cut before it") {
  auto w = test::tiny_model("tiny");
  auto tok = model::tokenizer::parse(model::byte_level_tokenizer_json({"<eos>"}), "generated");
  REQUIRE(tok);
  auto shared_tok = std::make_shared<const model::tokenizer>(std::move(*tok));
  auto prompt = test::random_tokens(20, 5);
  sampling_params p;
  p.max_tokens = 32;
  p.ignore_eos = true;
  engine plain(w, test::exact_engine_config(64), shared_tok);
  REQUIRE(plain.add_request(prompt, p));
  const auto free_run = plain.run_to_completion().at(0);
  REQUIRE(free_run.text.size() >= 8);
  const std::string stop = free_run.text.substr(free_run.text.size() / 2, 2);
  const size_t at = free_run.text.find(stop);

  engine stopping(w, test::exact_engine_config(64), shared_tok);
  p.stop_strings = {stop, "\x01never\x02"};
  REQUIRE(stopping.add_request(prompt, p));
  const auto got = stopping.run_to_completion().at(0);
  CHECK(got.reason == runtime::finish_reason::stop);
  CHECK(got.text == free_run.text.substr(0, at));
  CHECK(got.output.size() < free_run.output.size());
  CHECK(std::equal(got.output.begin(), got.output.end(), free_run.output.begin()));

  // Without a tokenizer the engine cannot see text: refused, naming why.
  engine blind(w, test::exact_engine_config(64));
  auto refused = blind.add_request(prompt, p);
  REQUIRE(!refused);
  CHECK(refused.error().message.find("stop strings need a tokenizer") != std::string::npos);
}
