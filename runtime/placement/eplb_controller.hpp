// The expert-parallel balancer's decisions for one EP group (plain C++; the eplb actor,
// actors/eplb_actor.hpp, feeds it the ranks' reports and carries out what it decides):
// when the period has passed since the group's placement began (or a rebalance is asked
// for) and no placement is being adopted, it sums the ranks' load windows and plans the next
// placement (plan_placement). It keeps what the shell shows: per-layer imbalance now and
// over the window, the last plan and the weights it moved.
#pragma once

#include <algorithm>
#include <cstdint>
#include <expected>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/placement/expert_placement.hpp"

namespace shoal::runtime {

// What one rank tells its group's balancer.
struct rank_load_report {
  uint64_t group = 0;
  uint64_t steps = 0;          // lockstep steps begun in this group
  int64_t window_steps = 0;    // steps the load window covers
  std::vector<double> window;  // slots × logical routed pairs over the window (this rank's rows)
  std::vector<double> recent;  // the same over the latest bucket of the window
  std::shared_ptr<const ep_placement> placement;
  uint64_t offered_epoch = 0;  // the placement being adopted, 0 when none
  int64_t pairs_computed = 0;  // pairs this rank computed for the group, ever
  int64_t expert_bytes = 0;    // bytes of one routed expert's weights (one slot)
};

struct eplb_last_plan {
  uint64_t epoch = 0, at_step = 0;
  std::vector<double> before, after;  // per slot, on the window's loads
  int64_t experts_moved = 0, bytes_moved = 0, swaps = 0;
  bool forced = false;
};

class eplb_controller {
 public:
  explicit eplb_controller(eplb_policy policy) : policy_(policy) {}

  // `reports` of every rank of the group, by rank. A plan to offer every rank when one is
  // due; nullopt when none is (status() says why); an error when the reports disagree
  // (group, placement epoch or shape), naming the rank.
  std::expected<std::optional<placement_plan>, std::string> decide(const std::vector<rank_load_report>& reports,
                                                                   bool force);
  // The offer of `plan` went out to every rank (or failed: `error`).
  void offered(const placement_plan& plan, uint64_t at_step, bool forced, int64_t expert_bytes,
               const std::string& error = {});
  std::string status() const;
  const std::optional<eplb_last_plan>& last_plan() const { return last_; }
  const eplb_policy& policy() const { return policy_; }
  // The nodes of the group (processes with equally many ranks, in rank order) for the
  // hierarchical policy: each expert group's copies stay on one node.
  void set_nodes(int64_t nodes) { policy_.nodes = std::max<int64_t>(nodes, 1); }

 private:
  eplb_policy policy_;
  uint64_t group_ = 0, epoch_ = 0, epoch_since_ = 0;  // the placement seen and the step it was first seen at
  bool seen_ = false;
  int32_t ranks_ = 0;
  int64_t window_steps_ = 0;
  std::vector<double> now_, over_window_;  // per slot imbalance
  std::vector<int64_t> pairs_;             // per rank, computed (cumulative)
  std::optional<eplb_last_plan> last_;
  std::string note_;                       // the last decision, in words
};

}  // namespace shoal::runtime
