// The remote block tier through the engine: blocks one engine computed and offered are a
// prefix hit for another engine with its own pool, with next-token logits bit-identical to a
// cold computation; a remote tier that lists blocks it then cannot deliver is a miss (the
// engine recomputes, same logits). The tier here is an in-memory map standing in for the
// storage cluster (the cluster test uses the real storage nodes).
#include <doctest/doctest.h>

#include <map>
#include <mutex>
#include <random>

#include "runtime/engine.hpp"
#include "runtime/remote_blocks.hpp"
#include "tests/support/tiny_models.hpp"

using namespace shoal;
using runtime::block_key;

namespace {

struct key_less {
  bool operator()(const block_key& a, const block_key& b) const { return std::tie(a.hi, a.lo) < std::tie(b.hi, b.lo); }
};

class memory_tier final : public runtime::remote_blocks {
 public:
  bool fail_fetches = false;
  size_t fetches = 0;

  size_t lookup(std::span<const block_key> keys) override {
    std::lock_guard lock(mu_);
    size_t n = 0;
    while (n < keys.size() && blocks_.contains(keys[n])) ++n;
    return n;
  }
  bool fetch(const block_key& key, std::span<float> dst) override {
    std::lock_guard lock(mu_);
    ++fetches;
    auto it = blocks_.find(key);
    if (fail_fetches || it == blocks_.end() || it->second.size() != dst.size()) return false;
    std::copy(it->second.begin(), it->second.end(), dst.begin());
    return true;
  }
  int last_class = -1;
  bool store_async(const block_key& key, std::span<const float> src, int traffic_class) override {
    std::lock_guard lock(mu_);
    last_class = traffic_class;
    blocks_[key].assign(src.begin(), src.end());
    return true;
  }
  size_t size() const {
    std::lock_guard lock(mu_);
    return blocks_.size();
  }

 private:
  mutable std::mutex mu_;
  std::map<block_key, std::vector<float>, key_less> blocks_;
};

runtime::sampling_params greedy(int32_t n) {
  runtime::sampling_params p;
  p.max_tokens = n;
  p.ignore_eos = true;
  return p;
}

std::vector<runtime::token_event> run_one(runtime::engine& e, const std::vector<int32_t>& prompt) {
  return test::run_alone(e, prompt, greedy(6));
}

}  // namespace

TEST_CASE("remote tier: blocks computed by one engine are a hit for another, logits bit-identical") {
  auto w = test::tiny_model("v3-tiny");
  auto tier = std::make_shared<memory_tier>();
  auto cfg = test::exact_engine_config(256);
  cfg.cache.remote = tier;
  runtime::engine writer(w, cfg), reader(w, cfg), cold(w, test::exact_engine_config(256));
  auto first = test::random_tokens(96, 21);
  run_one(writer, first);
  CHECK(tier->size() == static_cast<size_t>(96 / w->config.block_size));
  CHECK(writer.stats().cache.remote_stored == tier->size());
  CHECK(tier->last_class == 1);  // chat unless the request says otherwise

  auto second = first;
  auto extra = test::random_tokens(40, 22);
  second.insert(second.end(), extra.begin(), extra.end());
  auto hit = run_one(reader, second);
  auto ref = run_one(cold, second);
  CHECK(reader.stats().cache.remote_hit_tokens > 0);
  CHECK(reader.stats().cache.hit_tokens == reader.stats().cache.remote_hit_tokens);
  REQUIRE(hit.size() == ref.size());
  for (size_t i = 0; i < hit.size(); ++i) {
    CHECK(hit[i].token == ref[i].token);
    CHECK(hit[i].logits == ref[i].logits);
  }
}

TEST_CASE("remote tier: listed blocks that cannot be fetched are a miss and the engine recomputes") {
  auto w = test::tiny_model("v3-tiny");
  auto tier = std::make_shared<memory_tier>();
  auto cfg = test::exact_engine_config(256);
  cfg.cache.remote = tier;
  runtime::engine writer(w, cfg), reader(w, cfg), cold(w, test::exact_engine_config(256));
  auto prompt = test::random_tokens(80, 31);
  run_one(writer, prompt);
  tier->fail_fetches = true;
  auto got = run_one(reader, prompt);
  auto ref = run_one(cold, prompt);
  CHECK(tier->fetches > 0);
  CHECK(reader.stats().cache.remote_fetch_failures == 1);
  CHECK(reader.stats().cache.hit_tokens == 0);
  REQUIRE(got.size() == ref.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i].logits == ref[i].logits);
  CHECK(reader.stats().blocks_free == reader.stats().blocks_total);
}

TEST_CASE("remote tier: fetches into a nearly full pool keep the local hit they extend, outputs stay exact") {
  // Prompts are chains of shared 16-token segments, so local and remote hits interleave; the
  // reader's pool is barely larger than one prompt, so taking blocks for a fetch must evict
  // cached blocks, but never those of the local hit the fetch extends.
  auto w = test::tiny_model("v3-tiny");
  const int64_t bs = w->config.block_size;
  auto tier = std::make_shared<memory_tier>();
  auto wcfg = test::exact_engine_config(256);
  wcfg.cache.remote = tier;
  auto rcfg = test::exact_engine_config(9);
  rcfg.cache.remote = tier;
  runtime::engine writer(w, wcfg), reader(w, rcfg), cold(w, test::exact_engine_config(256));
  std::vector<std::vector<int32_t>> segments;
  for (uint32_t s = 0; s < 6; ++s) segments.push_back(test::random_tokens(static_cast<size_t>(bs), 500 + s));
  std::mt19937 rng(7);
  for (int i = 0; i < 30; ++i) {
    std::vector<int32_t> prompt;
    size_t n = 2 + rng() % 5;  // 2..6 segments: up to 6 blocks + the tail
    for (size_t j = 0; j < n; ++j) {
      const auto& seg = segments[j == 0 ? 0 : rng() % segments.size()];
      prompt.insert(prompt.end(), seg.begin(), seg.end());
    }
    prompt.push_back(static_cast<int32_t>(rng() % 256));
    CAPTURE(i);
    if (i % 3 == 0) run_one(writer, prompt);  // the remote tier learns some of them
    auto got = run_one(reader, prompt);
    auto ref = run_one(cold, prompt);
    REQUIRE(got.size() == ref.size());
    for (size_t t = 0; t < got.size(); ++t) CHECK(got[t].logits == ref[t].logits);
  }
  CHECK(reader.stats().cache.remote_hit_tokens > 0);
  CHECK(reader.stats().cache.hit_tokens > reader.stats().cache.remote_hit_tokens);  // local hits too
  CHECK(reader.stats().blocks_free == reader.stats().blocks_total);
}
