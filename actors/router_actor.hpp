// The router: picks an engine for each of the gateway's requests among the ranks of the
// engine nodes that are up and not draining, the one with the fewest requests it routed
// there still in flight (ties: the first in membership order). Requests enter at prefill
// and colocated ("both") engines; decode engines take them only when no other is up. A
// prefill engine's handoff goes to a decode engine chosen by runtime::decode_balancer (request
// count and KV tokens at once) over the in-flight counts and the KV tokens and free blocks
// the router polls from each decode engine (200 ms). The prefill balancer (runtime/
// prefill_balancer.hpp) is not wired in yet.
#pragma once

#include <map>
#include <optional>
#include <vector>

#include "actors/interfaces.hpp"
#include "runtime/decode_placement.hpp"

namespace shoal::actors {

// The policy as plain state, tested without an actor system.
class router_policy {
 public:
  // Engines from `m`: every rank of every node with the engine role that is not draining,
  // entry engines (prefill, both) apart from decode engines.
  void update(const membership& m);
  // The least loaded entry engine not in `exclude` (counted as one more in flight), or
  // nullopt; a decode engine when no entry engine is up.
  std::optional<caf::actor> pick(const std::vector<caf::actor>& exclude);
  // The decode engine for a handoff (`ask`: its blocks, context and expected output), not in
  // `refused` (counted as one more in flight), or nullopt: runtime::decode_balancer over
  // the in-flight counts and the engines' last reported KV tokens and free blocks.
  std::optional<caf::actor> pick_decode(const runtime::decode_ask& ask, const std::vector<caf::actor>& refused);
  // A decode engine's free blocks and KV tokens as last reported (until then it is assumed
  // to have room and an empty cache).
  void observe(const caf::actor& engine, int64_t blocks_free, int64_t kv_tokens = 0);
  void done(const caf::actor& engine);
  size_t engines() const { return entry_.size() + decode_.size(); }
  const std::vector<caf::actor>& decode_engines() const { return decode_; }

 private:
  std::optional<caf::actor> least_loaded(const std::vector<caf::actor>& among, const std::vector<caf::actor>& exclude);
  std::vector<caf::actor> entry_, decode_;
  std::map<caf::actor_addr, int64_t> in_flight_;
  std::map<caf::actor_addr, int64_t> blocks_free_, kv_tokens_;
  runtime::decode_balancer placement_;
};

router_actor spawn_router(caf::actor_system& sys);

}  // namespace shoal::actors
