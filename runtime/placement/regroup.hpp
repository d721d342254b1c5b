// The placement an expert-parallel group starts with when its membership changes (a rank
// lost, hung, restarted or resumed). Every rank of the new group brings a group_view — the
// placement it ran in its previous group, renumbered to the new group's ranks, and what its
// process holds in memory — and every rank computes regroup_placement over the same views
// (the group exchanges them before its first step), so all agree without a coordinator:
// - the basis is the newest placement brought (highest epoch; ties: the lowest rank's). A
//   survivor's is newer than a resumed rank's stale one: a re-formation raises the epoch;
// - survivors keep exactly what the basis gives them (no survivor moves an expert). A
//   redundant copy of a lost rank's expert on a survivor is simply kept;
// - an expert no survivor computes any more (the lost rank held its only copies) goes to a
//   rank whose process still holds it in memory, else to the rank computing the fewest;
// - a rank the basis does not know (it joins) takes experts from the ranks above the
//   balanced share, those its process still holds first, until it has its share: the
//   fewest moves that balance the expert count.
// Without any basis (every rank fresh) the group starts from contiguous blocks at epoch 0.
#pragma once

#include <cstdint>
#include <expected>
#include <string>
#include <vector>

#include "runtime/placement/expert_placement.hpp"

namespace shoal::runtime {

struct group_view {
  bool has_basis = false;
  uint64_t epoch = 0;                       // the basis's placement epoch
  std::vector<uint8_t> known;               // [rank]: 1 when the basis places that rank
  std::vector<std::vector<int32_t>> lists;  // [slot·ranks + rank]: experts, ascending (empty where unknown)
  std::vector<std::vector<int32_t>> holds;  // [slot]: experts the sender's process holds, ascending
};

// A view with no basis (its holds given, or none).
group_view fresh_view(int64_t slots, std::vector<std::vector<int32_t>> holds = {});
// `placement` (of the previous group) renumbered: moved[o] is the new rank of previous rank o,
// or −1 when it is not in the new group of `ranks` ranks.
group_view view_of(const ep_placement& placement, const std::vector<int32_t>& moved, int32_t ranks);
// A view renumbered the same way (a group that changed again before it agreed).
group_view renumber(const group_view& v, int64_t slots, const std::vector<int32_t>& moved, int32_t ranks);

struct regroup_result {
  ep_placement placement;
  int32_t basis_rank = -1;    // whose view was the basis (−1: none, contiguous)
  int64_t orphans = 0;        // (slot, expert) no known rank computed
  int64_t moved_to_new = 0;   // (slot, expert) given to joining ranks from others
};
// views[r] is rank r's; each view must have `slots` holds and slots·ranks lists. Errors name
// the view and the field (views arrive from other processes).
std::expected<regroup_result, std::string> regroup_placement(int64_t slots, int64_t logical, int32_t ranks,
                                                             const std::vector<group_view>& views);

}  // namespace shoal::runtime
