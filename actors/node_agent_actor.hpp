// The node agent: one per shoald. It keeps the cluster membership as this node sees it
// (nodes join through any member, announce changes, and leave when their agent goes down),
// names the node's local actors for the shell, and runs the operator commands through hooks
// the daemon provides, so the agent itself knows nothing of engines or gateways.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "actors/interfaces.hpp"

namespace shoal::actors {

// The membership as one agent knows it: nodes by name, a version bumped on every change.
// Plain state (no actor system needed), tested directly.
class membership_table {
 public:
  explicit membership_table(node_info self);

  const node_info& self() const { return members_.at(self_name_); }
  // Adds or replaces `n` by name; false when nothing changed.
  bool upsert(const node_info& n);
  // Removes the node whose agent is `agent`; its name, or nullopt when unknown / self.
  std::optional<std::string> remove_agent(const caf::actor_addr& agent);
  bool set_draining(bool draining);
  const node_info* find(const std::string& name) const;
  membership view() const;

 private:
  std::string self_name_;
  std::map<std::string, node_info> members_;
  uint64_t version_ = 1;
};

// What the daemon lets its agent do. Each hook may be empty (the command is then refused).
struct node_hooks {
  std::function<std::optional<std::string>(const std::string& actor)> describe;
  std::function<std::vector<std::string>()> requests;
  std::function<void()> drain;                          // stop taking new requests
  std::function<bool(const std::string& actor)> kill_actor;
  std::function<void()> kill_node;                      // ends the process, as kill -9 would
  // The expert-parallel balancer: "status" or "rebalance" → text; unset without EP ranks.
  std::function<std::string(const std::string& command)> eplb;
  // Hands an operator's prompt to the local gateway; nullopt without one.
  std::optional<gateway_actor> gateway;
};

// Spawns the agent of the node described by `self` (its agent field is filled in here).
node_agent_actor spawn_node_agent(caf::actor_system& sys, node_info self, node_hooks hooks);

// Joins the cluster through the first of `seeds` that answers within `timeout` each, then
// connects to every member directly and announces this node to them. Blocking; call from
// the daemon's main thread. Returns the membership, or an error naming the seeds tried. A
// seed that refuses this node (ep_join_conflict: its expert-parallel group disagrees) ends the
// attempt at once with *refused set: retrying cannot help.
struct seed_address {
  std::string host;
  uint16_t port = 0;
};
std::optional<membership> join_cluster(caf::actor_system& sys, const node_agent_actor& agent,
                                       const std::vector<seed_address>& seeds,
                                       std::chrono::milliseconds timeout, std::string& error,
                                       bool* refused = nullptr);

// Healing a partition: members that left this node's view (their agent went down: a cut
// link, a stopped or restarted process) are tried again, each with its own exponential
// back-off, for as long as the node runs. Plain state, tested directly.
class rejoin_schedule {
 public:
  struct peer {
    std::string name, host;
    uint16_t port = 0;
  };
  explicit rejoin_schedule(std::string self, double first_s = 0.5, double max_s = 8.0)
      : self_(std::move(self)), first_(first_s), max_(max_s) {}
  // Takes the view at `now`: its members are known (and no longer lost); a known member
  // missing from it is lost from now on. Returns the lost members due for a try.
  std::vector<peer> due(const membership& view, double now);
  void failed(const std::string& name, double now);  // the try did not reach it: wait longer
  std::vector<std::string> lost() const;

 private:
  struct entry {
    peer p;
    bool lost = false;
    double next = 0, backoff = 0;
  };
  std::string self_;
  double first_, max_;
  std::map<std::string, entry> known_;
};

// The healer: every `period` reads the agent's view and rejoins each due lost member through a
// new connection (join_atom both ways: it learns this node and tells its members; this node
// learns its view and announces itself to each), so two views that meet again merge. Each
// connect and join waits at most `timeout`, on the calling thread only: a thread of its own
// that no request waits for.
// Runs until `stop`; `log` gets one line per member lost and per member back.
void heal_membership(caf::actor_system& sys, const node_agent_actor& agent, std::chrono::milliseconds period,
                     std::chrono::milliseconds timeout, const std::atomic<bool>& stop,
                     const std::function<void(const std::string&)>& log);

}  // namespace shoal::actors
