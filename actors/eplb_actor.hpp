// The expert-parallel balancer of an EP group as an actor (MISSION.md "Expert-parallel load
// balancer"). Every EP node runs one; the one on the node of the group's rank 0 leads, the
// others only say who does. Every `interval` the leader asks each rank's engine for its load
// report, gives them to runtime::eplb_controller and, when a plan is due, asks the current
// holders of the experts each process gains to lend them (runtime/ep/expert_migration.hpp), then
// offers the new placement with those descriptions to every engine; the ranks read the
// experts they gain over the transport while they keep stepping, and switch in band at a step
// boundary once every rank holds them (runtime/ep/expert_parallel.hpp). A group change drops
// whatever was offered (reads in flight are discarded; lent weights stay readable until
// their lease ends).
#pragma once

#include <chrono>
#include <expected>
#include <memory>
#include <mutex>
#include <string>

#include "actors/interfaces.hpp"
#include "runtime/placement/eplb_controller.hpp"

namespace shoal::actors {

placement_msg to_msg(const runtime::ep_placement& p);
// The placement a message describes, checked (runtime::ep_placement::from_lists).
std::expected<runtime::ep_placement, std::string> to_placement(const placement_msg& m);

// What the node's shell hooks read and ask: the balancer's status text, kept current by the
// actor, and the node's balancer actor.
struct eplb_board {
  mutable std::mutex mu;
  std::string text = "expert-parallel balancer: starting\n";
  caf::actor actor;
  std::string read() const {
    std::lock_guard lock(mu);
    return text;
  }
};

// Spawns the balancer of node `node`; subscribe it to the node agent for the membership.
// `fetch_timeout`: how long a process may take to read the experts it gains (the holders
// keep them readable that long and ten intervals more).
caf::actor spawn_eplb(caf::actor_system& sys, std::string node, std::string group, runtime::eplb_policy policy,
                      std::chrono::milliseconds interval, std::chrono::milliseconds fetch_timeout,
                      std::shared_ptr<eplb_board> board);

}  // namespace shoal::actors
