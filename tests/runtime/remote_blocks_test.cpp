// The remote block tier through the engine: blocks one engine computed and offered are a
// prefix hit for another engine with its own pool, with next-token logits bit-identical to a
// cold computation; a remote tier that lists blocks it then cannot deliver is a miss (the
// engine recomputes, same logits); a read that does not come back delays only the request
// waiting on it, which recomputes at its deadline (a manual clock). The tier here is an
// in-memory map standing in for the storage cluster (the cluster test uses the real storage
// nodes).
#include <doctest/doctest.h>

#include <map>
#include <mutex>
#include <random>

#include "runtime/engine/engine.hpp"
#include "runtime/core/remote_blocks.hpp"
#include "runtime/core/swa_store.hpp"
#include "tests/support/tiny_models.hpp"

using namespace shoal;
using runtime::block_key;

namespace {

struct key_less {
  bool operator()(const block_key& a, const block_key& b) const { return std::tie(a.hi, a.lo) < std::tie(b.hi, b.lo); }
};

// Reads complete inside start_fetch unless `hold` is set: then a read of blocks the tier has
// waits until release() (a storage node that accepted the request and went quiet).
class memory_tier final : public runtime::remote_blocks {
 public:
  bool fail_fetches = false;
  bool hold = false;
  size_t fetches = 0, lookups = 0;

  std::shared_ptr<runtime::remote_fetch> start_fetch(std::vector<block_key> keys, std::vector<std::span<std::byte>> dsts,
                                                     const model::kv_format& f) override {
    std::lock_guard lock(mu_);
    ++lookups;
    auto fetch = std::make_shared<runtime::remote_fetch>();
    job j{std::move(keys), std::move(dsts), f, fetch};
    if (hold && listed(j) > 0)
      held_.push_back(std::move(j));
    else
      serve(j);
    return fetch;
  }
  // Serves the held reads now (their requests may have given up on them long ago).
  void release() {
    std::lock_guard lock(mu_);
    for (auto& j : held_) serve(j);
    held_.clear();
  }
  runtime::traffic_class last_class = runtime::traffic_class::agent;
  bool store_async(const block_key& key, std::span<const std::byte> src, const model::kv_format& f,
                   runtime::traffic_class cls) override {
    std::lock_guard lock(mu_);
    last_class = cls;
    blocks_[key] = {f, std::vector<std::byte>(src.begin(), src.end())};
    return true;
  }
  size_t size() const {
    std::lock_guard lock(mu_);
    return blocks_.size();
  }

 private:
  struct job {
    std::vector<block_key> keys;
    std::vector<std::span<std::byte>> dsts;
    model::kv_format format;
    std::shared_ptr<runtime::remote_fetch> fetch;
  };
  size_t listed(const job& j) const {
    size_t n = 0;
    while (n < j.keys.size() && blocks_.contains(j.keys[n])) ++n;
    return n;
  }
  void serve(job& j) {
    size_t n = listed(j), done = 0;
    bool other_format = false;
    if (!j.fetch->cancelled())
      for (; done < n && !fail_fetches; ++done) {
        ++fetches;
        const auto& [format, bytes] = blocks_.at(j.keys[done]);
        if (format != j.format) {
          other_format = true;
          break;
        }
        if (bytes.size() != j.dsts[done].size()) break;
        std::copy(bytes.begin(), bytes.end(), j.dsts[done].begin());
      }
    if (fail_fetches) ++fetches;
    j.fetch->complete(n, done, done < n ? "memory tier: fetch failed" : "", other_format);
  }

  mutable std::mutex mu_;
  std::map<block_key, std::pair<model::kv_format, std::vector<std::byte>>, key_less> blocks_;
  std::vector<job> held_;
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
  CHECK(tier->last_class == runtime::traffic_class::chat);  // unless the request says otherwise

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
  CHECK(reader.stats().cache.remote_last_error == "memory tier: fetch failed");
  CHECK(reader.stats().cache.hit_tokens == 0);
  REQUIRE(got.size() == ref.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i].logits == ref[i].logits);
  CHECK(reader.stats().blocks_free == reader.stats().blocks_total);
}

TEST_CASE("remote tier: blocks stored in another KV format are a counted miss, never read as this engine's") {
  auto w = test::tiny_model("v3-tiny");
  auto tier = std::make_shared<memory_tier>();
  auto fp32 = test::exact_engine_config(256), bf16 = test::exact_engine_config(256, model::kv_dtype::bf16);
  fp32.cache.remote = tier;
  bf16.cache.remote = tier;
  runtime::engine writer(w, fp32), reader(w, bf16), cold(w, test::exact_engine_config(256, model::kv_dtype::bf16));
  auto prompt = test::random_tokens(80, 33);
  run_one(writer, prompt);
  REQUIRE(tier->size() > 0);
  auto got = run_one(reader, prompt);
  auto ref = run_one(cold, prompt);
  CHECK(reader.stats().cache.remote_format_misses == 1);
  CHECK(reader.stats().cache.remote_fetch_failures == 0);
  CHECK(reader.stats().cache.hit_tokens == 0);
  REQUIRE(got.size() == ref.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i].logits == ref[i].logits);  // bf16 throughout
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

TEST_CASE("remote tier: a read that never answers delays only its request, which recomputes at its deadline") {
  auto w = test::tiny_model("v3-tiny");
  auto tier = std::make_shared<memory_tier>();
  auto clock = std::make_shared<runtime::manual_clock>();
  auto wcfg = test::exact_engine_config(256);
  wcfg.cache.remote = tier;
  auto rcfg = wcfg;
  rcfg.cache.time = clock;
  rcfg.cache.remote_timeout_s = 2.0;
  runtime::engine writer(w, wcfg), cold(w, test::exact_engine_config(256));
  auto shared = test::random_tokens(96, 41);
  run_one(writer, shared);
  auto waiting_prompt = shared;
  waiting_prompt.push_back(7);
  auto other_prompt = test::random_tokens(70, 42);  // nothing of it in the tier
  auto ref_waiting = run_one(cold, waiting_prompt);
  auto ref_other = run_one(cold, other_prompt);

  tier->hold = true;
  {
    runtime::engine reader(w, rcfg);
    auto waiting = reader.add_request(waiting_prompt, greedy(6));
    auto other = reader.add_request(other_prompt, greedy(6));
    REQUIRE(waiting);
    REQUIRE(other);
    std::map<int64_t, std::vector<runtime::token_event>> events;
    auto step = [&] {
      for (auto& ev : reader.step()) events[ev.id.value].push_back(ev);
    };
    for (int i = 0; i < 100 && (events[other->value].empty() || !events[other->value].back().finished); ++i) step();
    // The other request finished while the first one's read is still out.
    REQUIRE(!events[other->value].empty());
    CHECK(events[other->value].back().finished);
    CHECK(events[waiting->value].empty());
    CHECK(reader.stats().waiting_for_remote == 1);
    CHECK(reader.has_work());
    step();
    CHECK(reader.stalled());  // nothing to compute: the caller polls later, it does not spin
    REQUIRE(events[other->value].size() == ref_other.size());
    for (size_t i = 0; i < ref_other.size(); ++i) CHECK(events[other->value][i].logits == ref_other[i].logits);

    clock->advance(2.5);  // past the deadline: it recomputes
    for (int i = 0; i < 100 && reader.has_work(); ++i) step();
    REQUIRE(events[waiting->value].size() == ref_waiting.size());
    for (size_t i = 0; i < ref_waiting.size(); ++i) CHECK(events[waiting->value][i].logits == ref_waiting[i].logits);
    auto st = reader.stats();
    CHECK(st.cache.remote_timeouts == 1);
    CHECK(st.cache.remote_hit_tokens == 0);
    CHECK(reader.cached_tokens(*waiting) == 0);
    // The late read still holds the blocks it was given until the tier lets go of them.
    CHECK(st.blocks_free < st.blocks_total);
    CHECK(reader.has_work());
    tier->release();
    step();
    CHECK(reader.stats().blocks_free == reader.stats().blocks_total);
    CHECK(reader.stats().waiting_for_remote == 0);
    CHECK(!reader.has_work());
  }
}

TEST_CASE("remote tier: each request asks the tier once, also when admission is refused and retried") {
  auto w = test::tiny_model("v3-tiny");
  auto tier = std::make_shared<memory_tier>();
  auto cfg = test::exact_engine_config(256);
  cfg.cache.remote = tier;
  cfg.sched.token_budget = 40;  // one prompt per step: the others are refused and retried
  runtime::engine reader(w, cfg);
  std::vector<std::vector<int32_t>> prompts;
  for (uint32_t i = 0; i < 4; ++i) prompts.push_back(test::random_tokens(36, 60 + i));
  for (const auto& p : prompts) REQUIRE(reader.add_request(p, greedy(3)));
  reader.run_to_completion();
  CHECK(tier->lookups == prompts.size());
  CHECK(reader.stats().cache.remote_lookups == prompts.size());
  CHECK(reader.stats().cache.lookups >= prompts.size());
}

TEST_CASE("remote tier: a request aborted while its read is out frees its blocks once the tier lets go") {
  auto w = test::tiny_model("v3-tiny");
  auto tier = std::make_shared<memory_tier>();
  auto cfg = test::exact_engine_config(64);
  cfg.cache.remote = tier;
  runtime::engine writer(w, cfg);
  auto prompt = test::random_tokens(64, 77);
  run_one(writer, prompt);
  prompt.push_back(3);
  tier->hold = true;
  runtime::engine reader(w, cfg);
  auto id = reader.add_request(prompt, greedy(4));
  REQUIRE(id);
  CHECK(reader.step().empty());
  CHECK(reader.stats().waiting_for_remote == 1);
  CHECK(reader.abort(*id));
  CHECK(reader.stats().waiting_for_remote == 0);
  reader.step();
  CHECK(reader.has_work());  // the read still holds its blocks: the engine keeps polling it
  CHECK(reader.stalled());
  tier->release();
  CHECK(reader.stats().blocks_free < reader.stats().blocks_total);  // given back at the next poll
  reader.step();
  CHECK(reader.stats().blocks_free == reader.stats().blocks_total);
  CHECK(!reader.has_work());
}

// -- the SWA tier: other machines' slot stores ------------------------------------------------

namespace {

// Other machines' stores in memory: the deepest key any of them holds, its bytes copied;
// `hold` keeps every fetch unanswered (a holder that accepted and went quiet).
class other_stores final : public runtime::remote_swa {
 public:
  std::vector<std::shared_ptr<runtime::swa_store>> stores;
  bool hold = false;
  size_t asked = 0;
  std::vector<std::shared_ptr<runtime::slot_fetch>> held;

  std::shared_ptr<runtime::slot_fetch> start_fetch(std::vector<block_key> keys, size_t max_bytes) override {
    ++asked;
    auto f = std::make_shared<runtime::slot_fetch>();
    if (hold) {
      held.push_back(f);
      return f;
    }
    for (int64_t i = static_cast<int64_t>(keys.size()) - 1; i >= 0; --i)
      for (auto& s : stores) {
        std::vector<uint8_t> bytes;
        s->read(keys[static_cast<size_t>(i)], -1, [&](std::span<const uint8_t> b) { bytes.assign(b.begin(), b.end()); });
        if (bytes.size() > max_bytes) bytes.clear();
        if (!bytes.empty()) {
          f->complete(i, std::move(bytes));
          return f;
        }
      }
    f->complete(-1, {});
    return f;
  }
};

runtime::engine_config flash_config(bool exact) {
  auto c = test::exact_engine_config(256);
  c.cache.exact_swa = exact;
  return c;
}

}  // namespace

TEST_CASE("SWA store: fixed slots, LRU eviction, the change log and the full report") {
  runtime::swa_store s(2, 64);
  std::vector<uint8_t> a(64, 1), b(32, 2), c(64, 3);
  block_key k1{1, 1}, k2{2, 2}, k3{3, 3};
  s.put(k1, 16, a);
  s.put(k2, 16, b);
  auto ch = s.take_changes();
  CHECK(ch.added.size() == 2);
  CHECK(ch.evicted.empty());
  std::vector<uint8_t> got;
  CHECK(s.read(k1, 16, [&](std::span<const uint8_t> x) { got.assign(x.begin(), x.end()); }));  // k1 now most recent
  CHECK(got == a);
  CHECK_FALSE(s.read(k1, 32, [](std::span<const uint8_t>) {}));  // another position: a miss
  s.put(k3, 16, c);  // full: k2 (least recent) goes
  CHECK_FALSE(s.contains(k2));
  CHECK(s.contains(k1));
  ch = s.take_changes();
  REQUIRE(ch.evicted.size() == 1);
  CHECK(ch.evicted[0] == k2);
  REQUIRE(ch.added.size() == 1);
  CHECK(ch.added[0] == k3);
  auto keys = s.keys();
  CHECK(keys.size() == 2);
  CHECK(s.stats().evictions == 1);
  CHECK(s.stats().slots == 2);
  CHECK(s.memory().size() == 128);
}

TEST_CASE("SWA tier: a slot saved on another machine restores the window here, logits equal the colocated engine's") {
  for (bool exact : {true, false}) {
    CAPTURE(exact);
    auto w = test::tiny_model("tiny");
    auto tier = std::make_shared<memory_tier>();  // the blocks come from the storage tier
    auto others = std::make_shared<other_stores>();
    auto wcfg = flash_config(exact);
    wcfg.cache.remote = tier;
    runtime::engine writer(w, wcfg), colocated(w, flash_config(exact));
    others->stores.push_back(writer.slot_store());
    auto rcfg = wcfg;
    rcfg.cache.swa_remote = others;
    runtime::engine reader(w, rcfg);
    auto first = test::random_tokens(96, 71);
    run_one(writer, first);
    run_one(colocated, first);
    auto second = first;
    auto extra = test::random_tokens(60, 72);  // past the decoder tail: the hit can reach the slot
    second.insert(second.end(), extra.begin(), extra.end());
    auto ref = run_one(colocated, second);  // restores its own slot
    auto got = run_one(reader, second);     // fetches the writer's
    CHECK(colocated.stats().cache.swa_restores == 1);
    auto st = reader.stats().cache;
    CHECK(st.swa_lookups == 1);
    CHECK(st.swa_fetches == 1);
    CHECK(st.swa_restores == 1);
    CHECK(st.replays == 0);
    CHECK(st.hit_tokens > 0);
    CHECK(st.hit_tokens == colocated.stats().cache.hit_tokens);  // its first request had none
    REQUIRE(got.size() == ref.size());
    for (size_t i = 0; i < got.size(); ++i) {
      CHECK(got[i].token == ref[i].token);
      CHECK(got[i].logits == ref[i].logits);
    }
    CHECK(reader.swa_fetch_seconds().size() == 1);
  }
}

TEST_CASE("SWA tier: a holder that never answers delays only its request, which falls back at its deadline") {
  auto w = test::tiny_model("tiny");
  auto tier = std::make_shared<memory_tier>();
  auto others = std::make_shared<other_stores>();
  auto clock = std::make_shared<runtime::manual_clock>();
  auto wcfg = flash_config(false);
  wcfg.cache.remote = tier;
  runtime::engine writer(w, wcfg), cold(w, flash_config(false));
  others->stores.push_back(writer.slot_store());
  auto shared = test::random_tokens(96, 81);
  run_one(writer, shared);
  auto waiting_prompt = shared;
  for (int32_t t : test::random_tokens(40, 83)) waiting_prompt.push_back(t);  // past the decoder tail
  auto other_prompt = test::random_tokens(70, 82);
  // The reference: the same hit on an engine with the blocks and no slot (bounded replay).
  auto rcfg = wcfg;
  rcfg.cache.swa_remote = others;
  rcfg.cache.time = clock;
  rcfg.cache.swa_timeout_s = 2.0;
  auto replay_cfg = wcfg;
  runtime::engine replayer(w, replay_cfg);
  auto ref_waiting = run_one(replayer, waiting_prompt);
  CHECK(replayer.stats().cache.replays == 1);
  auto ref_other = run_one(cold, other_prompt);

  others->hold = true;
  runtime::engine reader(w, rcfg);
  auto waiting = reader.add_request(waiting_prompt, greedy(6));
  auto other = reader.add_request(other_prompt, greedy(6));
  REQUIRE(waiting);
  REQUIRE(other);
  std::map<int64_t, std::vector<runtime::token_event>> events;
  auto step = [&] {
    for (auto& ev : reader.step()) events[ev.id.value].push_back(ev);
  };
  for (int i = 0; i < 100 && (events[other->value].empty() || !events[other->value].back().finished); ++i) step();
  REQUIRE(!events[other->value].empty());
  CHECK(events[other->value].back().finished);
  CHECK(events[waiting->value].empty());
  CHECK(reader.stats().waiting_for_remote == 1);
  clock->advance(2.5);
  for (int i = 0; i < 100 && reader.has_work(); ++i) step();
  REQUIRE(events[waiting->value].size() == ref_waiting.size());
  for (size_t i = 0; i < ref_waiting.size(); ++i) CHECK(events[waiting->value][i].logits == ref_waiting[i].logits);
  REQUIRE(events[other->value].size() == ref_other.size());
  auto st = reader.stats().cache;
  CHECK(st.swa_fetch_timeouts == 1);
  CHECK(st.replays == 1);
  CHECK(st.swa_fetches == 0);
  CHECK(!reader.has_work());
  for (auto& f : others->held) f->complete(-1, {}, "late");  // the holder lets go
}
