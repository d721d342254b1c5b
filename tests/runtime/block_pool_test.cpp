// Tests for the prefix-caching block pool: exact allocation order, the free list as eviction
// order (reverse release, touch unlinking, eviction on allocate), canonical keys, reference
// counts and the xxh3-128 chain keys. Every mutation is followed by check_invariants().
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <numeric>
#include <vector>

#include "runtime/core/block_pool.hpp"

using shoal::block_id;
using namespace shoal::runtime;

namespace {

std::vector<int32_t> ids_of(const std::vector<block_id>& v) {
  std::vector<int32_t> out;
  for (const block_id b : v) out.push_back(b.value);
  return out;
}

std::vector<block_id> blocks(std::initializer_list<int32_t> ids) {
  std::vector<block_id> out;
  for (const int32_t i : ids) out.emplace_back(i);
  return out;
}

constexpr block_key key_a{1, 2};
constexpr block_key key_b{3, 4};
constexpr block_key key_c{5, 6};

}  // namespace

TEST_CASE("block_pool: initial state is all blocks free in id order") {
  block_pool pool(5);
  pool.check_invariants();
  CHECK(pool.num_blocks() == 5);
  CHECK(pool.num_free() == 5);
  CHECK(ids_of(pool.free_list()) == std::vector<int32_t>{0, 1, 2, 3, 4});
  CHECK(pool.can_allocate(5));
  CHECK_FALSE(pool.can_allocate(6));
  CHECK(pool.evictions() == 0);
  for (int32_t b = 0; b < 5; ++b) {
    CHECK(pool.ref_count(block_id{b}) == 0);
    CHECK_FALSE(pool.key_of(block_id{b}).has_value());
  }
}

TEST_CASE("block_pool: allocate pops exact ids from the head with ref 1") {
  block_pool pool(6);
  const auto a = pool.allocate(2);
  pool.check_invariants();
  CHECK(ids_of(a) == std::vector<int32_t>{0, 1});
  const auto b = pool.allocate(3);
  pool.check_invariants();
  CHECK(ids_of(b) == std::vector<int32_t>{2, 3, 4});
  CHECK(pool.num_free() == 1);
  CHECK(ids_of(pool.free_list()) == std::vector<int32_t>{5});
  for (int32_t i = 0; i < 5; ++i) CHECK(pool.ref_count(block_id{i}) == 1);
  CHECK(pool.ref_count(block_id{5}) == 0);
  CHECK(pool.allocate(0).empty());
  pool.check_invariants();
}

TEST_CASE("block_pool: release appends to the tail in the given order") {
  block_pool pool(6);
  const auto seq = pool.allocate(4);  // 0 1 2 3 ; free: 4 5
  pool.check_invariants();
  // Engines release a sequence in reverse so its tail is evicted first.
  const auto rev = blocks({3, 2, 1, 0});
  pool.release(rev);
  pool.check_invariants();
  CHECK(ids_of(pool.free_list()) == std::vector<int32_t>{4, 5, 3, 2, 1, 0});
  CHECK(pool.num_free() == 6);
  // The next allocation follows the free list exactly.
  const auto next = pool.allocate(4);
  pool.check_invariants();
  CHECK(ids_of(next) == std::vector<int32_t>{4, 5, 3, 2});
  CHECK(ids_of(pool.free_list()) == std::vector<int32_t>{1, 0});
}

TEST_CASE("block_pool: reference counts with shared blocks") {
  block_pool pool(4);
  const auto a = pool.allocate(2);  // 0 1
  pool.check_invariants();
  pool.cache_block(a[0], key_a);
  pool.check_invariants();
  // A second sequence shares block 0.
  const auto shared = blocks({0});
  pool.touch(shared);
  pool.check_invariants();
  CHECK(pool.ref_count(block_id{0}) == 2);
  pool.release(shared);
  pool.check_invariants();
  CHECK(pool.ref_count(block_id{0}) == 1);
  CHECK(ids_of(pool.free_list()) == std::vector<int32_t>{2, 3});  // still held once
  pool.release(shared);
  pool.check_invariants();
  CHECK(pool.ref_count(block_id{0}) == 0);
  CHECK(ids_of(pool.free_list()) == std::vector<int32_t>{2, 3, 0});
  // The released block keeps its key and can still be hit.
  REQUIRE(pool.lookup(key_a).has_value());
  CHECK(pool.lookup(key_a)->value == 0);
  CHECK(pool.key_of(block_id{0}) == key_a);
}

TEST_CASE("block_pool: allocate evicts a cached free block and forgets its key") {
  block_pool pool(3);
  const auto a = pool.allocate(3);  // 0 1 2
  pool.check_invariants();
  pool.cache_block(a[0], key_a);
  pool.check_invariants();
  pool.cache_block(a[1], key_b);
  pool.check_invariants();
  pool.release(blocks({0}));  // free: 0
  pool.check_invariants();
  pool.release(blocks({1}));  // free: 0 1
  pool.check_invariants();
  CHECK(pool.lookup(key_a).has_value());
  CHECK(pool.lookup(key_b).has_value());
  const auto got = pool.allocate(1);
  pool.check_invariants();
  CHECK(ids_of(got) == std::vector<int32_t>{0});
  CHECK(pool.evictions() == 1);
  CHECK_FALSE(pool.lookup(key_a).has_value());
  CHECK_FALSE(pool.key_of(block_id{0}).has_value());
  CHECK(pool.ref_count(block_id{0}) == 1);
  // The other cached block is untouched.
  REQUIRE(pool.lookup(key_b).has_value());
  CHECK(pool.lookup(key_b)->value == 1);
  // Allocating an uncached block does not count as an eviction.
  pool.release(blocks({2}));  // free: 1 2
  pool.check_invariants();
  const auto more = pool.allocate(2);
  pool.check_invariants();
  CHECK(ids_of(more) == std::vector<int32_t>{1, 2});
  CHECK(pool.evictions() == 2);
  CHECK_FALSE(pool.lookup(key_b).has_value());
}

TEST_CASE("block_pool: touch of a ref-0 cached block removes it from the free list") {
  block_pool pool(4);
  const auto a = pool.allocate(2);  // 0 1 ; free: 2 3
  pool.check_invariants();
  pool.cache_block(a[0], key_a);
  pool.check_invariants();
  pool.cache_block(a[1], key_b);
  pool.check_invariants();
  pool.release(blocks({1, 0}));  // free: 2 3 1 0
  pool.check_invariants();
  CHECK(ids_of(pool.free_list()) == std::vector<int32_t>{2, 3, 1, 0});
  const auto hit = pool.lookup(key_b);
  REQUIRE(hit.has_value());
  const std::array<block_id, 1> touched{*hit};
  pool.touch(touched);
  pool.check_invariants();
  CHECK(pool.ref_count(*hit) == 1);
  CHECK(pool.num_free() == 3);
  CHECK(ids_of(pool.free_list()) == std::vector<int32_t>{2, 3, 0});
  // A held block is never handed out, even when the rest is evicted.
  const auto rest = pool.allocate(3);
  pool.check_invariants();
  CHECK(ids_of(rest) == std::vector<int32_t>{2, 3, 0});
  CHECK(pool.lookup(key_b).has_value());
  CHECK_FALSE(pool.lookup(key_a).has_value());
  CHECK_FALSE(pool.can_allocate(1));
  // Releasing it again puts it at the tail.
  pool.release(touched);
  pool.check_invariants();
  CHECK(ids_of(pool.free_list()) == std::vector<int32_t>{1});
}

TEST_CASE("block_pool: cache_block on an existing key keeps the first block") {
  block_pool pool(3);
  const auto a = pool.allocate(2);  // 0 1
  pool.check_invariants();
  pool.cache_block(a[0], key_a);
  pool.check_invariants();
  pool.cache_block(a[1], key_a);  // duplicate content computed by another sequence
  pool.check_invariants();
  REQUIRE(pool.lookup(key_a).has_value());
  CHECK(pool.lookup(key_a)->value == 0);
  CHECK(pool.key_of(a[0]) == key_a);
  CHECK_FALSE(pool.key_of(a[1]).has_value());
  // Caching the same block with its own key again is a no-op.
  pool.cache_block(a[0], key_a);
  pool.check_invariants();
  // The duplicate can still be cached under a different key.
  pool.cache_block(a[1], key_c);
  pool.check_invariants();
  CHECK(pool.lookup(key_c)->value == 1);
  // Once the canonical block is evicted, the key can go to another block.
  pool.release(blocks({0}));  // free: 2 0
  pool.check_invariants();
  const auto b = pool.allocate(2);  // 2, then 0 (evicts key_a)
  pool.check_invariants();
  CHECK(ids_of(b) == std::vector<int32_t>{2, 0});
  CHECK_FALSE(pool.lookup(key_a).has_value());
  pool.cache_block(b[0], key_a);
  pool.check_invariants();
  CHECK(pool.lookup(key_a)->value == 2);
}

TEST_CASE("block_pool: a full engine-style cycle keeps the shared head cached longest") {
  // Two sequences share block-key prefix {a}; the pool has room for 4 blocks.
  block_pool pool(4);
  auto s1 = pool.allocate(3);  // 0 1 2
  pool.check_invariants();
  pool.cache_block(s1[0], key_a);
  pool.check_invariants();
  pool.cache_block(s1[1], key_b);
  pool.check_invariants();
  pool.cache_block(s1[2], key_c);
  pool.check_invariants();
  std::vector<block_id> rev(s1.rbegin(), s1.rend());
  pool.release(rev);
  pool.check_invariants();
  CHECK(ids_of(pool.free_list()) == std::vector<int32_t>{3, 2, 1, 0});
  // A new unrelated sequence of 3 blocks evicts c and b but not the head a.
  const auto s2 = pool.allocate(3);
  pool.check_invariants();
  CHECK(ids_of(s2) == std::vector<int32_t>{3, 2, 1});
  CHECK(pool.evictions() == 2);
  CHECK(pool.lookup(key_a).has_value());
  CHECK_FALSE(pool.lookup(key_b).has_value());
  CHECK_FALSE(pool.lookup(key_c).has_value());
}

TEST_CASE("chain_key: deterministic and sensitive to tokens, prev and extra") {
  const std::vector<int32_t> t1{1, 2, 3, 4};
  const std::vector<int32_t> t2{1, 2, 3, 5};
  const std::vector<uint8_t> e1{7};
  const std::vector<uint8_t> e2{8};
  const block_key zero{};
  const block_key k = chain_key(zero, t1);
  CHECK(k == chain_key(zero, t1));
  CHECK(k == chain_key(zero, t1, {}));
  CHECK_FALSE(k == block_key{});
  CHECK_FALSE(k == chain_key(zero, t2));                 // different tokens
  CHECK_FALSE(k == chain_key(block_key{1, 0}, t1));      // different prev.lo
  CHECK_FALSE(k == chain_key(block_key{0, 1}, t1));      // different prev.hi
  CHECK_FALSE(k == chain_key(zero, t1, e1));             // extra keys
  CHECK_FALSE(chain_key(zero, t1, e1) == chain_key(zero, t1, e2));
  CHECK(chain_key(zero, t1, e1) == chain_key(zero, t1, e1));
  // Token order matters, and the token count is part of the bytes.
  const std::vector<int32_t> t3{2, 1, 3, 4};
  CHECK_FALSE(k == chain_key(zero, t3));
  const std::vector<int32_t> t4{1, 2, 3};
  CHECK_FALSE(k == chain_key(zero, t4));
}

TEST_CASE("chain_keys: one chained key per full block") {
  std::vector<int32_t> tokens(10);
  std::iota(tokens.begin(), tokens.end(), 100);
  const std::span<const int32_t> all(tokens);
  CHECK(chain_keys(all, 4).size() == 2);  // floor(10 / 4)
  CHECK(chain_keys(all, 5).size() == 2);
  CHECK(chain_keys(all, 3).size() == 3);
  CHECK(chain_keys(all, 11).empty());
  CHECK(chain_keys(all, 1).size() == 10);
  CHECK(chain_keys(all.first(0), 4).empty());

  const auto keys = chain_keys(all, 4);
  const block_key k0 = chain_key(block_key{}, all.subspan(0, 4));
  const block_key k1 = chain_key(k0, all.subspan(4, 4));
  CHECK(keys[0] == k0);
  CHECK(keys[1] == k1);
  // The partial tail does not affect the keys of full blocks.
  CHECK(chain_keys(all.first(8), 4) == keys);
  // A change in block 0 changes every later key (prefix chaining).
  std::vector<int32_t> other = tokens;
  other[0] = -1;
  const auto okeys = chain_keys(std::span<const int32_t>(other), 4);
  CHECK_FALSE(okeys[0] == keys[0]);
  CHECK_FALSE(okeys[1] == keys[1]);
  // A change in block 1 leaves block 0's key alone.
  other = tokens;
  other[5] = -1;
  const auto pkeys = chain_keys(std::span<const int32_t>(other), 4);
  CHECK(pkeys[0] == keys[0]);
  CHECK_FALSE(pkeys[1] == keys[1]);
  // Extra keys apply to every block.
  const std::vector<uint8_t> extra{42};
  const auto ekeys = chain_keys(all, 4, extra);
  CHECK(ekeys[0] == chain_key(block_key{}, all.subspan(0, 4), extra));
  CHECK(ekeys[1] == chain_key(ekeys[0], all.subspan(4, 4), extra));
  CHECK_FALSE(ekeys[0] == keys[0]);
}
