#include "runtime/placement/expert_placement.hpp"

#include <algorithm>
#include <numeric>

#include "kernels/assert.hpp"

namespace shoal::runtime {

// ---- ep_placement ----

ep_placement ep_placement::contiguous(int64_t slots, int64_t logical, int32_t ranks) {
  SHOAL_ASSERT(slots >= 0 && logical >= 1 && ranks >= 1);
  ep_placement p;
  p.slots_ = slots, p.logical_ = logical, p.ranks_ = ranks;
  p.per_rank_.resize(static_cast<size_t>(slots * ranks));
  for (int64_t s = 0; s < slots; ++s)
    for (int32_t r = 0; r < ranks; ++r)
      for (int64_t e = r * logical / ranks; e < (r + 1) * logical / ranks; ++e)
        p.per_rank_[s * ranks + r].push_back(static_cast<int32_t>(e));
  p.index();
  return p;
}

std::expected<ep_placement, std::string> ep_placement::from_plan(const eplb_plan& plan, uint64_t epoch) {
  const eplb_shape& sh = plan.shape;
  if (sh.layers < 0 || sh.logical < 1 || sh.gpus < 1 || sh.physical < sh.logical || sh.physical % sh.gpus != 0)
    return std::unexpected("placement plan shape is invalid (logical " + std::to_string(sh.logical) + ", physical " +
                           std::to_string(sh.physical) + ", gpus " + std::to_string(sh.gpus) + ")");
  if (plan.phy2log.size() != static_cast<size_t>(sh.layers * sh.physical))
    return std::unexpected("placement plan phy2log has " + std::to_string(plan.phy2log.size()) + " entries, expected " +
                           std::to_string(sh.layers * sh.physical));
  ep_placement p;
  p.slots_ = sh.layers, p.logical_ = sh.logical, p.ranks_ = static_cast<int32_t>(sh.gpus), p.epoch_ = epoch;
  p.plan_ = std::make_shared<const eplb_plan>(plan);
  p.per_rank_.resize(static_cast<size_t>(sh.layers * sh.gpus));
  const int64_t per = sh.physical / sh.gpus;
  for (int64_t s = 0; s < sh.layers; ++s) {
    std::vector<bool> seen(static_cast<size_t>(sh.logical), false);
    for (int64_t g = 0; g < sh.gpus; ++g) {
      auto& list = p.per_rank_[s * sh.gpus + g];
      for (int64_t i = 0; i < per; ++i) {
        const int32_t e = plan.phy2log[s * sh.physical + g * per + i];
        if (e < 0 || e >= sh.logical)
          return std::unexpected("placement plan layer " + std::to_string(s) + " slot " + std::to_string(g * per + i) +
                                 ": expert " + std::to_string(e) + " outside [0, " + std::to_string(sh.logical) + ")");
        list.push_back(e);
        seen[e] = true;
      }
      std::sort(list.begin(), list.end());
      list.erase(std::unique(list.begin(), list.end()), list.end());
    }
    for (int64_t e = 0; e < sh.logical; ++e)
      if (!seen[e])
        return std::unexpected("placement plan layer " + std::to_string(s) + " places no copy of expert " +
                               std::to_string(e));
  }
  p.index();
  return p;
}

std::expected<ep_placement, std::string> ep_placement::from_lists(int64_t slots, int64_t logical, int32_t ranks,
                                                                  uint64_t epoch,
                                                                  std::vector<std::vector<int32_t>> lists) {
  if (slots < 0 || logical < 1 || ranks < 1 || slots > (int64_t{1} << 20) || logical > (int64_t{1} << 20) ||
      ranks > (1 << 20))
    return std::unexpected("placement shape " + std::to_string(slots) + " slots × " + std::to_string(logical) +
                           " experts × " + std::to_string(ranks) + " ranks is invalid");
  if (lists.size() != static_cast<size_t>(slots * ranks))
    return std::unexpected("placement has " + std::to_string(lists.size()) + " expert lists, expected " +
                           std::to_string(slots * ranks) + " (slots × ranks)");
  for (int64_t s = 0; s < slots; ++s) {
    std::vector<bool> seen(static_cast<size_t>(logical), false);
    for (int32_t r = 0; r < ranks; ++r) {
      const auto& list = lists[s * ranks + r];
      for (size_t i = 0; i < list.size(); ++i) {
        if (list[i] < 0 || list[i] >= logical)
          return std::unexpected("placement slot " + std::to_string(s) + " rank " + std::to_string(r) + ": expert " +
                                 std::to_string(list[i]) + " outside [0, " + std::to_string(logical) + ")");
        if (i > 0 && list[i] <= list[i - 1])
          return std::unexpected("placement slot " + std::to_string(s) + " rank " + std::to_string(r) +
                                 ": experts not strictly ascending");
        seen[list[i]] = true;
      }
    }
    for (int64_t e = 0; e < logical; ++e)
      if (!seen[e])
        return std::unexpected("placement slot " + std::to_string(s) + " places no copy of expert " + std::to_string(e));
  }
  ep_placement p;
  p.slots_ = slots, p.logical_ = logical, p.ranks_ = ranks, p.epoch_ = epoch;
  p.per_rank_ = std::move(lists);
  p.index();
  return p;
}

void ep_placement::index() {
  replicas_.assign(static_cast<size_t>(slots_ * logical_), {});
  for (int64_t s = 0; s < slots_; ++s)
    for (int32_t r = 0; r < ranks_; ++r)
      for (int32_t e : per_rank_[s * ranks_ + r]) replicas_[s * logical_ + e].push_back(r);
}

std::span<const int32_t> ep_placement::experts_of(int64_t slot, int32_t rank) const {
  SHOAL_ASSERT(slot >= 0 && slot < slots_ && rank >= 0 && rank < ranks_);
  return per_rank_[slot * ranks_ + rank];
}

bool ep_placement::holds(int64_t slot, int32_t rank, int64_t expert) const {
  auto list = experts_of(slot, rank);
  return std::binary_search(list.begin(), list.end(), static_cast<int32_t>(expert));
}

std::span<const int32_t> ep_placement::replicas(int64_t slot, int64_t expert) const {
  SHOAL_ASSERT(slot >= 0 && slot < slots_ && expert >= 0 && expert < logical_);
  return replicas_[slot * logical_ + expert];
}

int32_t ep_placement::replica_for(int64_t slot, int64_t expert, int32_t sender, int64_t n) const {
  auto reps = replicas(slot, expert);
  SHOAL_ASSERT(!reps.empty());
  return reps[static_cast<size_t>((n + sender) % static_cast<int64_t>(reps.size()))];
}

int64_t ep_placement::gained(const ep_placement& before, int32_t rank) const {
  SHOAL_ASSERT(before.slots_ == slots_ && before.logical_ == logical_);
  int64_t n = 0;
  for (int64_t s = 0; s < slots_; ++s)
    for (int32_t e : experts_of(s, rank)) n += rank >= before.ranks_ || !before.holds(s, rank, e);
  return n;
}

std::vector<double> ep_placement::imbalance(std::span<const double> load) const {
  SHOAL_ASSERT(load.size() == static_cast<size_t>(slots_ * logical_));
  std::vector<double> out;
  for (int64_t s = 0; s < slots_; ++s) {
    std::vector<double> per(static_cast<size_t>(ranks_), 0.0);
    double total = 0;
    for (int64_t e = 0; e < logical_; ++e) {
      auto reps = replicas(s, e);
      total += load[s * logical_ + e];
      for (int32_t r : reps) per[r] += load[s * logical_ + e] / static_cast<double>(reps.size());
    }
    const double mean = total / ranks_;
    out.push_back(mean > 0 ? *std::max_element(per.begin(), per.end()) / mean : 1.0);
  }
  return out;
}

void ep_placement::take_slot(const ep_placement& from, int64_t slot) {
  SHOAL_ASSERT(from.slots_ == slots_ && from.logical_ == logical_ && from.ranks_ == ranks_);
  for (int32_t r = 0; r < ranks_; ++r) per_rank_[slot * ranks_ + r] = from.per_rank_[slot * ranks_ + r];
  if (plan_ && from.plan_ && from.plan_->shape.physical == plan_->shape.physical &&
      from.plan_->max_replicas == plan_->max_replicas) {
    auto p = std::make_shared<eplb_plan>(*plan_);
    const int64_t ph = p->shape.physical, lg = logical_ * p->max_replicas;
    std::copy_n(from.plan_->phy2log.begin() + slot * ph, ph, p->phy2log.begin() + slot * ph);
    std::copy_n(from.plan_->phyrank.begin() + slot * ph, ph, p->phyrank.begin() + slot * ph);
    std::copy_n(from.plan_->logcnt.begin() + slot * logical_, logical_, p->logcnt.begin() + slot * logical_);
    std::copy_n(from.plan_->log2phy.begin() + slot * lg, lg, p->log2phy.begin() + slot * lg);
    plan_ = std::move(p);
  } else {
    plan_.reset();
  }
  index();
}

// ---- expert_load_window ----

namespace {
constexpr int64_t window_buckets = 10;
}

expert_load_window::expert_load_window(int64_t slots, int64_t logical, int64_t window)
    : slots_(slots), logical_(logical), window_(window), bucket_steps_(std::max<int64_t>(1, window / window_buckets)) {
  SHOAL_ASSERT(slots >= 0 && logical >= 1 && window >= 1);
  clear();
}

void expert_load_window::clear() {
  const int64_t n = (window_ + bucket_steps_ - 1) / bucket_steps_ + 1;  // full buckets + the one filling
  buckets_.assign(static_cast<size_t>(n), std::vector<int64_t>(static_cast<size_t>(slots_ * logical_), 0));
  bucket_filled_.assign(static_cast<size_t>(n), 0);
  head_ = 0;
}

void expert_load_window::count(int64_t slot, std::span<const int32_t> ids) {
  SHOAL_ASSERT(slot >= 0 && slot < slots_);
  auto& b = buckets_[head_];
  for (int32_t e : ids) {
    SHOAL_ASSERT(e >= 0 && e < logical_);
    ++b[slot * logical_ + e];
  }
}

void expert_load_window::end_step() {
  if (++bucket_filled_[head_] < bucket_steps_) return;
  head_ = (head_ + 1) % buckets_.size();
  // the oldest bucket leaves the window when its steps plus the full ones would pass it
  std::fill(buckets_[head_].begin(), buckets_[head_].end(), 0);
  bucket_filled_[head_] = 0;
}

// Newest first; a bucket counts while the steps so far plus it stay within the window.
size_t expert_load_window::buckets_in_window() const {
  int64_t steps = 0;
  size_t i = 0;
  for (; i < buckets_.size(); ++i) {
    const size_t b = (head_ + buckets_.size() - i) % buckets_.size();
    if (steps + bucket_filled_[b] > window_) break;
    steps += bucket_filled_[b];
  }
  return i;
}

std::vector<double> expert_load_window::totals() const {
  std::vector<double> out(static_cast<size_t>(slots_ * logical_), 0.0);
  for (size_t i = 0, n = buckets_in_window(); i < n; ++i) {
    const auto& b = buckets_[(head_ + buckets_.size() - i) % buckets_.size()];
    for (size_t j = 0; j < out.size(); ++j) out[j] += static_cast<double>(b[j]);
  }
  return out;
}

std::vector<double> expert_load_window::latest() const {
  const size_t b = (head_ + buckets_.size() - 1) % buckets_.size();  // the newest full bucket
  std::vector<double> out(buckets_[b].begin(), buckets_[b].end());
  return out;
}

int64_t expert_load_window::steps() const {
  int64_t steps = 0;
  for (size_t i = 0, n = buckets_in_window(); i < n; ++i)
    steps += bucket_filled_[(head_ + buckets_.size() - i) % buckets_.size()];
  return steps;
}

// ---- plan_placement ----

namespace {

// Reorders the GPU chunks of each layer of `plan` (within each node) so that GPU g's experts
// overlap most with what rank g computes in `current`: greedy, the pair sharing the most
// experts first. log2phy follows.
void match_ranks(eplb_plan& plan, const ep_placement& current) {
  const eplb_shape& sh = plan.shape;
  const int64_t per = sh.physical / sh.gpus;
  const int64_t nodes = plan.hierarchical ? sh.nodes : 1, gpn = sh.gpus / nodes;
  for (int64_t l = 0; l < sh.layers; ++l) {
    std::vector<int32_t> row(plan.phy2log.begin() + l * sh.physical, plan.phy2log.begin() + (l + 1) * sh.physical);
    std::vector<int32_t> rrow(plan.phyrank.begin() + l * sh.physical, plan.phyrank.begin() + (l + 1) * sh.physical);
    for (int64_t node = 0; node < nodes; ++node) {
      const int64_t g0 = node * gpn;
      std::vector<std::vector<int64_t>> shared(static_cast<size_t>(gpn), std::vector<int64_t>(static_cast<size_t>(gpn)));
      for (int64_t a = 0; a < gpn; ++a)      // new GPU g0 + a
        for (int64_t b = 0; b < gpn; ++b) {  // old rank g0 + b
          const auto r = static_cast<int32_t>(g0 + b);
          if (r >= current.ranks()) continue;
          std::vector<int32_t> mine(row.begin() + (g0 + a) * per, row.begin() + (g0 + a + 1) * per);
          std::sort(mine.begin(), mine.end());
          mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
          for (int32_t e : mine) shared[a][b] += current.holds(l, r, e);
        }
      std::vector<int64_t> target(static_cast<size_t>(gpn), -1);
      std::vector<bool> taken(static_cast<size_t>(gpn), false);
      for (int64_t round = 0; round < gpn; ++round) {
        int64_t ba = -1, bb = -1;
        for (int64_t a = 0; a < gpn; ++a)
          for (int64_t b = 0; b < gpn && target[a] < 0; ++b)
            if (!taken[b] && (ba < 0 || shared[a][b] > shared[ba][bb])) ba = a, bb = b;
        target[ba] = bb;
        taken[bb] = true;
      }
      for (int64_t a = 0; a < gpn; ++a)
        for (int64_t i = 0; i < per; ++i) {
          plan.phy2log[l * sh.physical + (g0 + target[a]) * per + i] = row[(g0 + a) * per + i];
          plan.phyrank[l * sh.physical + (g0 + target[a]) * per + i] = rrow[(g0 + a) * per + i];
        }
    }
    for (int64_t s = 0; s < sh.physical; ++s) {
      const int64_t e = plan.phy2log[l * sh.physical + s], r = plan.phyrank[l * sh.physical + s];
      plan.log2phy[(l * sh.logical + e) * plan.max_replicas + r] = static_cast<int32_t>(s);
    }
  }
}

}  // namespace

std::expected<placement_plan, std::string> plan_placement(std::span<const double> load, const ep_placement& current,
                                                          const eplb_policy& policy) {
  if (load.size() != static_cast<size_t>(current.slots() * current.logical()))
    return std::unexpected("expert loads have " + std::to_string(load.size()) + " entries, expected " +
                           std::to_string(current.slots() * current.logical()));
  if (policy.redundant_per_rank < 0) return std::unexpected("redundant experts per rank is negative");
  eplb_shape sh;
  sh.layers = current.slots();
  sh.logical = current.logical();
  sh.gpus = current.ranks();
  sh.physical = std::max<int64_t>(sh.logical, 1);
  // every rank the same number of physical slots: round up, then the redundant copies
  sh.physical = (sh.physical + sh.gpus - 1) / sh.gpus * sh.gpus + policy.redundant_per_rank * sh.gpus;
  sh.groups = policy.groups;
  sh.nodes = policy.nodes;
  auto plan = rebalance_experts(load, sh);
  if (!plan) return std::unexpected(plan.error());
  const eplb_plan* prev = current.plan();
  if (prev && !(prev->shape.physical == sh.physical && prev->shape.gpus == sh.gpus && prev->shape.layers == sh.layers))
    prev = nullptr;
  eplb_refined refined = refine_placement(load, *plan, prev);
  match_ranks(refined.plan, current);
  auto next = ep_placement::from_plan(refined.plan, current.epoch() + 1);
  if (!next) return std::unexpected(next.error());
  placement_plan out{std::move(*next), current.imbalance(load), {}, 0, refined.swaps};
  out.imbalance_after = out.placement.imbalance(load);
  for (int64_t s = 0; s < sh.layers; ++s)
    if (out.imbalance_before[s] <= out.imbalance_after[s]) {
      out.placement.take_slot(current, s);
      out.imbalance_after[s] = out.imbalance_before[s];
    }
  for (int32_t r = 0; r < current.ranks(); ++r) out.experts_moved += out.placement.gained(current, r);
  return out;
}

}  // namespace shoal::runtime
