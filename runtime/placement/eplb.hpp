// Expert-parallel load balancing: DeepSeek's EPLB placement (deepseek-ai/EPLB eplb.py) as plain
// C++. Given each MoE layer's load per logical expert, it chooses which experts get redundant
// copies and which GPU (rank) holds each physical slot:
// - hierarchical (expert groups divide evenly over nodes): groups packed to nodes by load
//   (balanced packing: heaviest first onto the lightest node with room), replicas made within
//   each node (each extra copy to the expert with the highest load per copy), and the node's
//   physical experts packed to its GPUs the same way;
// - global (otherwise): the same with one group and one node.
// Ties are broken deterministically (a stable sort by load, lowest index first), where EPLB's
// torch.sort is unstable, so placements can differ from EPLB's where loads tie; the loads per
// GPU they give do not.
#pragma once

#include <cstdint>
#include <expected>
#include <span>
#include <string>
#include <vector>

namespace shoal::runtime {

struct eplb_shape {
  int64_t layers = 0, logical = 0;  // MoE layers, logical experts per layer
  int64_t physical = 0;             // physical slots per layer (logical + redundant), a multiple of gpus
  int64_t groups = 1, nodes = 1, gpus = 1;
};

struct eplb_plan {
  eplb_shape shape;
  // Row-major per layer: phy2log[l·physical + s] the logical expert in slot s (slots of GPU g
  // are [g·physical/gpus, (g+1)·physical/gpus)); phyrank its replica index; logcnt[l·logical + e]
  // its number of replicas; log2phy[(l·logical + e)·max_replicas + r] the slot of replica r (−1 past).
  std::vector<int32_t> phy2log, phyrank, logcnt, log2phy;
  int32_t max_replicas = 0;
  bool hierarchical = false;
};

// `weight`: layers × logical loads (token counts), row-major. Errors name the violated rule.
std::expected<eplb_plan, std::string> rebalance_experts(std::span<const double> weight, const eplb_shape& shape);

// Refines a plan: per layer, swaps of two slots between GPUs (within a node under the
// hierarchical policy, so groups stay on their nodes) while a swap lowers the larger of the two
// GPUs' loads, the most loaded GPU first, so no layer's max/mean ever rises above the plan's;
// then, given the placement now running (`previous`, same shape), each node's GPUs are matched
// to the previous GPUs that already hold the most of their experts and each GPU's slots keep
// the experts they had, so as few expert weights move as possible. moved: per layer, the slots
// whose expert the GPU did not hold before (all of them without `previous`).
struct eplb_refined {
  eplb_plan plan;
  std::vector<int64_t> moved;
  int64_t swaps = 0;
};
eplb_refined refine_placement(std::span<const double> weight, const eplb_plan& plan, const eplb_plan* previous);

// Slots per layer of `next` whose expert their GPU did not hold in `previous`.
std::vector<int64_t> experts_moved(const eplb_plan& previous, const eplb_plan& next);

// Per layer: max / mean of the GPUs' loads, a replica carrying its expert's load / replica count
// (EPLB's measure; 1.0 = perfect). With no plan: each GPU holds logical / gpus contiguous experts.
std::vector<double> gpu_max_over_mean(std::span<const double> weight, const eplb_shape& shape, const eplb_plan* plan);

}  // namespace shoal::runtime
