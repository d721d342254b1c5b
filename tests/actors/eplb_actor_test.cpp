// Placements between processes: to_msg / to_placement round-trip, and a message from another
// process that does not describe a placement is an error naming what is wrong.
#include <doctest/doctest.h>

#include "actors/eplb_actor.hpp"

using namespace shoal;

TEST_CASE("eplb placement messages: round trip, bad lists are errors naming the fault") {
  const auto contiguous = runtime::ep_placement::contiguous(3, 8, 4);
  auto back = actors::to_placement(actors::to_msg(contiguous));
  REQUIRE(back.has_value());
  CHECK(back->same_experts(contiguous));
  CHECK(back->epoch() == 0);

  actors::placement_msg m{2, 1, 4, 2, {0, 3, 5}, {0, 1, 2, 2, 3}};  // expert 2 on both ranks
  auto two = actors::to_placement(m);
  REQUIRE(two.has_value());
  CHECK(two->epoch() == 2);
  CHECK(two->replicas(0, 2).size() == 2);

  auto expect = [](actors::placement_msg bad, const char* needle) {
    auto r = actors::to_placement(bad);
    REQUIRE_FALSE(r.has_value());
    CAPTURE(r.error());
    CHECK(r.error().find(needle) != std::string::npos);
  };
  auto bad = m;
  bad.offsets = {0, 3};
  expect(bad, "offsets (2) do not frame 5 experts in 2 lists");
  bad = m;
  bad.offsets = {0, 4, 3, 5};
  expect(bad, "offsets (4) do not frame");
  bad = m;
  bad.offsets = {0, 4, 3};
  bad.experts = {0, 1, 2};
  expect(bad, "offsets decrease at list 1");
  bad = m;
  bad.experts = {0, 1, 2, 2, 9};
  expect(bad, "expert 9 outside [0, 4)");
  bad = m;
  bad.experts = {1, 0, 2, 2, 3};
  expect(bad, "not strictly ascending");
  bad = m;
  bad.experts = {0, 1, 1, 2, 2};
  expect(bad, "not strictly ascending");
  bad = m;
  bad.experts = {0, 1, 2, 1, 2};
  expect(bad, "places no copy of expert 3");
  bad = m;
  bad.ranks = 0;
  expect(bad, "0 ranks");
  bad = m;
  bad.slots = -1;
  expect(bad, "-1 slots");
}
