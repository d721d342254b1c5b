// Scheduler and cache manager as plain state machines on the tiny presets: exact block ids
// on admission and growth, prefix hits, chunk sizes from the fitted cost model under a step
// time budget, preemption order; and the SWA pool (snapshot sizes, MXFP8/fp32 storage, LRU).
#include <doctest/doctest.h>

#include <cmath>

#include "runtime/core/scheduler.hpp"
#include "tests/support/tiny_models.hpp"

using namespace shoal;
using namespace shoal::runtime;

namespace {

cache_config blocks(int64_t n) {
  cache_config c;
  c.num_blocks = n;
  return c;
}

scheduler_config budget(int64_t tokens) {
  scheduler_config c;
  c.token_budget = tokens;
  return c;
}

struct harness {
  model::model_config cfg;
  cache_manager caches;
  scheduler sched;
  std::vector<std::unique_ptr<request>> reqs;
  harness(const std::string& preset, cache_config cc, scheduler_config sc)
      : cfg(test::tiny_model(preset)->config), caches(cfg, cc), sched(sc, caches) {}
  request* add(size_t prompt_len, uint32_t seed) {
    auto r = std::make_unique<request>();
    r->id = request_id(static_cast<int64_t>(reqs.size()));
    r->tokens = test::random_tokens(prompt_len, seed);
    r->prompt_len = static_cast<int64_t>(prompt_len);
    r->params.max_tokens = 4;
    sched.add(r.get());
    reqs.push_back(std::move(r));
    return reqs.back().get();
  }
  // Applies a plan as the engine would, pretending the forward pass ran.
  void apply(const step_plan& p) {
    for (auto& it : p.items) {
      caches.attach(*it.req, it.new_blocks);
      it.req->cache.computed += it.n_tokens;
      if (it.req->computed() == it.req->num_tokens()) it.req->tokens.push_back(7);
      caches.commit(*it.req);
    }
    caches.pool().check_invariants();
  }
};

}  // namespace

TEST_CASE("admission takes exact block ids from the free list head, growth continues in order") {
  harness h("v3-tiny", blocks(8), budget(64));
  request* a = h.add(40, 1);  // 3 blocks of 16
  auto p = h.sched.plan({});
  REQUIRE(p.items.size() == 1);
  CHECK(p.items[0].n_tokens == 40);
  CHECK(p.items[0].new_blocks == std::vector<block_id>{block_id(0), block_id(1), block_id(2)});
  h.apply(p);
  CHECK(a->keys.size() == 2);  // 41 tokens: two full blocks keyed
  CHECK(h.caches.pool().key_of(block_id(1)).has_value());
  // decode positions 40 … 48: position 48 is the first of block 3
  for (int i = 0; i < 9; ++i) h.apply(h.sched.plan({}));
  CHECK(a->blocks.back() == block_id(3));
}

TEST_CASE("a second request with the same prefix hits the cached blocks") {
  harness h("v3-tiny", blocks(16), {});
  request* a = h.add(50, 2);
  h.apply(h.sched.plan({}));
  request* b = h.add(0, 0);
  b->tokens = std::vector<int32_t>(a->tokens.begin(), a->tokens.begin() + 40);
  b->tokens.push_back(99);
  b->prompt_len = 41;
  auto p = h.sched.plan({});
  for (auto& it : p.items)
    if (it.req == b) {
      CHECK(b->cached_tokens == 32);
      CHECK(it.n_tokens == 41 - 32);
      CHECK(b->blocks[0] == a->blocks[0]);
      CHECK(h.caches.pool().ref_count(a->blocks[0]) == 2);
    }
}

TEST_CASE("prefill chunks come from the cost model: largest chunk within the step time budget") {
  cost_model m;
  std::vector<cost_sample> s;
  for (int64_t n : {16, 64, 256, 1024})
    for (int64_t p : {0, 512, 2048}) s.push_back({n, p, 0.001 + 1e-5 * n + 1e-9 * n * p + 1e-8 * n * n});
  auto fitted = cost_model::fit(s);
  REQUIRE(fitted.has_value());
  scheduler_config sc;
  sc.cost = *fitted;
  sc.step_time_budget_s = 0.0031;  // 0.001 + 1e-5 n + 1e-8 n² = 0.0031 → n ≈ 190
  harness h("v3-tiny", blocks(64), sc);
  h.add(600, 3);
  auto p = h.sched.plan({});
  REQUIRE(p.items.size() == 1);
  int64_t n = p.items[0].n_tokens;
  CHECK(n == fitted->largest_chunk(0, 0.0031, 32768, 600));
  CHECK(n > 150);
  CHECK(n < 250);
  h.apply(p);
  auto p2 = h.sched.plan({});  // the next chunk sees the computed prefix p = n
  CHECK(p2.items[0].n_tokens == fitted->largest_chunk(n, 0.0031, 32768, 600 - n));
}

TEST_CASE("blocks running out preempt the newest running request, which resumes first") {
  harness h("v3-tiny", blocks(4), {});
  request* a = h.add(30, 4);  // 2 blocks
  request* b = h.add(30, 5);  // 2 blocks
  h.apply(h.sched.plan({}));
  CHECK(h.sched.running() == 2);
  // decode positions 30, 31, then 32: a (oldest) needs a 3rd block, b is preempted for it
  for (int i = 0; i < 3; ++i) h.apply(h.sched.plan({}));
  CHECK(b->status == request_status::waiting);
  CHECK(b->preemptions == 1);
  CHECK(b->blocks.empty());
  CHECK(h.sched.waiting_requests().front() == b);
  CHECK(a->status == request_status::running);
  CHECK(h.caches.stats().preemptions == 1);
}

TEST_CASE("a re-routed request with output queues ahead of new requests, behind preempted ones") {
  harness h("v3-tiny", blocks(4), budget(64));
  request* a = h.add(30, 4);
  request* b = h.add(30, 5);
  h.apply(h.sched.plan({}));
  for (int i = 0; i < 3; ++i) h.apply(h.sched.plan({}));
  REQUIRE(b->status == request_status::waiting);  // preempted (the test above)
  request* fresh = h.add(20, 6);
  auto r = std::make_unique<request>();
  r->id = request_id(99);
  r->tokens = test::random_tokens(12, 7);
  r->prompt_len = 9;
  r->resumed = 3;  // the client had 3 tokens when its engine failed
  r->params.max_tokens = 8;
  h.sched.add(r.get());
  const auto& w = h.sched.waiting_requests();
  REQUIRE(w.size() == 3);
  CHECK(w[0] == b);
  CHECK(w[1] == r.get());
  CHECK(w[2] == fresh);
  CHECK(a->status == request_status::running);
  h.sched.finish(r.get());
}

TEST_CASE("SWA pool: slot size as the mission states, MXFP8 and fp32 snapshots, LRU eviction") {
  // 20 layers × 134 tokens × (512 e4m3 values + 16 UE8M0 scales) = 1,415,040 bytes per sequence,
  // after the header naming the storage and shape.
  swa_pool full(1, 1, 20, 512, 134, swa_storage::mxfp8);
  CHECK(full.snapshot_bytes() == swa_header_bytes + 1415040);

  auto w = test::tiny_model("tiny");
  const auto& c = w->config;
  test::dense_cache dc(c, 4, c.window() + c.block_size);
  auto tokens = test::random_tokens(32, 6);
  model::forward_item it{&dc.cache, tokens, 0, 0, true, false, {}};
  model::forward(*w, std::span<model::forward_item>(&it, 1), {});
  for (auto storage : {swa_storage::fp32, swa_storage::mxfp8}) {
    swa_pool pool(4, 2, c.encoder_layers(), c.entry_dim(), c.window(), storage);
    block_key k1{1, 0}, k2{2, 0}, k3{3, 0};
    pool.save(k1, dc.cache, 32);
    test::dense_cache restored(c, 4, c.window() + c.block_size);
    REQUIRE(pool.restore(k1, restored.cache, 32));
    double max_err = 0, max_val = 0;
    std::vector<float> got(static_cast<size_t>(c.entry_dim() + 1)), want(got.size());
    for (int64_t s = 0; s < c.encoder_layers(); ++s)
      for (int64_t pos = 32 - c.window(); pos < 32; ++pos) {
        restored.cache.ring_read(s, pos, got.data());
        dc.cache.ring_read(s, pos, want.data());
        for (int64_t j = 0; j < c.entry_dim(); ++j) {
          max_err = std::max(max_err, double(std::fabs(got[j] - want[j])));
          max_val = std::max(max_val, double(std::fabs(want[j])));
        }
      }
    if (storage == swa_storage::fp32) CHECK(max_err == 0);
    // e4m3 keeps 3 mantissa bits (≤ 2^-4 relative); the OCP scale rule clips the top of a
    // block's binade to 448·2^s, at most 1/8 relative.
    else CHECK(max_err / max_val < 0.125);
    CHECK_FALSE(pool.restore(k1, restored.cache, 16));  // wrong position is a miss
    pool.save(k2, dc.cache, 32);
    pool.save(k3, dc.cache, 32);  // capacity 2: k1 (least recent) is evicted
    CHECK_FALSE(pool.contains(k1));
    CHECK(pool.contains(k2));
    CHECK(pool.stats().evictions == 1);
  }
}

TEST_CASE("SWA pool: a slot of another storage or shape is refused and counted, never restored") {
  auto w = test::tiny_model("tiny");
  const auto& c = w->config;
  test::dense_cache dc(c, 4, c.window() + c.block_size);
  auto tokens = test::random_tokens(32, 7);
  model::forward_item it{&dc.cache, tokens, 0, 0, true, false, {}};
  model::forward(*w, std::span<model::forward_item>(&it, 1), {});
  swa_pool fp32(4, 2, c.encoder_layers(), c.entry_dim(), c.window(), swa_storage::fp32);
  swa_pool mx(4, 2, c.encoder_layers(), c.entry_dim(), c.window(), swa_storage::mxfp8);
  swa_pool wider(4, 2, c.encoder_layers() + 1, c.entry_dim(), c.window(), swa_storage::mxfp8);
  const block_key k{9, 9};
  fp32.save(k, dc.cache, 32);
  mx.save(k, dc.cache, 32);
  auto bytes_of = [&](swa_pool& p) {
    std::vector<uint8_t> out;
    REQUIRE(p.store()->read(k, 32, [&](std::span<const uint8_t> b) { out.assign(b.begin(), b.end()); }));
    return out;
  };
  const auto from_fp32 = bytes_of(fp32), from_mx = bytes_of(mx);
  swa_pool reader(4, 2, c.encoder_layers(), c.entry_dim(), c.window(), swa_storage::mxfp8);
  CHECK_FALSE(reader.put_encoded(k, 32, from_fp32));  // another storage
  CHECK(reader.stats().shape_misses == 1);
  CHECK_FALSE(wider.put_encoded(k, 32, from_mx));     // another shape (one stream more)
  CHECK(wider.stats().shape_misses == 1);
  auto truncated = from_mx;
  truncated.pop_back();
  CHECK_FALSE(reader.put_encoded(k, 32, truncated));
  CHECK(reader.stats().shape_misses == 2);
  CHECK_FALSE(reader.contains(k));
  CHECK(reader.put_encoded(k, 32, from_mx));  // its own shape and storage
  test::dense_cache restored(c, 4, c.window() + c.block_size);
  CHECK(reader.restore(k, restored.cache, 32));
  CHECK(reader.stats().shape_misses == 2);
}

TEST_CASE("a plan made during a speculative step is fitted to the drafts accepted, and admits late arrivals") {
  harness h("v3-tiny", blocks(8), budget(64));
  request* a = h.add(40, 1);  // 3 blocks of 16
  h.apply(h.sched.plan({}));
  REQUIRE(a->computed() == 40);
  // In flight: its token at 40 and 8 drafts. Planned ahead as if none were accepted: one
  // decode at 41, within its 3 blocks.
  const std::vector<planned_item> in_flight{{a, 9, {}, 40, 8}};
  step_plan next = h.sched.plan(in_flight);
  REQUIRE(next.items.size() == 1);
  CHECK(next.items[0].n_tokens == 1);
  CHECK(next.items[0].new_blocks.empty());
  // Completed: all 8 accepted (positions 40 … 48, 9 tokens out); a late request arrives.
  a->cache.computed = 49;
  for (int i = 0; i < 9; ++i) a->tokens.push_back(7);
  request* b = h.add(20, 2);
  h.sched.refit(next);
  REQUIRE(next.items.size() == 2);
  CHECK(next.items[0].req == a);
  CHECK(next.items[0].new_blocks == std::vector<block_id>{block_id(3)});  // position 49 opens block 3
  CHECK(next.items[1].req == b);
  CHECK(next.items[1].n_tokens == 20);
  CHECK(next.tokens == 21);
  h.apply(next);
  // Blocks run out for what was accepted: the plan is given back whole and marked for a sync plan.
  REQUIRE(a->computed() == 50);
  REQUIRE(b->computed() == 20);
  const std::vector<planned_item> flight2{{a, 1, {}, 50, 0}, {b, 1, {}, 20, 0}};
  step_plan third = h.sched.plan(flight2);
  CHECK(third.items.size() == 2);
  a->cache.computed = 64;  // (as if a step had accepted 13 drafts: position 64 opens block 4)
  a->tokens.resize(65, 7);
  b->cache.computed = 21;
  b->tokens.push_back(7);
  const std::vector<block_id> hog = h.caches.take_blocks(h.caches.pool().num_free());
  h.sched.refit(third);
  CHECK(third.needs_sync);
  CHECK(third.items.empty());
  CHECK(h.caches.pool().num_free() == 0);
  h.caches.give_back(hog);
}
