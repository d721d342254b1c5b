// The router: picks an engine for each of the gateway's requests among the ranks of the
// engine nodes that are up and not draining, the one with the fewest requests it routed
// there still in flight (ties: the first in membership order). The prefill/decode balancers
// of later issues replace this policy; the interface stays.
#pragma once

#include <map>
#include <optional>
#include <vector>

#include "actors/interfaces.hpp"

namespace shoal::actors {

// The policy as plain state, tested without an actor system.
class least_loaded_policy {
 public:
  // Engines from `m`: every rank of every node with the engine role that is not draining.
  void update(const membership& m);
  // The least loaded engine not in `exclude` (counted as one more in flight), or nullopt.
  std::optional<caf::actor> pick(const std::vector<caf::actor>& exclude);
  void done(const caf::actor& engine);
  size_t engines() const { return engines_.size(); }

 private:
  std::vector<caf::actor> engines_;
  std::map<caf::actor_addr, int64_t> in_flight_;
};

router_actor spawn_router(caf::actor_system& sys);

}  // namespace shoal::actors
