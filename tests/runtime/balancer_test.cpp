// The balancer policies on hand-made states: prefill tiers (boundaries, reassignment by
// demand share, hand-computed), earliest predicted finish with prefix locality, the
// baselines' rules, ties and engine death; the decode balancer's two dimensions (short →
// few requests even with long caches, long → small cache), round-robin, balance ratio.
#include <doctest/doctest.h>

#include <vector>

#include "runtime/placement/decode_placement.hpp"
#include "runtime/placement/prefill_balancer.hpp"

using namespace shoal;
using namespace shoal::runtime;

namespace {

const cost_model per_token(0, 0.001, 0, 0);  // 1 ms per computed token

prefill_request req(int64_t id, int64_t tokens, std::vector<block_key> keys = {}) {
  return {request_id(id), tokens, std::move(keys)};
}

std::vector<block_key> keys(uint64_t base, int n) {
  std::vector<block_key> k;
  for (int i = 0; i < n; ++i) k.push_back({base + static_cast<uint64_t>(i), base});
  return k;
}

std::map<int64_t, int32_t> tiers_of(const prefill_balancer& b) {
  std::map<int64_t, int32_t> out;
  for (const auto& e : b.engines()) out[e.engine.value] = e.tier;
  return out;
}

std::vector<engine_id> ids(std::initializer_list<int64_t> values) {
  std::vector<engine_id> out;
  for (int64_t v : values) out.emplace_back(v);
  return out;
}

// assign_tiers keyed by the ids' values.
std::map<int64_t, int32_t> tiers(std::vector<double> demand, const std::vector<engine_id>& engines) {
  std::map<int64_t, int32_t> out;
  for (auto [e, t] : prefill_balancer::assign_tiers(demand, engines)) out[e.value] = t;
  return out;
}

}  // namespace

TEST_CASE("prefill balancer: tier boundaries") {
  prefill_balancer b;
  CHECK(b.tiers() == 4);
  CHECK(b.tier_of(0) == 0);
  CHECK(b.tier_of(16 * 1024 - 1) == 0);
  CHECK(b.tier_of(16 * 1024) == 1);
  CHECK(b.tier_of(64 * 1024 - 1) == 1);
  CHECK(b.tier_of(64 * 1024) == 2);
  CHECK(b.tier_of(256 * 1024) == 3);
  CHECK(b.tier_of(1 << 30) == 3);
  prefill_balancer_config c;
  c.tier_bounds = {100};
  prefill_balancer two(c);
  CHECK(two.tiers() == 2);
  CHECK(two.tier_of(99) == 0);
  CHECK(two.tier_of(100) == 1);
}

TEST_CASE("prefill balancer: engines reassigned to tiers by demand share (hand-computed)") {
  const auto e4 = ids({10, 11, 12, 13}), e3 = ids({10, 11, 12}), e2 = ids({10, 11});
  using m = std::map<int64_t, int32_t>;
  // quotas 3, 1
  CHECK(tiers(std::vector<double>{3, 1, 0, 0}, e4) == m{{10, 0}, {11, 0}, {12, 0}, {13, 1}});
  // quotas 0.4, 3.6: floors 1 (a tier with demand keeps one), 3
  CHECK(tiers(std::vector<double>{1, 0, 0, 9}, e4) == m{{10, 0}, {11, 3}, {12, 3}, {13, 3}});
  // quotas 1.5, 1.5 of 3: floors 1, 1, the remainder tie goes to the lower tier
  CHECK(tiers(std::vector<double>{5, 5, 0, 0}, e3) == m{{10, 0}, {11, 0}, {12, 1}});
  // quotas 0.04, 0.04, 3.92: floors of one overshoot (1 + 1 + 3 = 5 > 4): the most seated tier gives one back
  CHECK(tiers(std::vector<double>{0.1, 0.1, 0, 9.8}, e4) ==
        m{{10, 0}, {11, 1}, {12, 3}, {13, 3}});
  // fewer engines than tiers with demand, or no demand: every engine serves every tier
  CHECK(tiers(std::vector<double>{1, 1, 1, 0}, e2) == m{{10, -1}, {11, -1}});
  CHECK(tiers(std::vector<double>{0, 0, 0, 0}, e2) == m{{10, -1}, {11, -1}});

  // Through place(): a 10 s round with 3 short prompts (50 tokens, 0.05 s each) and one long
  // (1000 tokens, 1 s): shares 0.13 / 0.87 of 4 engines → 1 short engine, 3 long ones.
  prefill_balancer_config c;
  c.tier_bounds = {100};
  c.round_s = 10;
  prefill_balancer b(c);
  for (engine_id e : e4) b.add_engine(e, per_token);
  for (int i = 0; i < 3; ++i) REQUIRE(b.place(req(i, 50), 0.0));
  REQUIRE(b.place(req(3, 1000), 0.0));
  CHECK(tiers_of(b) == m{{10, -1}, {11, -1}, {12, -1}, {13, -1}});  // before the first round ends: untiered
  for (int i = 0; i < 4; ++i) b.done(request_id(i), 5.0);
  REQUIRE(b.place(req(4, 40), 10.0));  // the round ends at this placement
  CHECK(tiers_of(b) == m{{10, 0}, {11, 1}, {12, 1}, {13, 1}});
  // Short prompts go to the one short engine even when it is busy; long ones to the others.
  CHECK(b.place(req(5, 40), 10.0)->value == 10);
  CHECK(b.place(req(6, 40), 10.0)->value == 10);
  CHECK(b.place(req(7, 500), 10.0)->value == 11);
  CHECK(b.place(req(8, 500), 10.0)->value == 12);
}

TEST_CASE("prefill balancer: earliest predicted finish with prefix locality, ties to the lower id") {
  prefill_balancer_config c;
  c.policy = prefill_policy::untiered;
  c.block_size = 16;
  prefill_balancer b(c);
  b.add_engine(engine_id{1}, per_token);
  b.add_engine(engine_id{2}, per_token);
  auto prefix = keys(100, 4);  // 64 tokens
  CHECK(b.place(req(1, 80, prefix), 0.0)->value == 1);  // tie (both idle, nothing cached): the lower id
  CHECK(b.engines()[0].busy_until_s == doctest::Approx(0.080));
  CHECK(b.place(req(2, 80), 0.0)->value == 2);  // engine 1 busy until 0.08
  b.done(request_id(1), 0.1);
  b.done(request_id(2), 0.1);
  // Both idle at 0.2: the prompt sharing the prefix costs 16 tokens on engine 1, 80 on 2.
  auto longer = prefix;
  longer.push_back({999, 1});
  CHECK(b.cached_tokens(req(3, 80, longer), engine_id{1}) == 64);
  CHECK(b.predicted_s(req(3, 80, longer), engine_id{1}) == doctest::Approx(0.016));
  CHECK(b.place(req(3, 80, longer), 0.2)->value == 1);
  // Locality is worth its saved compute, no more: engine 1 is busy until 0.216, so a prompt
  // of 80 with the prefix finishes there at 0.232, on idle engine 2 at 0.280 → 1. A prompt of
  // 200 without it: 0.432 on engine 1, 0.400 on engine 2 → 2. Then 300 with the prefix:
  // 0.232 + 0.236 = 0.468 on engine 1, 0.4 + 0.3 = 0.7 on engine 2 → 1.
  CHECK(b.place(req(4, 80, prefix), 0.2)->value == 1);
  CHECK(b.place(req(5, 200), 0.2)->value == 2);
  CHECK(b.place(req(6, 300, prefix), 0.2)->value == 1);
  // A cached prefix never covers the whole prompt: one token is computed.
  CHECK(b.cached_tokens(req(7, 64, prefix), engine_id{1}) == 63);
}

TEST_CASE("prefill balancer: an engine's death returns its requests in placement order, it gets nothing more") {
  prefill_balancer_config c;
  c.policy = prefill_policy::round_robin;
  prefill_balancer b(c);
  for (int64_t e : {1, 2, 3}) b.add_engine(engine_id{e}, per_token);
  std::vector<int64_t> got;
  for (int i = 0; i < 6; ++i) got.push_back(b.place(req(i, 10), 0.0)->value);
  CHECK(got == std::vector<int64_t>{1, 2, 3, 1, 2, 3});
  b.done(request_id(1), 0.1);
  auto lost = b.remove_engine(engine_id{2});
  CHECK(lost == std::vector<request_id>{request_id(4)});
  for (int i = 10; i < 14; ++i) CHECK(b.place(req(i, 10), 0.2)->value != 2);
  CHECK(b.engines().size() == 2);
  b.remove_engine(engine_id{1});
  b.remove_engine(engine_id{3});
  CHECK_FALSE(b.place(req(20, 10), 0.3));
}

TEST_CASE("prefill balancer baselines: least requests, SGLang cache-aware, Dynamo's cost") {
  SUBCASE("least requests") {
    prefill_balancer_config c;
    c.policy = prefill_policy::least_requests;
    prefill_balancer b(c);
    for (int64_t e : {1, 2}) b.add_engine(engine_id{e}, per_token);
    CHECK(b.place(req(1, 10), 0)->value == 1);
    CHECK(b.place(req(2, 10), 0)->value == 2);
    CHECK(b.place(req(3, 10), 0)->value == 1);
    b.done(request_id(2), 0);
    CHECK(b.place(req(4, 10), 0)->value == 2);
  }
  SUBCASE("cache-aware") {
    prefill_balancer_config c;
    c.policy = prefill_policy::cache_aware;
    c.block_size = 16;
    c.balance_abs = 2;
    prefill_balancer b(c);
    for (int64_t e : {1, 2}) b.add_engine(engine_id{e}, per_token);
    CHECK(b.place(req(1, 64, keys(1, 4)), 0)->value == 1);  // no match: the fewest indexed blocks (tie: lower id)
    CHECK(b.place(req(2, 64, keys(50, 4)), 0)->value == 2);  // no match: engine 2 indexes fewer blocks
    // 48 of 64 tokens cached on engine 1 (> 0.3): there, although both are equally loaded.
    auto k = keys(1, 3);
    k.push_back({777, 7});
    CHECK(b.place(req(3, 64, k), 0)->value == 1);
    // 16 of 100 (< 0.3): the smaller index (engine 2: 4 blocks vs 5).
    CHECK(b.place(req(4, 100, keys(1, 1)), 0)->value == 2);
    // Once the in-flight counts differ by more than balance_abs (2) and by more than 1.5×:
    // the least loaded engine, cache or not.
    for (int i = 1; i <= 4; ++i) b.done(request_id(i), 0);
    CHECK(b.place(req(10, 64, keys(1, 4)), 0)->value == 1);  // 0 vs 0
    CHECK(b.place(req(11, 64, keys(1, 4)), 0)->value == 1);  // 1 vs 0
    CHECK(b.place(req(12, 64, keys(1, 4)), 0)->value == 1);  // 2 vs 0: a difference of 2 is not more than 2
    CHECK(b.place(req(13, 64, keys(1, 4)), 0)->value == 2);  // 3 vs 0: imbalanced
  }
  SUBCASE("dynamo") {
    prefill_balancer_config c;
    c.policy = prefill_policy::dynamo;
    c.block_size = 16;
    prefill_balancer b(c);
    for (int64_t e : {1, 2}) b.add_engine(engine_id{e}, per_token);
    CHECK(b.place(req(1, 64, keys(1, 4)), 0)->value == 1);  // cost 64 on both: the lower id
    // Engine 1: max(64 + 64 − 63, 0) + 4 blocks = 69; engine 2: 64 → 2.
    CHECK(b.place(req(2, 64, keys(1, 4)), 0)->value == 2);
    b.done(request_id(1), 0);
    b.done(request_id(2), 0);
    // Both idle and both indexed the prefix: the cost ties, the lower id.
    CHECK(b.place(req(3, 64, keys(1, 4)), 0)->value == 1);
  }
  CHECK(prefill_policy_named("cache_aware") == prefill_policy::cache_aware);
  CHECK_FALSE(prefill_policy_named("random"));
}

TEST_CASE("decode balancer: short requests to few-request engines with long caches, long ones to small caches") {
  decode_balancer p;
  std::vector<decode_candidate> es = {
    {engine_id{0}, 10, 1000, 1000, false},   // many short requests, small cache
    {engine_id{1}, 2, 20000, 1000, false},   // few long requests, long cache
  };
  decode_ask short_req{100, 0, 1}, long_req{8000, 0, 1};
  CHECK(p.choose(short_req, es, {})->value == 1);
  CHECK(p.choose(long_req, es, {})->value == 0);
  // The score by hand for the short one: R̄ = 6.5, K̄ = 10550.
  CHECK(decode_balancer::score(es[0], 100, 1 / 6.5, 1 / 10550.0) == doctest::Approx(21 / 42.25 + 210000 / (10550.0 * 10550)));
  // Ties: equal engines → the lower id; refused, draining or full engines are skipped.
  std::vector<decode_candidate> same = {
    {engine_id{3}, 1, 100, 10, false},
    {engine_id{4}, 1, 100, 10, false},
    {engine_id{5}, 0, 0, 0, false}};
  CHECK(p.choose(short_req, same, {})->value == 3);
  CHECK(p.choose(short_req, same, ids({3}))->value == 4);
  same[1].draining = true;
  CHECK_FALSE(p.choose(short_req, same, ids({3})));  // 5 has no free block
  // Kept placing, it evens out both dimensions.
  std::vector<decode_candidate> grow = {
    {engine_id{0}, 0, 0, 1 << 20, false},
    {engine_id{1}, 0, 0, 1 << 20, false},
    {engine_id{2}, 0, 0, 1 << 20, false}};
  for (int i = 0; i < 300; ++i) {
    decode_ask a{i % 10 == 0 ? 4000 : 200, 0, 1};
    auto e = p.choose(a, grow, {})->value;
    grow[static_cast<size_t>(e)].running += 1;
    grow[static_cast<size_t>(e)].kv_tokens += decode_balancer::cache_tokens(a);
  }
  std::vector<double> r, k;
  for (auto& g : grow) r.push_back(static_cast<double>(g.running)), k.push_back(static_cast<double>(g.kv_tokens));
  CHECK(balance_ratio(r) > 0.95);
  CHECK(balance_ratio(k) > 0.95);
}

TEST_CASE("decode placements: round-robin, least requests, balance ratio, names") {
  round_robin_placement rr;
  std::vector<decode_candidate> es = {
    {engine_id{0}, 5, 0, 10, false},
    {engine_id{1}, 0, 0, 0, false},
    {engine_id{2}, 9, 0, 10, false}};
  decode_ask a{10, 0, 1};
  CHECK(rr.choose(a, es, {})->value == 0);
  CHECK(rr.choose(a, es, {})->value == 2);  // 1 has no room
  CHECK(rr.choose(a, es, {})->value == 0);
  least_loaded_placement ll;
  CHECK(ll.choose(a, es, {})->value == 0);
  CHECK(balance_ratio(std::vector<double>{1, 1, 1}) == 1.0);
  CHECK(balance_ratio(std::vector<double>{1, 3}) == doctest::Approx(2.0 / 3));
  CHECK(balance_ratio(std::vector<double>{}) == 1.0);
  CHECK(make_decode_placement("decode_balancer")->name() == "decode_balancer");
  CHECK(make_decode_placement("round_robin")->name() == "round_robin");
  CHECK(make_decode_placement("least_requests")->name() == "least_loaded");
  CHECK(make_decode_placement("x") == nullptr);
}

TEST_CASE("prefill balancer: excluded engines are skipped, a request placed again leaves its old engine") {
  prefill_balancer b({prefill_policy::untiered});
  for (int64_t e = 0; e < 3; ++e) b.add_engine(engine_id{e}, per_token);
  CHECK(b.place(req(1, 100), 0) == engine_id{0});
  const auto not0 = ids({0});
  CHECK(b.place(req(2, 100), 0, not0) == engine_id{1});  // engine 0 excluded (it failed the request)
  // Request 1 again, its engine excluded: it moves to engine 2 and leaves engine 0 empty.
  CHECK(b.place(req(1, 100), 0, not0) == engine_id{2});
  auto v = b.engines();
  CHECK(v[0].in_flight == 0);
  CHECK(v[1].in_flight == 1);
  CHECK(v[2].in_flight == 1);
  const auto all = ids({0, 1, 2});
  CHECK_FALSE(b.place(req(3, 100), 0, all));
  prefill_balancer rr({prefill_policy::round_robin});
  for (int64_t e = 0; e < 3; ++e) rr.add_engine(engine_id{e}, per_token);
  CHECK(rr.place(req(1, 10), 0) == engine_id{0});
  const auto not1 = ids({1});
  CHECK(rr.place(req(2, 10), 0, not1) == engine_id{2});  // the next in turn, skipping the excluded one
  CHECK(rr.place(req(3, 10), 0) == engine_id{0});
}

TEST_CASE("prefill balancer: equal finishes go to the engine whose EP group is quieter") {
  // Engines 0, 1 in group 0; 2, 3 in group 1. Engine 0 is busy far ahead; engines 1..3 idle.
  prefill_balancer b({prefill_policy::untiered});
  for (int64_t e = 0; e < 4; ++e) b.add_engine(engine_id{e}, per_token, e / 2);
  CHECK(b.place(req(1, 5000), 0) == engine_id{0});
  // Engines 1, 2 and 3 would all finish at 0.1 s; engine 1 steps in lockstep with busy engine
  // 0, so the request goes to engine 2 (then ids decide between 2 and 3).
  CHECK(b.place(req(2, 100), 0) == engine_id{2});
  // Engines 1 and 3 tie at 0.1 s (engine 2 is at 0.2 s); group 1 holds 100 tokens, group 0
  // 5000: engine 3.
  CHECK(b.place(req(3, 100), 0) == engine_id{3});
  CHECK(b.place(req(4, 100), 0) == engine_id{1});  // the only one left finishing at 0.1 s
}

TEST_CASE("decode placements: least KV, the decode balancer weighed by a decode step cost model") {
  std::vector<decode_candidate> es = {{engine_id{0}, 1, 9000, 100, false}, {engine_id{1}, 8, 1000, 100, false}};
  decode_ask ask{200, 0, 2};
  CHECK(least_kv_placement().choose(ask, es, {}) == engine_id{1});  // fewest KV tokens, though busiest
  // Weights: 20 ms per request, 1 µs per KV token (a CPU-like step: requests dominate).
  // Score(0) = 0.02²·3 + 1e-6²·(2·9000·200 + 200²) = 1.2e-3 + 3.64e-6; score(1) = 0.02²·17 + … ≫.
  decode_balancer heavy_requests(0.02, 1e-6);
  CHECK(heavy_requests.choose(ask, es, {}) == engine_id{0});
  // 1 µs per request, 1 ms per KV token (KV dominates): the small cache wins.
  decode_balancer heavy_kv(1e-6, 1e-3);
  CHECK(heavy_kv.choose(ask, es, {}) == engine_id{1});
  CHECK(decode_balancer::score(es[0], 200, 0.02, 1e-6) == doctest::Approx(0.0004 * 3 + 1e-12 * (2.0 * 9000 * 200 + 40000)));
  CHECK(make_decode_placement("least_kv")->name() == "least_kv");
  CHECK(make_decode_placement("decode_balancer", 0.02, 1e-6)->choose(ask, es, {}) == engine_id{0});
}
