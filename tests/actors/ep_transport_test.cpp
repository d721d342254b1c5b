// caf_ep_transport, the expert-parallel frames between rank actors: joins of steps a peer began,
// formations (frames of a formation left behind never mix with the current one; a peer's new
// formation makes this rank form the group anew), interrupts and timeouts, and the placement
// agreement of a new group: its frames go inline, and a rank answers a peer's agreement frame
// with its own again (marked as an answer, which is not answered), so a peer that dropped the
// first one (it arrived before that peer adopted the group) still agrees at once.
#include <doctest/doctest.h>

#include <future>
#include <optional>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/after.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include "actors/rank_actor.hpp"

using namespace shoal;
using namespace std::chrono_literals;
using actors::caf_ep_transport;
using actors::ep_frame;
using runtime::ep_payloads;

namespace {

struct local_config : caf::actor_system_config {
  local_config() {
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
  local_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor peer{sys};
  caf_ep_transport t(10s);
  CHECK_FALSE(t.set_group(7, 0, {actors::rank_actor{}, caf::actor_cast<actors::rank_actor>(peer)}));

  auto pending = std::async(std::launch::async, [&] { return t.exchange(0, -1, 2, {{1}, {2, 3}}); });
  // The first send reaches the peer, which (not in the group yet) drops it.
  auto first = next_frame(peer, 10s);
  REQUIRE(first);
  CHECK(*first == ep_frame{7, 0, -1, 2, 0, {2, 3}, {}, 1});
  // The peer agrees now: its frame completes the exchange and is answered with the same frame.
  t.deliver(ep_frame{7, 0, -1, 2, 1, {5}, {}, 1});
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
  t.deliver(ep_frame{7, 0, -1, 2, 1, {5}, {}, 1});
  CHECK(next_frame(peer, 10s) == answer);
  // An answer is not answered (two ranks would echo each other forever).
  t.deliver(ep_frame{7, 0, -1, 3, 1, {5}, {}, 1});
  CHECK_FALSE(next_frame(peer, 200ms));
  // Dispatch frames, and the agreement of a group this rank has not agreed in, get no answer.
  t.deliver(ep_frame{7, 0, 0, 0, 1, {6}, {}, 1});
  CHECK_FALSE(next_frame(peer, 200ms));
  CHECK_FALSE(t.set_group(8, 0, {actors::rank_actor{}, caf::actor_cast<actors::rank_actor>(peer)}));
  t.deliver(ep_frame{8, 0, -1, 2, 1, {7}, {}, 2});
  CHECK_FALSE(next_frame(peer, 200ms));
  // In group 8 the peer's answer is what completes this rank's agreement.
  CHECK_FALSE(t.set_group(9, 0, {actors::rank_actor{}, caf::actor_cast<actors::rank_actor>(peer)}));
  pending = std::async(std::launch::async, [&] { return t.exchange(0, -1, 2, {{8}, {9}}); });
  REQUIRE(next_frame(peer, 10s));
  t.deliver(ep_frame{9, 0, -1, 3, 1, {10}, {}, 3});
  REQUIRE(pending.wait_for(10s) == std::future_status::ready);
  in = pending.get();
  REQUIRE(in);
  CHECK(*in == ep_payloads{{8}, {10}});
  CHECK_FALSE(next_frame(peer, 200ms));
}

namespace {

// A one-byte frame of `group` at `formation`.
ep_frame frame(uint64_t group, uint64_t formation, uint64_t step, int32_t slot, int32_t phase, int32_t source,
               uint8_t byte) {
  return {group, step, slot, phase, source, {byte}, {}, formation};
}

// A group of `n` ranks whose peers are no actors: sends go nowhere.
std::vector<actors::rank_actor> nobody(size_t n) { return std::vector<actors::rank_actor>(n); }

using arrival = caf_ep_transport::arrival;

}  // namespace

TEST_CASE("caf_ep_transport: a frame of an unbegun step asks for one join, frames of formations left behind are "
          "dropped, later ones kept") {
  caf_ep_transport t(10s);
  CHECK(t.group() == 0);
  CHECK(t.size() == 0);
  CHECK_FALSE(t.set_group(100, 1, nobody(2)));
  CHECK(t.group() == 100);
  CHECK(t.formation() == 1);
  CHECK(t.size() == 2);

  CHECK(t.deliver(frame(100, 1, 0, 0, 0, 0, 1)) == arrival::join);  // step 0 not begun here: join it
  CHECK(t.deliver(frame(100, 1, 0, 1, 0, 0, 2)) == arrival::none);  // the same step: asked already
  CHECK(t.deliver(frame(100, 1, 1, 0, 0, 0, 3)) == arrival::join);  // the next step: join again

  // Rank 1 runs step 0, slot 0: rank 0's frame is waiting, its own payload stays local.
  auto in = t.exchange(0, 0, 0, {{9}, {10}});
  REQUIRE(in);
  CHECK(*in == ep_payloads{{1}, {10}});
  in = t.exchange(1, 0, 0, {{11}, {12}});
  REQUIRE(in);
  CHECK(*in == ep_payloads{{3}, {12}});
  CHECK(t.deliver(frame(100, 1, 1, 1, 0, 0, 4)) == arrival::none);  // step 1 begun here: no join
  CHECK(t.deliver(frame(100, 1, 2, 0, 0, 0, 5)) == arrival::join);

  CHECK(t.deliver(frame(300, 3, 0, 0, 0, 0, 6)) == arrival::none);  // a later formation of another group: kept
  CHECK_FALSE(t.set_group(200, 0, nobody(2)));                      // formation 2; nothing of 200 waiting
  CHECK(t.formation() == 2);
  CHECK(t.deliver(frame(100, 1, 3, 0, 0, 1, 7)) == arrival::none);  // formation 1, left: dropped
  CHECK(t.deliver(frame(200, 2, 0, 0, 0, 1, 8)) == arrival::join);

  CHECK(t.set_group(300, 1, nobody(2)));  // its peers formed it at 3, their frame waits: step to join it
  CHECK(t.formation() == 3);
  CHECK(t.deliver(frame(300, 3, 0, 1, 0, 0, 9)) == arrival::none);  // the join of step 0 counts as asked
  in = t.exchange(0, 0, 0, {{20}, {21}});
  REQUIRE(in);
  CHECK(*in == ep_payloads{{6}, {21}});

  // The same members again (a process cut off and back): group 100 once more, a new formation.
  // A frame its peer sent in formation 1 and that arrives only now is not taken for this one,
  // and asks no join (its step, 9, would hide the joins of steps 0 to 9).
  CHECK_FALSE(t.set_group(100, 1, nobody(2)));
  CHECK(t.formation() == 4);
  CHECK(t.deliver(frame(100, 1, 9, 0, 0, 0, 10)) == arrival::none);
  CHECK(t.deliver(frame(100, 4, 0, 0, 0, 0, 11)) == arrival::join);
  in = t.exchange(0, 0, 0, {{22}, {23}});
  REQUIRE(in);
  CHECK(*in == ep_payloads{{11}, {23}});

  // The peer saw the group leave and come back, this rank did not: the peer's frames of its new
  // formation (6) make this rank form the group anew too, at 6; meanwhile its exchanges fail.
  CHECK(t.deliver(frame(100, 6, 0, -1, 2, 0, 12)) == arrival::reform);
  CHECK(t.deliver(frame(100, 6, 0, 0, 0, 0, 13)) == arrival::none);  // asked once
  auto failed = t.exchange(1, 0, 0, {{}, {}});
  REQUIRE_FALSE(failed);
  CHECK(failed.error().find("rank 0 formed the group anew (formation 6, this rank's 4)") != std::string::npos);
  CHECK(t.set_group(100, 1, nobody(2)));  // the re-formation: at the peer's number, its frames waiting
  CHECK(t.formation() == 6);
  in = t.exchange(0, -1, 2, {{30}, {31}});  // the group's agreement
  REQUIRE(in);
  CHECK(*in == ep_payloads{{12}, {31}});
  in = t.exchange(0, 0, 0, {{32}, {33}});
  REQUIRE(in);
  CHECK(*in == ep_payloads{{13}, {33}});
}

TEST_CASE("caf_ep_transport: interrupt makes a blocked exchange on another thread fail at once") {
  local_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor peer{sys};
  caf_ep_transport t(60s);
  CHECK_FALSE(t.set_group(7, 0, {actors::rank_actor{}, caf::actor_cast<actors::rank_actor>(peer)}));

  auto pending = std::async(std::launch::async, [&] { return t.exchange(3, 1, 0, {{1}, {2, 3}}); });
  // Rank 1 got its frame: the exchange is waiting (or about to) for rank 1's.
  bool sent = false;
  peer->receive([&](expert_atom, const ep_frame& f) { sent = f == ep_frame{7, 3, 1, 0, 0, {2, 3}, {}, 1}; },
                caf::after(10s) >> [] {});
  CHECK(sent);
  t.interrupt("expert-parallel group changed (now 1 ranks)");
  REQUIRE(pending.wait_for(10s) == std::future_status::ready);  // not the 60 s timeout
  auto result = pending.get();
  REQUIRE_FALSE(result);
  CHECK(result.error() == "expert-parallel group changed (now 1 ranks)");

  // Until the next group: exchanges fail at once, frames ask for no join.
  auto again = t.exchange(4, 0, 0, {{}, {}});
  REQUIRE_FALSE(again);
  CHECK(again.error() == "expert-parallel group changed (now 1 ranks)");
  CHECK(t.deliver(frame(7, 1, 9, 0, 0, 1, 1)) == arrival::none);
  CHECK_FALSE(t.set_group(8, 0, nobody(2)));
  CHECK(t.deliver(frame(8, 2, 0, 0, 0, 1, 2)) == arrival::join);
}

TEST_CASE("caf_ep_transport: an exchange times out naming the missing ranks, a group of one needs no peer") {
  caf_ep_transport t(150ms);
  auto alone = t.exchange(0, 0, 0, {{1, 2, 3}});  // before any group: a group of itself
  REQUIRE(alone);
  CHECK(*alone == ep_payloads{{1, 2, 3}});
  auto wrong = t.exchange(1, 0, 0, {{1}, {2}});
  REQUIRE_FALSE(wrong);
  CHECK(wrong.error() == "exchange: 2 payloads for a group of 0");

  CHECK_FALSE(t.set_group(5, 0, nobody(1)));  // a group of one, named by its rank actor
  alone = t.exchange(0, 2, 1, {{4}});
  REQUIRE(alone);
  CHECK(*alone == ep_payloads{{4}});

  CHECK_FALSE(t.set_group(9, 1, nobody(3)));
  CHECK(t.deliver(frame(9, 2, 0, 2, 1, 0, 4)) == arrival::join);  // rank 0's frame is there, rank 2's never comes
  auto late = t.exchange(0, 2, 1, {{}, {}, {}});
  REQUIRE_FALSE(late);
  CHECK(late.error() == "expert-parallel exchange timed out after 150 ms waiting for rank(s) 2 (step 0, slot 2)");
  late = t.exchange(1, 0, 0, {{}, {}, {}});
  REQUIRE_FALSE(late);
  CHECK(late.error() == "expert-parallel exchange timed out after 150 ms waiting for rank(s) 0, 2 (step 1, slot 0)");
}

TEST_CASE("caf_ep_transport: a peer still in an earlier formation is told this one's number once, and such a notice "
          "makes a rank form the group anew") {
  local_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor peer{sys};
  caf_ep_transport t(10s);
  const std::vector<actors::rank_actor> ranks{actors::rank_actor{}, caf::actor_cast<actors::rank_actor>(peer)};
  CHECK_FALSE(t.set_group(7, 0, ranks));  // formation 1
  CHECK_FALSE(t.set_group(8, 0, ranks));  // 2
  CHECK_FALSE(t.set_group(7, 0, ranks));  // 3: the same members once more; the peer never saw them part
  CHECK(t.deliver(frame(7, 1, 5, 0, 0, 1, 1)) == arrival::none);  // dropped, and the peer is told
  auto notice = next_frame(peer, 10s);
  REQUIRE(notice);
  CHECK(*notice == ep_frame{7, 0, -2, 0, 0, {}, {}, 3});
  CHECK(t.deliver(frame(7, 1, 6, 0, 0, 1, 2)) == arrival::none);
  CHECK_FALSE(next_frame(peer, 200ms));  // told once per formation

  // The other way round: a notice of formation 5 makes this rank form the group anew, at 5.
  CHECK(t.deliver(ep_frame{7, 0, -2, 0, 1, {}, {}, 5}) == arrival::reform);
  auto failed = t.exchange(0, 0, 0, {{}, {}});
  REQUIRE_FALSE(failed);
  CHECK(failed.error().find("formed the group anew (formation 5, this rank's 3)") != std::string::npos);
  CHECK_FALSE(t.set_group(7, 0, ranks));  // a notice is not kept: nothing waits
  CHECK(t.formation() == 5);
  // A notice is never answered, not even one of an earlier formation.
  CHECK(t.deliver(ep_frame{7, 0, -2, 0, 1, {}, {}, 4}) == arrival::none);
  CHECK_FALSE(next_frame(peer, 200ms));
  // The peer's frames of formation 5 count.
  CHECK(t.deliver(frame(7, 5, 0, 0, 0, 1, 3)) == arrival::join);
}
