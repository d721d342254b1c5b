#include "runtime/placement/ve_balancer.hpp"

#include <doctest/doctest.h>

using shoal::runtime::ve_balancer;

TEST_CASE("ve balancer: least patches queued, ties by fewer jobs then lower id") {
  ve_balancer b;
  CHECK_FALSE(b.place(0, 10).has_value());  // no worker
  b.add_worker(2);
  b.add_worker(1);
  CHECK(b.place(0, 256) == 1);  // tie on 0 patches, 0 jobs: lower id
  CHECK(b.place(1, 64) == 2);
  CHECK(b.place(2, 64) == 2);   // 2 has 64 < 256
  CHECK(b.place(3, 16) == 2);   // 128 < 256
  CHECK(b.place(4, 16) == 2);   // 144 < 256
  auto loads = b.loads();
  REQUIRE(loads.size() == 2);
  CHECK(loads[0].worker == 1);
  CHECK(loads[0].patches == 256);
  CHECK(loads[1].patches == 160);
  CHECK(loads[1].jobs == 4);
  b.done(0);
  CHECK(b.place(5, 100) == 1);  // 1 is empty again
  CHECK(b.loads()[0].completed == 1);
  // patches tie, jobs differ
  ve_balancer t;
  t.add_worker(0);
  t.add_worker(1);
  CHECK(t.place(0, 0) == 0);
  CHECK(t.place(1, 0) == 1);  // same patches (0), fewer jobs
}

TEST_CASE("ve balancer: a dead worker's jobs come back to be placed on the others") {
  ve_balancer b;
  b.add_worker(0);
  b.add_worker(1);
  REQUIRE(b.place(10, 50) == 0);
  REQUIRE(b.place(11, 50) == 1);
  REQUIRE(b.place(12, 10) == 0);  // 50 patches each: fewer jobs? equal too: the lower id
  REQUIRE(b.place(13, 10) == 1);  // 60 against 50
  auto back = b.remove_worker(0);
  CHECK(back == std::vector<int64_t>{10, 12});
  CHECK_FALSE(b.worker_of(10).has_value());
  for (int64_t j : back) CHECK(b.place(j, j == 10 ? 50 : 10) == 1);
  CHECK(b.loads().size() == 1);
  CHECK(b.loads()[0].patches == 120);
  CHECK(b.loads()[0].jobs == 4);
  // the last worker gone: nothing takes jobs, nothing is lost from the table silently
  back = b.remove_worker(1);
  CHECK(back.size() == 4);
  CHECK_FALSE(b.place(10, 50).has_value());
}

TEST_CASE("ve balancer: draining, exclusion and moving a placed job") {
  ve_balancer b;
  b.add_worker(0);
  REQUIRE(b.place(1, 30) == 0);
  CHECK(b.drain_worker(0).empty());  // nobody else: its jobs stay
  CHECK(b.worker_of(1) == 0);
  CHECK_FALSE(b.place(2, 5).has_value());
  b.add_worker(1);
  CHECK(b.place(2, 5) == 1);
  b.add_worker(2);
  auto back = b.drain_worker(0);  // now others take jobs: give back job 1
  CHECK(back == std::vector<int64_t>{1});
  CHECK(b.loads()[0].given_back == 1);
  CHECK(b.loads()[0].patches == 0);
  const int64_t excl[] = {2};
  CHECK(b.place(1, 30, excl) == 1);
  CHECK(b.place(1, 30) == 2);  // moved: 1 has 5 + 30, 2 has 0
  auto loads = b.loads();
  CHECK(loads[1].patches == 5);
  CHECK(loads[1].given_back == 1);
  CHECK(loads[2].patches == 30);
  b.add_worker(0);  // rejoins: takes jobs again
  CHECK(b.place(3, 1) == 0);
}
