// Where the routed experts of an expert-parallel group live, how busy they are, and how a new
// placement is chosen (plain C++, below the actors):
// - ep_placement: per MoE slot, the logical experts each rank computes. A logical expert may
//   be on several ranks (redundant copies); a token routed to it goes to one replica by a
//   balanced, deterministic choice (replica_for). The default is contiguous blocks.
// - expert_load_window: routed token counts per (slot, logical expert) over the last N steps.
// - plan_placement: EPLB (eplb.hpp) on the window's loads, refined by swaps and matched to the
//   running placement so as few expert weights as possible move; the next epoch's placement.
#pragma once

#include <cstdint>
#include <expected>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/placement/eplb.hpp"

namespace shoal::runtime {

class ep_placement {
 public:
  // Contiguous blocks (epoch 0): rank r computes experts [r·E/ranks, (r+1)·E/ranks) of every
  // slot; with ranks > E some ranks compute none.
  static ep_placement contiguous(int64_t slots, int64_t logical, int32_t ranks);
  // From an EPLB plan over `slots` layers and `ranks` GPUs (slots of GPU g: its share of
  // phy2log). Two copies of one expert on one rank count once. Errors name the bad field.
  static std::expected<ep_placement, std::string> from_plan(const eplb_plan& plan, uint64_t epoch);
  // From per-(slot, rank) lists, [slot·ranks + rank] (bytes from another process: each list
  // ascending without repeats, experts in range, every expert on some rank of every slot).
  static std::expected<ep_placement, std::string> from_lists(int64_t slots, int64_t logical, int32_t ranks,
                                                             uint64_t epoch, std::vector<std::vector<int32_t>> lists);
  const std::vector<std::vector<int32_t>>& lists() const { return per_rank_; }

  int64_t slots() const { return slots_; }
  int64_t logical() const { return logical_; }
  int32_t ranks() const { return ranks_; }
  uint64_t epoch() const { return epoch_; }
  // The plan it came from (null for contiguous): the previous plan of the next refinement.
  const eplb_plan* plan() const { return plan_ ? plan_.get() : nullptr; }

  // Logical experts rank `rank` computes in `slot`, ascending, each once.
  std::span<const int32_t> experts_of(int64_t slot, int32_t rank) const;
  bool holds(int64_t slot, int32_t rank, int64_t expert) const;
  // Ranks holding `expert` in `slot`, ascending (never empty).
  std::span<const int32_t> replicas(int64_t slot, int64_t expert) const;
  // The rank that computes the n-th pair (0-based, in the sender's row order) that rank
  // `sender` routes to `expert` in `slot` in one step: replicas taken in turn, starting at an
  // offset of the sender, so senders spread over the replicas. Deterministic; with a
  // batch-invariant forward the replica does not change the result.
  int32_t replica_for(int64_t slot, int64_t expert, int32_t sender, int64_t n) const;

  // (slot, expert) pairs of `rank` here that it does not compute in `before` (same shape).
  int64_t gained(const ep_placement& before, int32_t rank) const;
  // Per slot: max / mean over ranks of the pairs computed when `load` (slots × logical
  // counts) is spread as replica_for spreads it (each replica an equal share).
  std::vector<double> imbalance(std::span<const double> load) const;

  bool same_experts(const ep_placement& o) const { return per_rank_ == o.per_rank_; }
  // Slot `slot` placed as `from` places it (same slots, experts and ranks). The plan stays
  // only when `from` has one of the same shape (its rows are copied); otherwise it is dropped.
  void take_slot(const ep_placement& from, int64_t slot);

 private:
  ep_placement() = default;
  void index();  // replicas_ from per_rank_

  int64_t slots_ = 0, logical_ = 0;
  int32_t ranks_ = 1;
  uint64_t epoch_ = 0;
  std::shared_ptr<const eplb_plan> plan_;
  std::vector<std::vector<int32_t>> per_rank_;  // [slot·ranks + rank] experts ascending
  std::vector<std::vector<int32_t>> replicas_;  // [slot·logical + expert] ranks ascending
};

// Routed pair counts per (slot, logical expert), summed over the last `window` steps in
// buckets of window/10 steps (at least 1): the sum covers between window − bucket + 1 and
// window steps, and memory is 10 count arrays whatever the window.
class expert_load_window {
 public:
  expert_load_window(int64_t slots, int64_t logical, int64_t window);
  // One step's pairs of `slot`: `ids` the routed expert ids (rows × top_k).
  void count(int64_t slot, std::span<const int32_t> ids);
  void end_step();  // the step's counts join the window
  // Counts over the window (slots × logical, row-major) and the steps they cover.
  std::vector<double> totals() const;
  // The latest full bucket's counts (zeros before one filled): the load now.
  std::vector<double> latest() const;
  int64_t steps() const;
  int64_t window() const { return window_; }
  void clear();

 private:
  size_t buckets_in_window() const;  // newest buckets the window covers

  int64_t slots_, logical_, window_, bucket_steps_;
  std::vector<std::vector<int64_t>> buckets_;  // ring; the last one is being filled
  std::vector<int64_t> bucket_filled_;         // steps in each bucket
  size_t head_ = 0;                            // the bucket being filled
};

// Presets of the expert-parallel balancer (MISSION.md): redundant experts per rank, reassign
// period in steps, load window in steps.
struct eplb_policy {
  int64_t redundant_per_rank = 1;
  int64_t period_steps = 10'000;
  int64_t window_steps = 1'000;
  int64_t groups = 1, nodes = 1;  // expert groups / nodes for the hierarchical policy
  static eplb_policy prefill() { return {4, 1'000, 100, 1, 1}; }
  static eplb_policy decode() { return {1, 10'000, 1'000, 1, 1}; }
};

struct placement_plan {
  ep_placement placement;
  std::vector<double> imbalance_before, imbalance_after;  // per slot, on the same loads
  int64_t experts_moved = 0;                              // (slot, expert) weights ranks gain
  int64_t swaps = 0;
};

// The next placement for `load` (slots × logical counts) after `current`: EPLB with
// `policy`'s redundant experts, refined (refine_placement) and its ranks matched to current's
// so that as few experts as possible move; a slot the plan would not balance better keeps
// current's placement (so no slot's max/mean rises and unchanged loads move nothing).
// Epoch current.epoch() + 1.
std::expected<placement_plan, std::string> plan_placement(std::span<const double> load, const ep_placement& current,
                                                          const eplb_policy& policy);

}  // namespace shoal::runtime
