// Expert parallelism over CAF: the rank actor of one engine and the transport its engine's
// forward pass blocks on. The group is every rank of every engine node with
// engine.expert_parallel, ordered by (node name, rank index), as the node agent's membership
// says; a membership change interrupts a running exchange (that step fails, its requests end
// as errors and the gateway re-routes them) and the engine adopts the new group between
// steps. Frames go rank actor to rank actor; a frame for a step this rank has not begun
// makes it join that step (lockstep: a rank without work steps with an empty batch).
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "actors/interfaces.hpp"
#include "runtime/expert_parallel.hpp"

namespace shoal::actors {

// One rank's view of its group: the frames that arrived, the peers to send to.
class caf_ep_transport final : public runtime::expert_transport {
 public:
  explicit caf_ep_transport(std::chrono::milliseconds timeout) : timeout_(timeout) {}

  // expert_transport: sends outgoing[r] to rank r's actor, waits for every peer's frame of
  // (step, slot, phase) in the current group; an error on interrupt or timeout.
  std::expected<runtime::ep_payloads, std::string> exchange(uint64_t step, int32_t slot, int32_t phase,
                                                            runtime::ep_payloads outgoing) override;

  // Rank actor: a frame arrived. True when it belongs to a step of the current group this
  // rank has not begun (and no join was asked for it yet): the engine must join that step.
  bool deliver(ep_frame f);
  // Rank actor: the group is changing; a running or later exchange fails until set_group.
  void interrupt(const std::string& why);
  // Engine, between steps: adopt a group. True when frames of it are already waiting (the
  // engine should then step to join them).
  bool set_group(uint64_t group, int32_t rank, std::vector<rank_actor> peers);
  uint64_t group() const;
  int32_t size() const;

 private:
  using key = std::tuple<uint64_t, uint64_t, int32_t, int32_t, int32_t>;  // group, step, slot, phase, source

  const std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t group_ = 0;
  int32_t rank_ = 0;
  std::vector<rank_actor> peers_;  // by rank; own entry unused
  std::set<uint64_t> retired_;     // groups left behind: their frames are dropped
  std::map<key, std::vector<uint8_t>> inbox_;
  std::optional<std::string> interrupted_;
  int64_t last_local_step_ = -1;   // highest step this rank exchanged in the current group
  int64_t last_join_ = -1;         // highest step a join was asked for in the current group
};

// The group a membership defines: sorted rank names and their actors; id = FNV-1a of the
// names and the rank actors' addresses (a restarted node is a new group). Plain function,
// tested directly.
struct ep_group_view {
  uint64_t id = 0;
  std::vector<std::string> names;  // "<node>/rank<i>"
  std::vector<caf::actor> ranks;   // rank actors, same order
  std::vector<caf::actor> engines; // their engine actors, same order
  int32_t index_of(const caf::actor& rank) const;
};
ep_group_view ep_group_of(const membership& m);

// Spawns the rank actor of `engine` (an engine spawned with this transport).
rank_actor spawn_rank(caf::actor_system& sys, std::shared_ptr<caf_ep_transport> transport, engine_actor engine);

}  // namespace shoal::actors
