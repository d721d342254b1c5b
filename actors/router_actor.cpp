// The router actor over router_policy: membership in, engines out.
#include "actors/router_actor.hpp"

#include <algorithm>

#include <caf/actor_system.hpp>
#include <caf/result.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

namespace shoal::actors {

void router_policy::update(const membership& m) {
  entry_.clear();
  decode_.clear();
  for (const node_info& n : m.nodes) {
    if (n.draining || std::find(n.roles.begin(), n.roles.end(), "engine") == n.roles.end()) continue;
    for (const rank_info& r : n.ranks)
      if (r.engine) (n.engine_role == "decode" ? decode_ : entry_).push_back(r.engine);
  }
}

std::optional<caf::actor> router_policy::least_loaded(const std::vector<caf::actor>& among,
                                                            const std::vector<caf::actor>& exclude) {
  const caf::actor* best = nullptr;
  int64_t best_load = 0;
  for (const caf::actor& e : among) {
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

std::optional<caf::actor> router_policy::pick(const std::vector<caf::actor>& exclude) {
  if (auto e = least_loaded(entry_, exclude)) return e;
  return least_loaded(decode_, exclude);
}

std::optional<caf::actor> router_policy::pick_decode(const runtime::decode_ask& ask,
                                                           const std::vector<caf::actor>& refused) {
  std::vector<runtime::decode_candidate> candidates;
  std::vector<int64_t> refused_index;
  for (size_t i = 0; i < decode_.size(); ++i) {
    const caf::actor& e = decode_[i];
    auto free = blocks_free_.find(e.address());
    candidates.push_back({static_cast<int64_t>(i), in_flight_[e.address()], kv_tokens_[e.address()],
                          free == blocks_free_.end() ? ask.blocks_needed : free->second, false});
    if (std::find(refused.begin(), refused.end(), e) != refused.end()) refused_index.push_back(static_cast<int64_t>(i));
  }
  auto chosen = placement_.choose(ask, candidates, refused_index);
  if (!chosen) return std::nullopt;
  const caf::actor& e = decode_[static_cast<size_t>(*chosen)];
  ++in_flight_[e.address()];
  return e;
}

void router_policy::observe(const caf::actor& engine, int64_t blocks_free, int64_t kv_tokens) {
  blocks_free_[engine.address()] = blocks_free;
  kv_tokens_[engine.address()] = kv_tokens;
}

void router_policy::done(const caf::actor& engine) {
  auto it = in_flight_.find(engine.address());
  if (it != in_flight_.end() && it->second > 0) --it->second;
}

namespace {

struct router_state {
  static inline const char* name = "router";
  router_policy policy;
  bool polling = false;  // a tick is due
};

// How often the router asks each decode engine for its free blocks.
constexpr auto decode_poll_interval = std::chrono::milliseconds(200);

using router_impl = router_actor::extend<caf::reacts_to<tick_atom>>;
using router_pointer = router_impl::stateful_pointer<router_state>;

void poll_decoders(router_pointer self) {
  self->state.polling = !self->state.policy.decode_engines().empty();
  if (!self->state.polling) return;
  for (const caf::actor& e : self->state.policy.decode_engines())
    self->request(caf::actor_cast<engine_actor>(e), decode_poll_interval * 5, stats_atom_v)
      .then([self, e](const engine_stats_snapshot& s) { self->state.policy.observe(e, s.blocks_free, s.kv_tokens); },
            [](const caf::error&) {});  // gone: the next membership drops it
  self->delayed_send(self, decode_poll_interval, tick_atom_v);
}

router_impl::behavior_type router_behavior(router_pointer self) {
  return {
    [self](route_atom, std::vector<caf::actor>& exclude) -> caf::result<caf::actor> {
      if (auto e = self->state.policy.pick(exclude)) return *e;
      return make_error(errc::no_engine, self->state.policy.engines() == 0
                                             ? "no engine is up in the cluster"
                                             : "every engine failed this request already");
    },
    [self](route_atom, decode_atom, int64_t blocks, int64_t context, int64_t max_new,
           std::vector<caf::actor>& refused) -> caf::result<caf::actor> {
      if (auto e = self->state.policy.pick_decode({context, max_new, blocks}, refused)) return *e;
      return make_error(errc::no_engine, self->state.policy.decode_engines().empty()
                                             ? "no decode engine is up in the cluster"
                                             : "no decode engine has room for the handoff");
    },
    [self](done_atom, caf::actor& engine) { self->state.policy.done(engine); },
    [self](membership& m) {
      self->state.policy.update(m);
      if (!self->state.polling) poll_decoders(self);
    },
    [self](tick_atom) { poll_decoders(self); },
  };
}

}  // namespace

router_actor spawn_router(caf::actor_system& sys) {
  return caf::actor_cast<router_actor>(sys.spawn(router_behavior));
}

}  // namespace shoal::actors
