// The router actor over least_loaded_policy: membership in, engines out.
#include "actors/router_actor.hpp"

#include <algorithm>

#include <caf/actor_system.hpp>
#include <caf/result.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

namespace shoal::actors {

void least_loaded_policy::update(const membership& m) {
  engines_.clear();
  for (const node_info& n : m.nodes) {
    if (n.draining || std::find(n.roles.begin(), n.roles.end(), "engine") == n.roles.end()) continue;
    for (const rank_info& r : n.ranks)
      if (r.engine) engines_.push_back(r.engine);
  }
}

std::optional<caf::actor> least_loaded_policy::pick(const std::vector<caf::actor>& exclude) {
  const caf::actor* best = nullptr;
  int64_t best_load = 0;
  for (const caf::actor& e : engines_) {
    if (std::find(exclude.begin(), exclude.end(), e) != exclude.end()) continue;
    int64_t load = in_flight_[e.address()];
    if (!best || load < best_load) {
      best = &e;
      best_load = load;
    }
  }
  if (!best) return std::nullopt;
  ++in_flight_[best->address()];
  return *best;
}

void least_loaded_policy::done(const caf::actor& engine) {
  auto it = in_flight_.find(engine.address());
  if (it != in_flight_.end() && it->second > 0) --it->second;
}

namespace {

struct router_state {
  static inline const char* name = "router";
  least_loaded_policy policy;
};

router_actor::behavior_type router_behavior(router_actor::stateful_pointer<router_state> self) {
  return {
    [self](route_atom, std::vector<caf::actor>& exclude) -> caf::result<caf::actor> {
      if (auto e = self->state.policy.pick(exclude)) return *e;
      return make_error(errc::no_engine, self->state.policy.engines() == 0
                                             ? "no engine is up in the cluster"
                                             : "every engine failed this request already");
    },
    [self](done_atom, caf::actor& engine) { self->state.policy.done(engine); },
    [self](membership& m) { self->state.policy.update(m); },
  };
}

}  // namespace

router_actor spawn_router(caf::actor_system& sys) { return sys.spawn(router_behavior); }

}  // namespace shoal::actors
