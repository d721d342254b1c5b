// The placement agreement of a new expert-parallel group over caf_ep_transport: its frames go
// inline, and a rank answers a peer's agreement frame with its own again (marked as an answer,
// which is not answered), so a peer that dropped the first one (it arrived before that peer
// adopted the group) still agrees at once.
#include <doctest/doctest.h>

#include <future>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/after.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/rank_actor.hpp"

using namespace shoal;
using namespace std::chrono_literals;
using actors::caf_ep_transport;
using actors::ep_frame;
using runtime::ep_payloads;

namespace {

struct agreement_config : caf::actor_system_config {
  agreement_config() {
    actors::add_message_types(*this);
    set("scheduler.max-threads", size_t{2});
  }
};

// The next frame `peer` receives within `within`, if any.
std::optional<ep_frame> next_frame(caf::scoped_actor& peer, std::chrono::milliseconds within) {
  std::optional<ep_frame> out;
  peer->receive([&](expert_atom, const ep_frame& f) { out = f; }, caf::after(within) >> [] {});
  return out;
}

}  // namespace

TEST_CASE("caf_ep_transport: a peer's agreement frame is answered with this rank's again, a data frame is not") {
  agreement_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor peer{sys};
  caf_ep_transport t(10s);
  CHECK_FALSE(t.set_group(7, 0, {actors::rank_actor{}, caf::actor_cast<actors::rank_actor>(peer)}));

  auto pending = std::async(std::launch::async, [&] { return t.exchange(0, -1, 2, {{1}, {2, 3}}); });
  // The first send reaches the peer, which (not in the group yet) drops it.
  auto first = next_frame(peer, 10s);
  REQUIRE(first);
  CHECK(*first == ep_frame{7, 0, -1, 2, 0, {2, 3}, {}});
  // The peer agrees now: its frame completes the exchange and is answered with the same frame.
  t.deliver(ep_frame{7, 0, -1, 2, 1, {5}, {}});
  auto again = next_frame(peer, 10s);
  REQUIRE(again);
  ep_frame answer = *first;
  answer.phase = 3;  // marked as an answer
  CHECK(*again == answer);
  REQUIRE(pending.wait_for(10s) == std::future_status::ready);
  auto in = pending.get();
  REQUIRE(in);
  CHECK(*in == ep_payloads{{1}, {5}});
  // After the agreement ended here: a repeated one (the peer timed out and tries again) is answered too.
  t.deliver(ep_frame{7, 0, -1, 2, 1, {5}, {}});
  CHECK(next_frame(peer, 10s) == answer);
  // An answer is not answered (two ranks would echo each other forever).
  t.deliver(ep_frame{7, 0, -1, 3, 1, {5}, {}});
  CHECK_FALSE(next_frame(peer, 200ms));
  // Dispatch frames, and the agreement of a group this rank has not agreed in, get no answer.
  t.deliver(ep_frame{7, 0, 0, 0, 1, {6}, {}});
  CHECK_FALSE(next_frame(peer, 200ms));
  CHECK_FALSE(t.set_group(8, 0, {actors::rank_actor{}, caf::actor_cast<actors::rank_actor>(peer)}));
  t.deliver(ep_frame{8, 0, -1, 2, 1, {7}, {}});
  CHECK_FALSE(next_frame(peer, 200ms));
  // In group 8 the peer's answer is what completes this rank's agreement.
  CHECK_FALSE(t.set_group(9, 0, {actors::rank_actor{}, caf::actor_cast<actors::rank_actor>(peer)}));
  pending = std::async(std::launch::async, [&] { return t.exchange(0, -1, 2, {{8}, {9}}); });
  REQUIRE(next_frame(peer, 10s));
  t.deliver(ep_frame{9, 0, -1, 3, 1, {10}, {}});
  REQUIRE(pending.wait_for(10s) == std::future_status::ready);
  in = pending.get();
  REQUIRE(in);
  CHECK(*in == ep_payloads{{8}, {10}});
  CHECK_FALSE(next_frame(peer, 200ms));
}
