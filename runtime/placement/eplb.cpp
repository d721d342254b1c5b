#include "runtime/placement/eplb.hpp"

#include <algorithm>
#include <numeric>
#include <tuple>

namespace shoal::runtime {

namespace {

// Loads are float, as EPLB computes them (weight.float()), so equal inputs round alike.
using row = std::vector<float>;

// Items (in `weight` order) into `packs` packs of equal item count, heaviest item first onto the
// lightest pack that still has room (the first such pack on ties). pack[i], rank[i] per item.
void balanced_packing(const row& weight, int64_t packs, std::vector<int64_t>& pack, std::vector<int64_t>& rank) {
  const auto n = static_cast<int64_t>(weight.size());
  const int64_t per = n / packs;
  pack.assign(static_cast<size_t>(n), 0);
  rank.assign(static_cast<size_t>(n), 0);
  if (per == 1) {
    std::iota(pack.begin(), pack.end(), int64_t{0});
    return;
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return weight[a] > weight[b]; });
  std::vector<float> load(static_cast<size_t>(packs), 0.0f);
  std::vector<int64_t> items(static_cast<size_t>(packs), 0);
  for (int64_t item : order) {
    int64_t best = -1;
    for (int64_t p = 0; p < packs; ++p)
      if (items[p] < per && (best < 0 || load[p] < load[best])) best = p;
    pack[item] = best;
    rank[item] = items[best]++;
    load[best] += weight[item];
  }
}

// `weight` (one row of logical experts) onto `physical` slots: slots [0, logical) hold each
// expert once, every further slot a copy of the expert with the highest load per copy (the
// first on ties). phy2log, rank per slot; cnt per expert.
void replicate_experts(const row& weight, int64_t physical, std::vector<int64_t>& phy2log, std::vector<int64_t>& rank,
                       std::vector<int64_t>& cnt) {
  const auto logical = static_cast<int64_t>(weight.size());
  phy2log.resize(static_cast<size_t>(physical));
  rank.assign(static_cast<size_t>(physical), 0);
  cnt.assign(static_cast<size_t>(logical), 1);
  std::iota(phy2log.begin(), phy2log.begin() + logical, int64_t{0});
  for (int64_t s = logical; s < physical; ++s) {
    int64_t best = 0;
    float best_v = weight[0] / static_cast<float>(cnt[0]);
    for (int64_t e = 1; e < logical; ++e)
      if (const float v = weight[e] / static_cast<float>(cnt[e]); v > best_v) best = e, best_v = v;
    phy2log[s] = best;
    rank[s] = cnt[best]++;
  }
}

}  // namespace

std::expected<eplb_plan, std::string> rebalance_experts(std::span<const double> weight, const eplb_shape& in) {
  eplb_shape sh = in;
  if (sh.layers < 1 || sh.logical < 1) return std::unexpected("eplb: layers and logical experts must be positive");
  if (static_cast<int64_t>(weight.size()) != sh.layers * sh.logical)
    return std::unexpected("eplb: " + std::to_string(weight.size()) + " loads for " + std::to_string(sh.layers) +
                           " layers × " + std::to_string(sh.logical) + " experts");
  if (sh.groups < 1 || sh.nodes < 1 || sh.gpus < 1) return std::unexpected("eplb: groups, nodes and gpus must be positive");
  if (sh.logical % sh.groups != 0) return std::unexpected("eplb: logical experts must be a multiple of the groups");
  if (sh.gpus % sh.nodes != 0) return std::unexpected("eplb: gpus must be a multiple of the nodes");
  if (sh.physical < sh.logical || sh.physical % sh.gpus != 0)
    return std::unexpected("eplb: physical slots must be at least the logical experts and a multiple of the gpus");
  eplb_plan plan;
  plan.hierarchical = sh.groups % sh.nodes == 0;
  // The global policy is the hierarchical one with one group on one node.
  const int64_t groups = plan.hierarchical ? sh.groups : 1, nodes = plan.hierarchical ? sh.nodes : 1;
  const int64_t group_size = sh.logical / groups, groups_per_node = groups / nodes;
  const int64_t log_per_node = sh.logical / nodes, phy_per_node = sh.physical / nodes;
  if (phy_per_node < log_per_node || (sh.physical % nodes) != 0 || phy_per_node % (sh.gpus / nodes) != 0)
    return std::unexpected("eplb: physical slots do not divide over the nodes' gpus");
  const int64_t phy_per_gpu = sh.physical / sh.gpus, gpus_per_node = sh.gpus / nodes;
  plan.shape = sh;
  plan.phy2log.assign(static_cast<size_t>(sh.layers * sh.physical), 0);
  plan.phyrank.assign(plan.phy2log.size(), 0);
  plan.logcnt.assign(static_cast<size_t>(sh.layers * sh.logical), 0);
  std::vector<int64_t> gpack, grank, log2mlog(static_cast<size_t>(sh.logical)), mlog2log(static_cast<size_t>(sh.logical));
  std::vector<int64_t> phy2mlog, phyrank, mlogcnt, pack, rank;
  for (int64_t l = 0; l < sh.layers; ++l) {
    const double* w = weight.data() + l * sh.logical;
    // 1: groups to nodes; node-major ("mlog") order of the logical experts.
    row group_load(static_cast<size_t>(groups), 0.0f);
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t k = 0; k < group_size; ++k) group_load[g] += static_cast<float>(w[g * group_size + k]);
    balanced_packing(group_load, nodes, gpack, grank);
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t k = 0; k < group_size; ++k) {
        const int64_t m = (gpack[g] * groups_per_node + grank[g]) * group_size + k;
        log2mlog[g * group_size + k] = m;
        mlog2log[m] = g * group_size + k;
      }
    for (int64_t n = 0; n < nodes; ++n) {
      // 2: replicas within the node; 3: its physical experts to its gpus.
      row node_load(static_cast<size_t>(log_per_node));
      for (int64_t k = 0; k < log_per_node; ++k) node_load[k] = static_cast<float>(w[mlog2log[n * log_per_node + k]]);
      replicate_experts(node_load, phy_per_node, phy2mlog, phyrank, mlogcnt);
      row phy_load(static_cast<size_t>(phy_per_node));
      for (int64_t s = 0; s < phy_per_node; ++s)
        phy_load[s] = node_load[phy2mlog[s]] / static_cast<float>(mlogcnt[phy2mlog[s]]);
      balanced_packing(phy_load, gpus_per_node, pack, rank);
      for (int64_t s = 0; s < phy_per_node; ++s) {
        const int64_t slot = n * phy_per_node + pack[s] * phy_per_gpu + rank[s];
        plan.phy2log[l * sh.physical + slot] = static_cast<int32_t>(mlog2log[n * log_per_node + phy2mlog[s]]);
        plan.phyrank[l * sh.physical + slot] = static_cast<int32_t>(phyrank[s]);
      }
      for (int64_t k = 0; k < log_per_node; ++k)
        plan.logcnt[l * sh.logical + mlog2log[n * log_per_node + k]] = static_cast<int32_t>(mlogcnt[k]);
    }
  }
  plan.max_replicas = *std::max_element(plan.logcnt.begin(), plan.logcnt.end());
  plan.log2phy.assign(static_cast<size_t>(sh.layers * sh.logical * plan.max_replicas), -1);
  for (int64_t l = 0; l < sh.layers; ++l)
    for (int64_t s = 0; s < sh.physical; ++s) {
      const int64_t e = plan.phy2log[l * sh.physical + s], r = plan.phyrank[l * sh.physical + s];
      plan.log2phy[(l * sh.logical + e) * plan.max_replicas + r] = static_cast<int32_t>(s);
    }
  return plan;
}

namespace {

void rebuild_log2phy(eplb_plan& p) {
  const eplb_shape& sh = p.shape;
  std::vector<int32_t> next(static_cast<size_t>(sh.logical), 0);
  p.log2phy.assign(static_cast<size_t>(sh.layers * sh.logical * p.max_replicas), -1);
  for (int64_t l = 0; l < sh.layers; ++l) {
    std::fill(next.begin(), next.end(), 0);
    for (int64_t s = 0; s < sh.physical; ++s) {
      const int32_t e = p.phy2log[l * sh.physical + s];
      const int32_t r = next[e]++;
      p.phyrank[l * sh.physical + s] = r;
      p.log2phy[(l * sh.logical + e) * p.max_replicas + r] = static_cast<int32_t>(s);
    }
  }
}

}  // namespace

std::vector<int64_t> experts_moved(const eplb_plan& previous, const eplb_plan& next) {
  const eplb_shape& sh = next.shape;
  const int64_t per = sh.physical / sh.gpus;
  std::vector<int64_t> out;
  for (int64_t l = 0; l < sh.layers; ++l) {
    int64_t moved = 0;
    for (int64_t g = 0; g < sh.gpus; ++g) {
      std::vector<int32_t> had(previous.phy2log.begin() + l * sh.physical + g * per,
                               previous.phy2log.begin() + l * sh.physical + (g + 1) * per);
      for (int64_t k = 0; k < per; ++k) {
        auto it = std::find(had.begin(), had.end(), next.phy2log[l * sh.physical + g * per + k]);
        if (it == had.end()) ++moved;
        else *it = -1;  // each held copy counts once
      }
    }
    out.push_back(moved);
  }
  return out;
}

namespace {

// The GPUs of one node of layer l's plan (node n, gpn GPUs of `per` slots): swaps of replicas
// between its most loaded GPU and another while that lowers the larger of the two loads.
int64_t swap_balance(std::span<const double> weight, eplb_plan& p, int64_t l, int64_t n, int64_t gpn, int64_t per) {
  const eplb_shape& sh = p.shape;
  int32_t* slots = p.phy2log.data() + l * sh.physical;
  const auto replica_load = [&](int64_t s) { return weight[l * sh.logical + slots[s]] / p.logcnt[l * sh.logical + slots[s]]; };
  int64_t swaps = 0;
  std::vector<double> load(static_cast<size_t>(gpn), 0.0);
  for (int64_t g = 0; g < gpn; ++g)
    for (int64_t k = 0; k < per; ++k) load[g] += replica_load((n * gpn + g) * per + k);
  for (int guard = 0; guard < 10000; ++guard) {
    const int64_t a = std::max_element(load.begin(), load.end()) - load.begin();
    // The best swap of a slot of GPU a with a slot of another GPU: the lowest resulting
    // max of the two loads, taken only when below a's load now.
    double best = load[a];
    int64_t bs = -1, bt = -1, bb = -1;
    for (int64_t b = 0; b < gpn; ++b) {
      if (b == a) continue;
      for (int64_t i = 0; i < per; ++i)
        for (int64_t j = 0; j < per; ++j) {
          const int64_t s = (n * gpn + a) * per + i, t = (n * gpn + b) * per + j;
          const double d = replica_load(s) - replica_load(t);
          if (d <= 0) continue;
          const double m = std::max(load[a] - d, load[b] + d);
          if (m < best - 1e-12 * load[a]) best = m, bs = s, bt = t, bb = b;
        }
    }
    if (bs < 0) break;
    const double d = replica_load(bs) - replica_load(bt);
    load[a] -= d, load[bb] += d;
    std::swap(slots[bs], slots[bt]);
    ++swaps;
  }
  return swaps;
}

// Layer l of `p` with its GPUs' expert sets kept where `previous` had them: each new GPU of a
// node matched to the old GPU of that node holding most of its experts (greedy, largest
// overlap first), then each GPU's experts in the slots that already hold them.
void keep_in_place(eplb_plan& p, const eplb_plan& previous, int64_t l, int64_t nodes, int64_t gpn, int64_t per) {
  const eplb_shape& sh = p.shape;
  int32_t* slots = p.phy2log.data() + l * sh.physical;
  const int32_t* old = previous.phy2log.data() + l * sh.physical;
  std::vector<int32_t> moved_slots(slots, slots + sh.physical);
  for (int64_t n = 0; n < nodes; ++n) {
    std::vector<std::tuple<int64_t, int64_t, int64_t>> pairs;  // (−overlap, new gpu, old gpu)
    for (int64_t g = 0; g < gpn; ++g)
      for (int64_t h = 0; h < gpn; ++h) {
        std::vector<int32_t> had(old + (n * gpn + h) * per, old + (n * gpn + h + 1) * per);
        int64_t common = 0;
        for (int64_t k = 0; k < per; ++k)
          if (auto it = std::find(had.begin(), had.end(), slots[(n * gpn + g) * per + k]); it != had.end()) ++common, *it = -1;
        pairs.emplace_back(-common, g, h);
      }
    std::sort(pairs.begin(), pairs.end());
    std::vector<int64_t> target(static_cast<size_t>(gpn), -1);
    std::vector<bool> taken(static_cast<size_t>(gpn), false);
    for (auto [c, g, h] : pairs)
      if (target[g] < 0 && !taken[h]) target[g] = h, taken[h] = true;
    for (int64_t g = 0; g < gpn; ++g) {
      const int64_t h = target[g];
      std::vector<int32_t> mine(slots + (n * gpn + g) * per, slots + (n * gpn + g + 1) * per);
      int32_t* dst = moved_slots.data() + (n * gpn + h) * per;
      std::vector<bool> used(static_cast<size_t>(per), false), placed(static_cast<size_t>(per), false);
      for (int64_t k = 0; k < per; ++k)  // experts already in slot k of the old GPU stay there
        for (int64_t i = 0; i < per; ++i)
          if (!placed[i] && mine[i] == old[(n * gpn + h) * per + k]) {
            dst[k] = mine[i], used[k] = true, placed[i] = true;
            break;
          }
      int64_t k = 0;
      for (int64_t i = 0; i < per; ++i) {
        if (placed[i]) continue;
        while (used[k]) ++k;
        dst[k] = mine[i], used[k] = true;
      }
    }
  }
  std::copy(moved_slots.begin(), moved_slots.end(), slots);
}

}  // namespace

eplb_refined refine_placement(std::span<const double> weight, const eplb_plan& plan, const eplb_plan* previous) {
  eplb_refined out;
  out.plan = plan;
  eplb_plan& p = out.plan;
  const eplb_shape& sh = p.shape;
  const int64_t per = sh.physical / sh.gpus;
  const int64_t nodes = p.hierarchical ? sh.nodes : 1, gpn = sh.gpus / nodes;
  for (int64_t l = 0; l < sh.layers; ++l) {
    for (int64_t n = 0; n < nodes; ++n) out.swaps += swap_balance(weight, p, l, n, gpn, per);
    if (previous) keep_in_place(p, *previous, l, nodes, gpn, per);
  }
  rebuild_log2phy(p);
  if (previous) {
    out.moved = experts_moved(*previous, p);
  } else {
    out.moved.assign(static_cast<size_t>(sh.layers), sh.physical);
  }
  return out;
}

std::vector<double> gpu_max_over_mean(std::span<const double> weight, const eplb_shape& sh, const eplb_plan* plan) {
  std::vector<double> out;
  for (int64_t l = 0; l < sh.layers; ++l) {
    const double* w = weight.data() + l * sh.logical;
    std::vector<double> load(static_cast<size_t>(sh.gpus), 0.0);
    if (plan) {
      const int64_t per = sh.physical / sh.gpus;
      for (int64_t s = 0; s < sh.physical; ++s) {
        const int32_t e = plan->phy2log[l * sh.physical + s];
        load[s / per] += w[e] / plan->logcnt[l * sh.logical + e];
      }
    } else {
      const int64_t per = sh.logical / sh.gpus;
      for (int64_t e = 0; e < sh.logical; ++e) load[std::min(e / per, sh.gpus - 1)] += w[e];
    }
    const double mean = std::accumulate(load.begin(), load.end(), 0.0) / static_cast<double>(sh.gpus);
    out.push_back(mean > 0 ? *std::max_element(load.begin(), load.end()) / mean : 1.0);
  }
  return out;
}

}  // namespace shoal::runtime
