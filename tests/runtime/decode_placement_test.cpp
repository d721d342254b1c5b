// The least-loaded decode placement: exact choices, ties, room, refusals and draining.
#include <doctest/doctest.h>

#include <vector>

#include "runtime/placement/decode_placement.hpp"

using namespace shoal::runtime;
using shoal::engine_id;

TEST_CASE("least_loaded_placement: fewest running with room, ties by free blocks then index, refusals skipped") {
  least_loaded_placement p;
  CHECK(p.name() == "least_loaded");
  std::vector<decode_candidate> engines = {{engine_id{0}, 3, 900, 50, false},
                                           {engine_id{1}, 1, 100, 10, false},
                                           {engine_id{2}, 1, 300, 40, false},
                                           {engine_id{3}, 0, 0, 4, false},
                                           {engine_id{4}, 0, 0, 99, true}};
  decode_ask ask{64, 16, 8};
  // 3 has too few blocks, 4 drains; 1 and 2 tie on running: 2 has more free blocks.
  CHECK(p.choose(ask, engines, {}) == engine_id{2});
  std::vector<engine_id> refused = {engine_id{2}};
  CHECK(p.choose(ask, engines, refused) == engine_id{1});
  refused = {engine_id{2}, engine_id{1}};
  CHECK(p.choose(ask, engines, refused) == engine_id{0});
  refused = {engine_id{2}, engine_id{1}, engine_id{0}};
  CHECK(p.choose(ask, engines, refused) == std::nullopt);  // the prefill engine decodes it
  ask.blocks_needed = 4;
  CHECK(p.choose(ask, engines, refused) == engine_id{3});
  // Equal load and room: the lowest index, whatever the order given.
  std::vector<decode_candidate> same = {
    {engine_id{7}, 2, 0, 20, false}, {engine_id{5}, 2, 0, 20, false}, {engine_id{6}, 2, 0, 20, false}};
  CHECK(p.choose(ask, same, {}) == engine_id{5});
  CHECK(p.choose(ask, {}, {}) == std::nullopt);
}
