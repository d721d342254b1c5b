// Named fault points: plans parse and print, bad plans are errors naming the item, a seed
// gives the same injections, the rate follows the probability, nothing fires without a plan.
#include <doctest/doctest.h>

#include <fstream>
#include <vector>

#include "runtime/base/fault_points.hpp"
#include "runtime/config/node_config.hpp"

using namespace shoal::runtime;

TEST_CASE("fault plan: parse, print and parse again") {
  auto p = fault_plan::parse(" seed=7, storage_read=0.25 ,kv_handoff=1,swa_fetch=0");
  REQUIRE_MESSAGE(p, p.error());
  CHECK(p->seed == 7);
  CHECK((*p)[fault_point::storage_read] == 0.25);
  CHECK((*p)[fault_point::kv_handoff] == 1.0);
  CHECK((*p)[fault_point::disk_full] == 0.0);
  CHECK(p->any());
  auto q = fault_plan::parse(p->to_string());
  REQUIRE(q);
  CHECK(q->seed == 7);
  CHECK(q->probability == p->probability);
  CHECK(!fault_plan::parse("")->any());
  for (size_t i = 0; i < fault_point_count; ++i) {
    const auto point = static_cast<fault_point>(i);
    CHECK(fault_point_named(fault_point_name(point)) == point);
  }
}

TEST_CASE("fault plan: bad plans name what is wrong") {
  auto unknown = fault_plan::parse("seed=1,storage_raed=0.1");
  REQUIRE(!unknown);
  CHECK(unknown.error().find("unknown fault point 'storage_raed'") != std::string::npos);
  CHECK(unknown.error().find("storage_read") != std::string::npos);  // the known names are listed
  auto range = fault_plan::parse("disk_full=1.5");
  REQUIRE(!range);
  CHECK(range.error().find("disk_full") != std::string::npos);
  CHECK(range.error().find("[0, 1]") != std::string::npos);
  CHECK(!fault_plan::parse("disk_full=-0.1"));
  CHECK(!fault_plan::parse("disk_full=nan"));
  CHECK(fault_plan::parse("kv_handoff").error().find("name=value") != std::string::npos);
  CHECK(fault_plan::parse("seed=x").error().find("seed 'x'") != std::string::npos);
  CHECK(!fault_plan::parse("seed=-1"));
  CHECK(fault_plan::parse("message_dup=0.5"));  // the simulator's plan
  CHECK(fault_plan::parse("message_dup=0.5", true).error().find("simulator only") != std::string::npos);
}

TEST_CASE("fault injector: the same seed injects at the same visits, the rate follows the probability") {
  fault_plan plan;
  plan.seed = 42;
  plan[fault_point::kv_handoff] = 0.1;
  fault_injector a(plan), b(plan);
  plan.seed = 43;
  fault_injector c(plan);
  std::vector<bool> fa, fb, fc;
  for (int i = 0; i < 20000; ++i) {
    fa.push_back(a.fire(fault_point::kv_handoff));
    fb.push_back(b.fire(fault_point::kv_handoff));
    fc.push_back(c.fire(fault_point::kv_handoff));
    CHECK(!a.fire(fault_point::storage_read));  // probability 0: never
  }
  CHECK(fa == fb);
  CHECK(fa != fc);
  CHECK(a.visits(fault_point::kv_handoff) == 20000);
  const double rate = static_cast<double>(a.fired(fault_point::kv_handoff)) / 20000.0;
  CHECK(rate > 0.09);
  CHECK(rate < 0.11);
  // uniform() draws from another stream: it moves no fire decision.
  fault_injector d(fault_plan{42, plan.probability});
  for (int i = 0; i < 100; ++i) {
    const double u = d.uniform(fault_point::kv_handoff);
    CHECK(u >= 0.0);
    CHECK(u < 1.0);
  }
  std::vector<bool> fd;
  for (int i = 0; i < 20000; ++i) fd.push_back(d.fire(fault_point::kv_handoff));
  CHECK(fd == fa);
}

TEST_CASE("fault injection is off unless a plan is installed, and an empty plan removes it") {
  install_faults({});
  CHECK(process_faults() == nullptr);
  CHECK(!inject(fault_point::disk_full));
  fault_plan plan;
  plan[fault_point::disk_full] = 1.0;
  install_faults(plan);
  REQUIRE(process_faults() != nullptr);
  CHECK(inject(fault_point::disk_full));
  CHECK(!inject(fault_point::storage_write));
  install_faults({});
  CHECK(!inject(fault_point::disk_full));
}
