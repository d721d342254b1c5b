// The decode balancer's weights from the decode engines' own fitted decode steps
// (runtime::engine_stats::decode_cost, polled with their free blocks and KV): none until
// every decode engine has reported one, then a request weighs their mean b + d and a KV token
// their mean c; gateway.balancer_cost_model, when given, keeps its weights.
#include <doctest/doctest.h>

#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>

#include "actors/balancer_actors.hpp"
#include "actors/interfaces.hpp"

using namespace shoal;

namespace {

struct local_config : caf::actor_system_config {
  local_config() {
    actors::add_message_types(*this);
    set("scheduler.max-threads", size_t{2});
  }
};

caf::behavior idle(caf::event_based_actor*) {
  return {[](caf::ok_atom) {}};
}

// Two idle actors stand in for two decode engines; membership of those two.
struct two_decoders {
  local_config cfg;
  caf::actor_system sys{cfg};
  std::vector<caf::actor> e = {sys.spawn(idle), sys.spawn(idle)};
  actors::membership m;
  two_decoders() {
    for (int i = 0; i < 2; ++i) {
      actors::node_info n;
      n.name = "d" + std::to_string(i);
      n.roles = {"engine"};
      n.engine_role = "decode";
      n.ranks = {{0, e[static_cast<size_t>(i)], {}}};
      m.nodes.push_back(n);
    }
  }
  ~two_decoders() {
    for (auto& a : e) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }
  // d0 runs one request on a small cache, d1 none on a large one: where a new handoff goes.
  int choice(actors::decode_routing& d) {
    d.update(m);
    REQUIRE(d.route(request_id{1}, {64, 0, 1}, {}) == e[0]);  // both empty: the first
    d.observe(e[0], 1000, 100);
    d.observe(e[1], 1000, 100000);
    auto x = d.route(request_id{2}, {64, 0, 1}, {});
    REQUIRE(x);
    return *x == e[0] ? 0 : 1;
  }
};

runtime::cost_stats fitted(double per_request, double per_kv) {
  runtime::cost_stats s;
  s.source = "fitted";
  s.coef = {0.01, per_request, per_kv, 0};
  return s;
}

}  // namespace

TEST_CASE("decode balancer: the decode engines' own decode fits weigh requests against KV once all have one") {
  two_decoders t;
  actors::decode_routing by_requests("decode_balancer"), by_kv("decode_balancer");
  by_requests.update(t.m), by_kv.update(t.m);
  CHECK(by_requests.report().cost.starts_with("none"));
  by_requests.observe_cost(t.e[0], fitted(1e-2, 1e-9));
  CHECK(by_requests.report().cost.starts_with("none"));  // 1 of 2: not yet
  by_requests.observe_cost(t.e[1], fitted(1e-2, 1e-9));
  CHECK_MESSAGE(by_requests.report().cost.find("the engines' decode fits (2 of 2)") != std::string::npos,
                by_requests.report().cost);
  for (const auto& e : t.e) by_kv.observe_cost(e, fitted(1e-9, 1e-2));
  // A request costs more than any KV: the idle engine, despite its cache; a KV token costs
  // more than any request: the small cache, though busier.
  CHECK(t.choice(by_requests) == 1);
  CHECK(t.choice(by_kv) == 0);

  // No positive weights: said, and each dimension stays relative to its mean.
  actors::decode_routing flat("decode_balancer");
  flat.update(t.m);
  for (const auto& e : t.e) flat.observe_cost(e, fitted(1e-3, -1e-6));
  CHECK(flat.report().cost.find("no positive weights") != std::string::npos);
  // gateway.balancer_cost_model: its weights stay.
  actors::decode_routing given("decode_balancer", runtime::cost_model(0, 1e-9, 1e-2, 0), true);
  given.update(t.m);
  for (const auto& e : t.e) given.observe_cost(e, fitted(1e-2, 1e-9));
  CHECK(given.report().cost == "gateway.balancer_cost_model");
  CHECK(t.choice(given) == 0);
}
