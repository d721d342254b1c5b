// Cluster actors: the plain state behind the node agent (membership_table), the balancers
// (prefill_routing, decode_routing) and expert parallelism (ep_group_of; caf_ep_transport in
// ep_transport_test.cpp) tested directly, then node agents and expert-parallel engines in two actor systems of this process
// connected over loopback, as two shoald processes would be. Every wait is bounded.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <caf/actor_registry.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/after.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/io/basp_broker.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/publish.hpp>
#include <caf/io/remote_actor.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include "actors/engine_actor.hpp"
#include "actors/interfaces.hpp"
#include "actors/node_agent_actor.hpp"
#include "actors/rank_actor.hpp"
#include "actors/balancer_actors.hpp"
#include "tests/support/tiny_models.hpp"

using namespace shoal;
using namespace std::chrono_literals;
using actors::caf_ep_transport;
using actors::membership;
using actors::node_info;
using actors::rank_info;
using runtime::ep_payloads;

namespace {

using strings = std::vector<std::string>;

struct local_config : caf::actor_system_config {
  local_config() {
    actors::add_message_types(*this);
    set("scheduler.max-threads", size_t{2});
  }
};

// Two of these in one process talk over loopback like two shoald processes. Short heartbeats
// so that a lost connection is noticed within the tests' bounded waits.
struct net_config : caf::actor_system_config {
  net_config() {
    load<caf::io::middleman>();
    actors::add_message_types(*this);
    set("scheduler.max-threads", size_t{2});
    set("middleman.heartbeat-interval", caf::timespan{100ms});
    set("middleman.connection-timeout", caf::timespan{2s});
  }
};

caf::behavior idle(caf::event_based_actor*) {
  return {[](caf::ok_atom) {}};
}

// Exits `actors` when it goes (before the systems they live in: declare it after them).
struct stop_on_exit {
  std::vector<caf::actor> actors;
  ~stop_on_exit() {
    for (auto& a : actors) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }
};

// A local actor system and `n` idle actors whose handles stand in for engines, ranks, agents.
struct handles {
  local_config cfg;
  caf::actor_system sys{cfg};
  stop_on_exit a;
  explicit handles(int n) {
    for (int i = 0; i < n; ++i) a.actors.push_back(sys.spawn(idle));
  }
  const caf::actor& operator[](size_t i) const { return a.actors.at(i); }
};

// A node whose ranks have rank actors is in expert-parallel group "both" (engine.ep_group's
// default for colocated engines).
node_info make_node(std::string name, strings roles, caf::actor agent, std::vector<rank_info> ranks = {},
                    bool draining = false) {
  const bool ep = std::any_of(ranks.begin(), ranks.end(), [](const rank_info& r) { return bool(r.rank); });
  node_info n{std::move(name), "127.0.0.1", 0, std::move(roles), std::move(agent), std::move(ranks), {}, draining, {},
              "both", {}, {}, {}, {}, {}, {}, 0, 0};
  if (ep) n.ep_group = "both";
  return n;
}

strings names_of(const membership& m) {
  strings out;
  for (const auto& n : m.nodes) out.push_back(n.name);
  return out;
}

}  // namespace

// -- membership_table -----------------------------------------------------------------------------

TEST_CASE("membership_table: upsert adds, replaces or changes nothing, the view is sorted by name") {
  handles h(3);
  actors::membership_table t(make_node("b", {"engine"}, h[0]));
  CHECK(t.self().name == "b");
  CHECK(t.view().version == 1);
  CHECK(names_of(t.view()) == strings{"b"});

  node_info c = make_node("c", {"gateway"}, h[1]);
  node_info a = make_node("a", {"engine"}, h[2], {{0, h[1], {}}});
  CHECK(t.upsert(c));
  CHECK(t.upsert(a));
  membership v = t.view();
  CHECK(v.version == 3);
  CHECK(names_of(v) == strings{"a", "b", "c"});
  CHECK(v.nodes[0] == a);
  CHECK(v.nodes[2] == c);

  CHECK_FALSE(t.upsert(a));  // the same entry again: no change, no new version
  CHECK(t.view().version == 3);

  a.port = 9000;
  a.draining = true;
  CHECK(t.upsert(a));  // replaced by name
  v = t.view();
  CHECK(v.version == 4);
  CHECK(names_of(v) == strings{"a", "b", "c"});
  REQUIRE(t.find("a") != nullptr);
  CHECK(*t.find("a") == a);
  CHECK(t.find("d") == nullptr);
}

TEST_CASE("membership_table: remove_agent ignores unknown agents and never self, set_draining bumps the version") {
  handles h(4);
  actors::membership_table t(make_node("b", {"engine"}, h[0]));
  REQUIRE(t.upsert(make_node("a", {"engine"}, h[1])));
  REQUIRE(t.upsert(make_node("c", {"gateway"}, h[2])));
  REQUIRE(t.view().version == 3);

  CHECK(t.remove_agent(h[3].address()) == std::nullopt);     // not a member
  CHECK(t.remove_agent(caf::actor_addr{}) == std::nullopt);  // no actor at all
  CHECK(t.remove_agent(h[0].address()) == std::nullopt);     // self stays
  CHECK(t.view().version == 3);
  CHECK(t.remove_agent(h[1].address()) == std::optional<std::string>("a"));
  CHECK(t.view().version == 4);
  CHECK(names_of(t.view()) == strings{"b", "c"});
  CHECK(t.remove_agent(h[1].address()) == std::nullopt);  // gone already

  CHECK(t.set_draining(true));
  CHECK(t.self().draining);
  CHECK(t.view().version == 5);
  CHECK(t.view().nodes[0].draining);
  CHECK_FALSE(t.view().nodes[1].draining);
  CHECK_FALSE(t.set_draining(true));
  CHECK(t.view().version == 5);
  CHECK(t.set_draining(false));
  CHECK(t.view().version == 6);
}

TEST_CASE("rejoin_schedule: a member missing from the view is lost and tried again with growing back-off until it is back") {
  handles h(3);
  actors::membership_table t(make_node("b", {"engine"}, h[0]));
  node_info a = make_node("a", {"engine"}, h[1]);
  a.host = "10.0.0.1", a.port = 7101;
  REQUIRE(t.upsert(a));
  REQUIRE(t.upsert(make_node("c", {"gateway"}, h[2])));
  actors::rejoin_schedule s("b", 0.5, 2.0);
  CHECK(s.due(t.view(), 0.0).empty());  // everyone there
  CHECK(s.lost().empty());
  REQUIRE(t.remove_agent(h[1].address()));
  auto d = s.due(t.view(), 10.0);  // lost now: due at once
  REQUIRE(d.size() == 1);
  CHECK(d[0].name == "a");
  CHECK(d[0].host == "10.0.0.1");
  CHECK(d[0].port == 7101);
  CHECK(s.lost() == strings{"a"});
  s.failed("a", 10.0);
  CHECK(s.due(t.view(), 10.4).empty());    // back-off 0.5 s
  CHECK(s.due(t.view(), 10.5).size() == 1);
  s.failed("a", 10.5);                      // then 1 s
  CHECK(s.due(t.view(), 11.4).empty());
  CHECK(s.due(t.view(), 11.5).size() == 1);
  s.failed("a", 11.5);                      // then 2 s, the maximum
  s.failed("a", 13.5);
  CHECK(s.due(t.view(), 15.4).empty());
  CHECK(s.due(t.view(), 15.5).size() == 1);
  REQUIRE(t.upsert(a));  // back in the view: known again, not lost, and a later loss starts afresh
  CHECK(s.due(t.view(), 16.0).empty());
  CHECK(s.lost().empty());
  REQUIRE(t.remove_agent(h[1].address()));
  CHECK(s.due(t.view(), 20.0).size() == 1);
}

// -- balancers ---------------------------------------------------------------------------

TEST_CASE("prefill_routing: non-draining entry engines only, the policy's choice, placements end by id") {
  handles e(6);
  // Which of e[] an answer is (-1: none).
  auto which = [&](const std::optional<caf::actor>& x) {
    if (!x) return -1;
    for (int i = 0; i < 6; ++i)
      if (*x == e[i]) return i;
    return -2;
  };
  membership m;
  m.nodes = {
    make_node("a", {"gateway"}, {}, {{0, e[0], {}}}),                          // not an engine node
    make_node("b", {"engine"}, {}, {{0, e[1], {}}, {1, e[2], {}}, {2, {}, {}}}),  // rank 2: no engine
    make_node("c", {"engine"}, {}, {{0, e[3], {}}}, /*draining=*/true),
    make_node("d", {"gateway", "engine"}, {}, {{0, e[4], {}}}),
  };
  runtime::prefill_balancer_config cfg;
  cfg.policy = runtime::prefill_policy::least_requests;
  actors::prefill_routing p(cfg, runtime::cost_model(0, 1, 0, 0));
  const std::vector<int32_t> prompt(100, 7);
  int64_t next = 1;
  auto route = [&](std::vector<caf::actor> exclude = {}) { return which(p.route(request_id{next++}, prompt, exclude, 0)); };
  CHECK(route() == -1);  // nothing known yet
  p.update(m);
  CHECK(p.engines() == 3);

  using actor_list = std::vector<caf::actor>;
  CHECK(route() == 1);  // request 2; in flight: e1 1, e2 0, e4 0
  CHECK(route() == 2);  // 3: 1 1 0
  CHECK(route() == 4);  // 4: 1 1 1
  CHECK(route() == 1);  // 5, ties to the first (membership order): 2 1 1
  p.done(request_id{2}, 0);  // 1 1 1
  CHECK(route() == 1);       // 6: 2 1 1
  CHECK(route(actor_list{e[1]}) == 2);  // 7, e1 excluded, e2 and e4 tie: 2 2 1
  CHECK(route() == 4);  // 8: 2 2 2
  p.done(request_id{4}, 0);
  p.done(request_id{8}, 0);
  p.done(request_id{8}, 0);   // twice: ignored
  p.done(request_id{99}, 0);  // unknown: ignored
  CHECK(route() == 4);  // 9: 2 2 1
  CHECK(route() == 4);  // 10: 2 2 2
  CHECK(route() == 1);  // 11: 3 2 2
  CHECK(route(actor_list{e[1], e[2], e[4]}) == -1);  // everything excluded
  CHECK(route(actor_list{e[1], e[2]}) == 4);          // 13: 3 2 3
  // Placing a request again ends its old placement: 13 moves from e4 to e2.
  CHECK(which(p.route(request_id{13}, prompt, actor_list{e[4], e[1]}, 0)) == 2);  // 3 3 2

  p.update(m);  // a new view of the same engines keeps their counts
  CHECK(route() == 4);  // 3 3 3
  actors::balancer_report r = p.report(0);
  CHECK(r.kind == "prefill");
  CHECK(r.policy == "least_requests");
  REQUIRE(r.engines.size() == 3);
  CHECK(r.engines[0].engine == "b/0");
  CHECK(r.engines[0].in_flight == 3);
  CHECK(r.engines[2].engine == "d/0");
  CHECK(r.tier_placements[0] == 13);  // every placement so far, all in the first tier

  m.nodes[3].draining = true;
  p.update(m);
  CHECK(p.engines() == 2);
  CHECK(route(actor_list{e[1], e[2]}) == -1);
  p.update(membership{});
  CHECK(p.engines() == 0);
  CHECK(route() == -1);
}

TEST_CASE("balancers: requests enter at prefill engines, handoffs go to decode engines with room") {
  handles e(5);
  auto which = [&](const std::optional<caf::actor>& x) {
    if (!x) return -1;
    for (int i = 0; i < 5; ++i)
      if (*x == e[i]) return i;
    return -2;
  };
  membership m;
  m.nodes = {make_node("p", {"engine"}, {}, {{0, e[0], {}}}), make_node("d1", {"engine"}, {}, {{0, e[1], {}}}),
             make_node("d2", {"engine"}, {}, {{0, e[2], {}}})};
  m.nodes[0].engine_role = "prefill";
  m.nodes[1].engine_role = "decode";
  m.nodes[2].engine_role = "decode";
  actors::prefill_routing p({}, runtime::cost_model(0, 1, 0, 0));
  actors::decode_routing d("decode_balancer");
  p.update(m);
  d.update(m);
  using actor_list = std::vector<caf::actor>;
  const std::vector<int32_t> prompt(100, 7);
  CHECK(which(p.route(request_id{1}, prompt, {}, 0)) == 0);  // only the prefill engine takes new requests …
  CHECK(which(p.route(request_id{2}, prompt, {}, 0)) == 0);
  CHECK(which(p.route(request_id{3}, prompt, actor_list{e[0]}, 0)) == 1);  // … unless it failed them: decode engines, in turn
  CHECK(which(p.route(request_id{4}, prompt, actor_list{e[0]}, 0)) == 2);
  // Handoffs: the decode balancer among decode engines with room (unknown free blocks: room;
  // unknown KV: empty).
  auto ask = [](int64_t blocks, int64_t context = 64) { return runtime::decode_ask{context, 0, blocks}; };
  auto route = [&](int64_t id, runtime::decode_ask a, actor_list refused = {}) { return which(d.route(request_id{id}, a, refused)); };
  CHECK(route(101, ask(4)) == 1);  // both empty: ties to the first
  CHECK(route(102, ask(4)) == 2);  // d1 has one
  d.observe(e[1], 3, 64);          // d1 has 3 free blocks: too few for 4
  CHECK(route(103, ask(4)) == 2);
  CHECK(route(104, ask(3), actor_list{e[2]}) == 1);  // d2 refused it; d1 fits 3
  CHECK(route(105, ask(4), actor_list{e[2]}) == -1);  // no decode engine has room
  // KV counts too: in flight d1 2, d2 2; d1 holds 40000 cache tokens, d2 1000: a long
  // handoff goes to d2.
  d.observe(e[1], 1000, 40000);
  d.observe(e[2], 1000, 1000);
  CHECK(route(106, ask(4, 20000)) == 2);
  d.done(request_id{102});
  d.done(request_id{103});  // d2 now 1 in flight, d1 2
  d.observe(e[2], 1000, 30000);
  d.observe(e[1], 1000, 500);
  CHECK(route(107, ask(4, 8000)) == 1);  // long: the small cache, although busier
  actors::balancer_report r = d.report();
  CHECK(r.kind == "decode");
  REQUIRE(r.engines.size() == 2);
  CHECK(r.engines[0].in_flight == 3);
  CHECK(r.engines[1].in_flight == 1);
  CHECK(r.balance_now > 0);
  CHECK(r.balance_now < 1);
  m.nodes[2].draining = true;
  d.update(m);
  CHECK(route(108, ask(1)) == 1);
  CHECK(d.decode_engines().size() == 1);
  d.update(membership{m.version, {m.nodes[0]}});
  CHECK(route(109, ask(1)) == -1);  // no decode pool: the prefill engine decodes
}

// -- ep_group_of ----------------------------------------------------------------------------------

namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

}  // namespace

TEST_CASE("ep_group_of: ranks with a rank actor sorted by node and rank name, id from names and addresses") {
  handles h(6);  // h[0..2] rank actors, h[3..5] engines and agents
  membership m;
  m.version = 4;
  m.nodes = {
    make_node("a", {"engine"}, h[3], {{0, h[4], h[0]}, {1, h[5], {}}}),  // rank 1 without expert parallelism
    make_node("b", {"engine"}, h[4], {{1, h[5], h[2]}, {0, h[3], h[1]}}),
    make_node("g", {"gateway"}, h[5]),
  };
  actors::ep_group_view g = actors::ep_group_of(m, "both");
  CHECK(g.names == strings{"a/rank0", "b/rank0", "b/rank1"});
  CHECK(g.ranks == std::vector<caf::actor>{h[0], h[1], h[2]});
  auto entry = [](const std::string& name, const caf::actor& a) { return name + " " + to_string(a.address()) + "\n"; };
  CHECK(g.id == fnv1a(entry("a/rank0", h[0]) + entry("b/rank0", h[1]) + entry("b/rank1", h[2])));
  CHECK(g.index_of(h[0]) == 0);
  CHECK(g.index_of(h[2]) == 2);
  CHECK(g.index_of(h[3]) == -1);  // an engine, not a rank actor
  CHECK(g.index_of(caf::actor{}) == -1);

  membership same = m;  // another version, nodes in another order: the same group
  same.version = 9;
  std::reverse(same.nodes.begin(), same.nodes.end());
  CHECK(actors::ep_group_of(same, "both").id == g.id);
  CHECK(actors::ep_group_of(same, "both").ranks == g.ranks);

  membership left = m;  // node b left
  left.nodes.erase(left.nodes.begin() + 1);
  actors::ep_group_view smaller = actors::ep_group_of(left, "both");
  CHECK(smaller.names == strings{"a/rank0"});
  CHECK(smaller.id != g.id);
  CHECK(smaller.index_of(h[1]) == -1);

  actors::ep_group_view none = actors::ep_group_of(membership{}, "both");
  CHECK(none.names.empty());
  CHECK(none.id == fnv1a(""));

  membership restarted = m;  // node b again under the same name, with new actors
  restarted.nodes[1].ranks = {{1, h[5], h[4]}, {0, h[3], h[3]}};
  actors::ep_group_view again = actors::ep_group_of(restarted, "both");
  CHECK(again.names == g.names);
  CHECK(again.id != g.id);
}

TEST_CASE("ep_group_of: prefill and decode ranks form separate groups, each with its own id") {
  handles h(8);
  auto node = [&](std::string name, std::string group, std::vector<rank_info> ranks) {
    node_info n = make_node(std::move(name), {"engine"}, {}, std::move(ranks));
    n.ep_group = group;
    n.engine_role = group;
    return n;
  };
  membership m{1,
               {node("d1", "decode", {{0, h[4], h[0]}, {1, h[5], h[1]}}), node("d2", "decode", {{0, h[6], h[2]}}),
                node("p1", "prefill", {{0, h[7], h[3]}}), make_node("g", {"gateway"}, {})}};
  actors::ep_group_view decode = actors::ep_group_of(m, "decode"), prefill = actors::ep_group_of(m, "prefill");
  CHECK(decode.names == strings{"d1/rank0", "d1/rank1", "d2/rank0"});
  CHECK(prefill.names == strings{"p1/rank0"});
  CHECK(prefill.index_of(h[0]) == -1);
  CHECK(decode.id != prefill.id);
  CHECK(actors::ep_group_of(m, "both").names.empty());
}

TEST_CASE("ep_join_conflict: a joiner unlike its group's members is refused, naming the node and the field") {
  handles h(6);
  auto node = [&](std::string name, int r) {
    node_info n = make_node(std::move(name), {"engine"}, {}, {{0, h[r], h[r + 3]}});
    n.ep_group = "decode";
    n.engine_role = "decode";
    n.checkpoint = "small:00ff";
    n.ep_group_size = 2;
    n.ep_spec_depth = 3;
    return n;
  };
  const membership m{1, {node("d1", 0), make_node("g", {"gateway"}, {})}};
  CHECK_FALSE(actors::ep_join_conflict(m, node("d2", 1)));
  CHECK_FALSE(actors::ep_join_conflict(m, node("d1", 0)));  // itself again (an update)

  node_info other = node("d2", 1);
  other.checkpoint = "tiny:1234";
  auto why = actors::ep_join_conflict(m, other);
  REQUIRE(why);
  CHECK(why->find("node 'd2'") != std::string::npos);
  CHECK(why->find("checkpoint is tiny:1234") != std::string::npos);
  CHECK(why->find("member 'd1' has small:00ff") != std::string::npos);

  auto refused = [&](auto change, const std::string& says) {
    node_info n = node("d2", 1);
    change(n);
    const auto w = actors::ep_join_conflict(m, n);
    return w && w->find(says) != std::string::npos;
  };
  CHECK(refused([](node_info& n) { n.engine_role = "prefill"; }, "engine.role is prefill"));
  CHECK(refused([](node_info& n) { n.ep_group_size = 4; }, "engine.ep_group_size is 4, member 'd1' has 2"));
  CHECK(refused([](node_info& n) { n.ep_spec_depth = 0; }, "speculative depth"));

  // A third node would make 3 ranks in a group declared to have 2.
  const membership two{2, {node("d1", 0), node("d2", 1)}};
  CHECK(actors::ep_join_conflict(two, node("d3", 2)).value_or("").find("would make 3, above engine.ep_group_size 2") !=
        std::string::npos);
  // Another group's members do not matter; a node without expert parallelism is never refused.
  other = node("p1", 2);
  other.ep_group = "prefill";
  other.engine_role = "prefill";
  CHECK_FALSE(actors::ep_join_conflict(two, other));
  CHECK_FALSE(actors::ep_join_conflict(two, make_node("e", {"engine"}, {}, {{0, h[2], {}}})));
}

// -- node agents over loopback ------------------------------------------------------------------------

namespace {

// Receives memberships on `sub` until one satisfies `pred`; nullopt when none did within `within`.
template <class Pred>
std::optional<membership> await_view(caf::scoped_actor& sub, Pred pred, std::chrono::milliseconds within = 15s) {
  auto deadline = std::chrono::steady_clock::now() + within;
  std::optional<membership> found;
  bool expired = false;
  while (!found && !expired) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left <= 0ms) break;
    sub->receive(
      [&](membership& m) {
        if (pred(m)) found = std::move(m);
      },
      caf::after(left) >> [&] { expired = true; });
  }
  return found;
}

auto named(strings names) {
  return [names = std::move(names)](const membership& m) { return names_of(m) == names; };
}

// Two node agents, "a" published on loopback (the seed) and "b", each in its own system.
struct two_nodes {
  net_config cfg_a, cfg_b;
  caf::actor_system a{cfg_a};
  caf::actor_system b{cfg_b};
  actors::node_agent_actor agent_a = actors::spawn_node_agent(a, make_node("a", {"gateway"}, {}), {});
  actors::node_agent_actor agent_b = actors::spawn_node_agent(b, make_node("b", {"engine"}, {}), {});
  stop_on_exit stop{{caf::actor_cast<caf::actor>(agent_a), caf::actor_cast<caf::actor>(agent_b)}};
  uint16_t port_a = 0;

  two_nodes() {
    auto port = caf::io::publish(agent_a, 0, "127.0.0.1");
    REQUIRE(port);
    port_a = *port;
    // As the daemon does: the agent learns its bound port.
    node_info me = make_node("a", {"gateway"}, caf::actor_cast<caf::actor>(agent_a));
    me.port = port_a;
    caf::anon_send(agent_a, update_atom_v, me);
  }

  // Joins b through a; the membership join_cluster returned.
  membership join() {
    std::string error;
    auto view = actors::join_cluster(b, agent_b, {{"127.0.0.1", port_a}}, 10s, error);
    REQUIRE_MESSAGE(view, error);
    return *view;
  }
};

void subscribe(caf::scoped_actor& sub, const actors::node_agent_actor& agent) {
  caf::anon_send(agent, subscribe_atom_v, caf::actor_cast<caf::actor>(sub));
}

}  // namespace

TEST_CASE("node agents over loopback: join through a seed, both see both, a drain is seen by the other, a killed agent leaves") {
  two_nodes f;
  caf::scoped_actor sub_a{f.a}, sub_b{f.b};
  subscribe(sub_a, f.agent_a);
  REQUIRE(await_view(sub_a, named({"a"})));

  membership joined = f.join();
  CHECK(names_of(joined) == strings{"a", "b"});
  CHECK(joined.nodes[0].port == f.port_a);
  CHECK(joined.nodes[0].agent.node() == f.a.node());  // a proxy of a's agent in b

  auto in_a = await_view(sub_a, named({"a", "b"}));
  REQUIRE(in_a);
  CHECK(in_a->nodes[1].agent.node() == f.b.node());
  CHECK(in_a->nodes[1].roles == strings{"engine"});
  subscribe(sub_b, f.agent_b);  // b's agent learned a from join_cluster
  auto in_b = await_view(sub_b, named({"a", "b"}));
  REQUIRE(in_b);
  CHECK(in_b->nodes[0].agent == joined.nodes[0].agent);
  CHECK(in_b->nodes[0].roles == strings{"gateway"});

  caf::scoped_actor self_b{f.b};
  for (bool first : {true, false})
    self_b->request(f.agent_b, 10s, drain_atom_v)
      .receive([&](bool fresh) { CHECK(fresh == first); },
               [&](caf::error& e) { FAIL("drain: " << f.b.render(e)); });
  auto drained = await_view(sub_a, [](const membership& m) { return m.nodes.size() == 2 && m.nodes[1].draining; });
  REQUIRE(drained);
  CHECK_FALSE(drained->nodes[0].draining);

  caf::anon_send_exit(f.agent_b, caf::exit_reason::kill);
  auto left = await_view(sub_a, named({"a"}));
  REQUIRE(left);
  CHECK(left->nodes[0].agent == caf::actor_cast<caf::actor>(f.agent_a));
}

TEST_CASE("node agents over loopback: a joiner that cannot reach a member directly still meets it through the seed") {
  two_nodes f;  // b is not published: nobody can connect to it directly
  f.join();
  net_config cfg_c;
  caf::actor_system c{cfg_c};
  auto agent_c = actors::spawn_node_agent(c, make_node("c", {"storage"}, {}), {});
  stop_on_exit stop{{caf::actor_cast<caf::actor>(agent_c)}};
  std::string error;
  auto view = actors::join_cluster(c, agent_c, {{"127.0.0.1", f.port_a}}, 10s, error);
  REQUIRE_MESSAGE(view, error);
  CHECK(error.find("b (") != std::string::npos);  // the direct connection to b failed, and says so
  caf::scoped_actor sub_b{f.b}, sub_c{c};
  subscribe(sub_b, f.agent_b);
  subscribe(sub_c, agent_c);
  CHECK(await_view(sub_b, named({"a", "b", "c"})));  // told by the seed
  CHECK(await_view(sub_c, named({"a", "b", "c"})));  // b learnt from the seed's view
}

TEST_CASE("node agents over loopback: when a node's connection goes, the other removes it") {
  two_nodes f;
  caf::scoped_actor sub_a{f.a}, sub_b{f.b};
  subscribe(sub_a, f.agent_a);
  f.join();
  REQUIRE(await_view(sub_a, named({"a", "b"})));
  subscribe(sub_b, f.agent_b);
  REQUIRE(await_view(sub_b, named({"a", "b"})));

  // b's BASP broker owns all of b's connections; without it b is unreachable, as when its
  // process dies (its agent stays up in b).
  caf::anon_send_exit(f.b.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP")), caf::exit_reason::kill);
  CHECK(await_view(sub_a, named({"a"})));
  CHECK(await_view(sub_b, named({"b"})));
}

// -- expert parallelism across two actor systems ---------------------------------------------------

namespace {

runtime::engine_config ep_engine_config() {
  runtime::engine_config c;
  c.cache.num_blocks = 256;
  c.cache.snapshot_storage = runtime::swa_storage::fp32;
  c.batch_invariant = true;
  return c;
}

actors::generation_request greedy_request(int64_t id, std::vector<int32_t> prompt, int32_t max_tokens) {
  runtime::sampling_params o;
  o.max_tokens = max_tokens;
  o.ignore_eos = true;
  return {request_id(id), std::move(prompt), o};
}

actors::engine_stats_snapshot stats_of(caf::actor_system& sys, const actors::engine_actor& engine) {
  caf::scoped_actor self{sys};
  actors::engine_stats_snapshot out;
  self->request(engine, 10s, stats_atom_v)
    .receive([&](const actors::engine_stats_snapshot& s) { out = s; },
             [&](caf::error& e) { FAIL("stats: " << sys.render(e)); });
  return out;
}

}  // namespace

TEST_CASE("expert parallelism across two actor systems: tokens equal a plain engine's, the idle rank steps along") {
  net_config cfg_a, cfg_b;
  caf::actor_system a{cfg_a};
  caf::actor_system b{cfg_b};
  auto weights = test::tiny_model("tiny");
  auto ep_a = std::make_shared<caf_ep_transport>(10s);
  auto ep_b = std::make_shared<caf_ep_transport>(10s);
  auto engine_a = actors::spawn_engine(a, weights, ep_engine_config(), true, ep_a);
  auto engine_b = actors::spawn_engine(b, weights, ep_engine_config(), true, ep_b);
  auto rank_a = actors::spawn_rank(a, ep_a, engine_a, "both");
  auto rank_b = actors::spawn_rank(b, ep_b, engine_b, "both");
  stop_on_exit stop{{caf::actor_cast<caf::actor>(engine_a), caf::actor_cast<caf::actor>(engine_b),
                     caf::actor_cast<caf::actor>(rank_a), caf::actor_cast<caf::actor>(rank_b)}};
  // Both systems live in this process. CAF 0.17 keeps a local actor that was sent to the other
  // system in this system's registry until that system's proxy reports it gone, and b's
  // teardown can close the connection before that report leaves: a's destructor then waits
  // forever for its detached engine (seen once under the sanitizer build's load). The
  // registrations go when the test ends (a daemon's exit makes them moot).
  struct forget_registrations {
    caf::actor_system& sys;
    std::vector<caf::actor_id> ids;
    ~forget_registrations() {
      for (caf::actor_id id : ids) sys.registry().erase(id);
    }
  } forget_a{a, {engine_a.id(), rank_a.id()}}, forget_b{b, {engine_b.id(), rank_b.id()}};

  // b's rank actor as a proxy in a; a's membership names both ranks and goes to both rank
  // actors, to b's over the wire (rank_a arrives there as a proxy, rank_b as itself).
  auto port = caf::io::publish(rank_b, 0, "127.0.0.1");
  REQUIRE(port);
  auto rank_b_in_a = caf::io::remote_actor<actors::rank_actor>(a, "127.0.0.1", *port);
  REQUIRE(rank_b_in_a);
  auto as_actor = [](const auto& h) { return caf::actor_cast<caf::actor>(h); };
  membership m{2,
               {make_node("node-a", {"engine"}, {}, {{0, as_actor(engine_a), as_actor(rank_a)}}),
                make_node("node-b", {"engine"}, {}, {{0, {}, as_actor(*rank_b_in_a)}})}};
  actors::ep_group_view group = actors::ep_group_of(m, "both");
  REQUIRE(group.ranks.size() == 2);
  caf::anon_send(as_actor(rank_a), m);
  caf::anon_send(as_actor(*rank_b_in_a), m);

  // Both engines adopt the group (their transports say so; a submit queues behind it).
  auto adopted = [&](const caf_ep_transport& t) { return t.group() == group.id && t.size() == 2; };
  auto deadline = std::chrono::steady_clock::now() + 15s;
  while (!(adopted(*ep_a) && adopted(*ep_b)) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(2ms);
  REQUIRE(adopted(*ep_a));
  REQUIRE(adopted(*ep_b));

  std::vector<actors::generation_request> reqs = {greedy_request(1, test::random_tokens(20, 11), 8),
                                                  greedy_request(2, test::random_tokens(37, 12), 5),
                                                  greedy_request(3, test::random_tokens(9, 13), 11)};
  runtime::engine plain(weights, ep_engine_config());
  for (const auto& r : reqs) REQUIRE(plain.add_request(r.prompt, r.sampling));
  std::vector<std::vector<int32_t>> expected;
  for (auto& c : plain.run_to_completion()) expected.push_back(c.output);

  caf::scoped_actor client{a};
  for (const auto& r : reqs)
    client->request(engine_a, 10s, submit_atom_v, r)
      .receive([&](request_id id) { CHECK(id == r.id); },
               [&](caf::error& e) { FAIL("submit: " << a.render(e)); });
  std::map<int64_t, std::vector<int32_t>> tokens;
  std::map<int64_t, runtime::finish_reason> reasons;
  bool timed_out = false;
  client->receive_while([&] { return reasons.size() < reqs.size() && !timed_out; })(
    [&](const actors::token_event& ev) {
      tokens[ev.id.value].push_back(ev.token);
      if (ev.finished) reasons[ev.id.value] = ev.reason;
    },
    caf::after(30s) >> [&] { timed_out = true; });
  REQUIRE_FALSE(timed_out);
  for (size_t i = 0; i < reqs.size(); ++i) {
    CAPTURE(i);
    CHECK(tokens[reqs[i].id.value] == expected[i]);
    CHECK(reasons[reqs[i].id.value] == runtime::finish_reason::length);
  }

  auto sa = stats_of(a, engine_a);
  CHECK(sa.engine.generated == 8 + 5 + 11);
  CHECK(sa.requests_running == 0);
  auto sb = stats_of(b, engine_b);
  CHECK(sb.engine.steps > 0);  // it joined a's lockstep steps
  CHECK(sb.engine.generated == 0);
  CHECK(sb.engine.prefill_tokens == 0);
  CHECK(sb.requests_running == 0);
}
