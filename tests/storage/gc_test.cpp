// GC of the chunk store with a fake clock: exact eviction order for a scripted sequence of puts and
// reads, the low-watermark stop, leased chunks skipped, counters, and the background worker.
#include "storage/gc.hpp"

#include <doctest/doctest.h>

#include <thread>

#include "tests/storage/store_fixture.hpp"

using namespace shoal::storage;
using namespace shoal::storage::test;

namespace {

// Keys with a readable order: key(i) < key(j) iff i < j.
chunk_key k(uint64_t i) { return chunk_key{{.lo = i, .hi = 0}, 0}; }

void put100(chunk_store& s, uint64_t i) {
  REQUIRE(s.put(k(i), payload_of(k(i), 0, 100), traffic_class::agent));
}

}  // namespace

TEST_CASE("eviction order is last read then put time then key") {
  temp_dir d;
  fake_clock c;
  auto s = open_ok(options_for(d, c, 10'000));
  // t=0: 5 and 3 (same ms), t=10: 1, t=20: 4, t=30: 2.
  put100(*s, 5);
  put100(*s, 3);
  c.advance(10);
  put100(*s, 1);
  c.advance(10);
  put100(*s, 4);
  c.advance(10);
  put100(*s, 2);
  CHECK(s->eviction_order() == std::vector{k(3), k(5), k(1), k(4), k(2)});
  // t=40: read 3, t=50: read 1 (and a miss, which changes nothing); exists is not a read.
  c.advance(10);
  REQUIRE(s->get(k(3)));
  c.advance(10);
  REQUIRE(s->get(k(1)));
  CHECK_FALSE(s->get(k(9)));
  CHECK(s->exists(std::vector{k(5)})[0]);
  CHECK(s->eviction_order() == std::vector{k(5), k(4), k(2), k(3), k(1)});
  // Two chunks read in the same ms: older put first (4 at t=20 before 2 at t=30).
  c.advance(10);
  REQUIRE(s->get(k(2)));
  REQUIRE(s->get(k(4)));
  CHECK(s->eviction_order() == std::vector{k(5), k(3), k(1), k(4), k(2)});
  s->check_invariants();
}

TEST_CASE("run_gc evicts in order until below the low watermark and skips leases") {
  temp_dir d;
  fake_clock c;
  auto s = open_ok(options_for(d, c, 1000));  // high 900, low 700
  for (uint64_t i = 1; i <= 9; ++i) {
    put100(*s, i);
    c.advance(1);
  }
  CHECK(s->usage_bytes() == 900);
  CHECK(s->run_gc() == 0);  // 900 is not over 900
  CHECK(s->stats().gc_runs == 0);
  REQUIRE(s->get(k(1)));  // 1 becomes most recent
  c.advance(1);
  REQUIRE(s->remove(k(9)));
  put100(*s, 10);
  CHECK(s->usage_bytes() == 900);
  // Manual put past high (950 > 900) with a 50-byte chunk.
  REQUIRE(s->put(k(11), payload_of(k(11), 0, 50), traffic_class::chat));
  CHECK(s->over_high_watermark());
  {
    const auto l3 = s->acquire(k(3));  // leased: skipped, keeps its place
    // Order: 2 3 4 5 6 7 8 1 10 11. Need 950 → ≤ 700: evict 2, (skip 3), 4, 5 → 650.
    CHECK(s->run_gc() == 3);
    CHECK(s->exists(std::vector{k(2), k(3), k(4), k(5), k(6)}) ==
          std::vector<bool>{false, true, false, false, true});
    CHECK(s->eviction_order() == std::vector{k(3), k(6), k(7), k(8), k(1), k(10), k(11)});
  }
  const auto st = s->stats();
  CHECK(st.usage_bytes == 650);
  CHECK(st.gc_runs == 1);
  CHECK(st.evicted_chunks == 3);
  CHECK(st.evicted_bytes == 300);
  CHECK(s->run_gc() == 0);
  CHECK(s->stats().gc_runs == 1);
  s->check_invariants();
}

TEST_CASE("gc with everything leased evicts nothing") {
  temp_dir d;
  fake_clock c;
  auto s = open_ok(options_for(d, c, 1000));
  std::vector<lease> leases;
  for (uint64_t i = 1; i <= 10; ++i) {
    put100(*s, i);
    leases.push_back(s->acquire(k(i)));
  }
  CHECK(s->run_gc() == 0);
  CHECK(s->stats().gc_runs == 1);
  CHECK(s->usage_bytes() == 1000);
  leases.clear();
  CHECK(s->run_gc() == 3);
  CHECK(s->usage_bytes() == 700);
}

TEST_CASE("background gc worker brings usage under the low watermark") {
  temp_dir d;
  fake_clock c;
  auto o = options_for(d, c, 1000);
  o.sync = sync_policy::never;
  auto s = open_ok(o);
  for (uint64_t i = 1; i <= 10; ++i) put100(*s, i);
  gc_worker w(*s, std::chrono::milliseconds(3'600'000));
  w.start();
  w.wake();
  for (int i = 0; i < 2000 && w.passes() == 0; ++i)  // bounded wait, no fixed sleep assumption
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  w.stop();
  CHECK(w.passes() >= 1);
  CHECK(s->usage_bytes() == 700);
  CHECK(s->stats().evicted_chunks == 3);
  s->check_invariants();
}
