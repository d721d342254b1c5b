#include "runtime/placement/eplb_controller.hpp"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

namespace shoal::runtime {

namespace {

double mean_of(const std::vector<double>& v) {
  return v.empty() ? 1.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

double max_of(const std::vector<double>& v) { return v.empty() ? 1.0 : *std::max_element(v.begin(), v.end()); }

}  // namespace

std::expected<std::optional<placement_plan>, std::string> eplb_controller::decide(
  const std::vector<rank_load_report>& reports, bool force) {
  if (reports.empty()) return std::unexpected("no rank reported");
  const rank_load_report& first = reports[0];
  if (!first.placement) return std::unexpected("rank 0 reported no placement");
  const ep_placement& place = *first.placement;
  if (place.ranks() != static_cast<int32_t>(reports.size()))
    return std::unexpected(fmt::format("rank 0's placement is for {} ranks, {} reported", place.ranks(), reports.size()));
  const size_t cells = static_cast<size_t>(place.slots() * place.logical());
  std::vector<double> window(cells, 0.0), recent(cells, 0.0);
  bool adopting = false;
  for (size_t r = 0; r < reports.size(); ++r) {
    const rank_load_report& x = reports[r];
    if (x.group != first.group) return std::unexpected(fmt::format("rank {} reports another group", r));
    if (!x.placement || x.placement->epoch() != place.epoch() || !x.placement->same_experts(place))
      return std::unexpected(fmt::format("rank {} runs another placement than rank 0 (epoch {} vs {})", r,
                                         x.placement ? x.placement->epoch() : 0, place.epoch()));
    if (x.window.size() != cells || x.recent.size() != cells)
      return std::unexpected(fmt::format("rank {} reports {} load cells, expected {}", r, x.window.size(), cells));
    for (size_t i = 0; i < cells; ++i) window[i] += x.window[i], recent[i] += x.recent[i];
    adopting = adopting || x.offered_epoch != 0;
  }
  if (!seen_ || group_ != first.group || epoch_ != place.epoch()) {
    seen_ = true;
    group_ = first.group;
    epoch_ = place.epoch();
    epoch_since_ = first.steps;
  }
  ranks_ = place.ranks();
  window_steps_ = first.window_steps;
  over_window_ = place.imbalance(window);
  now_ = place.imbalance(recent);
  pairs_.clear();
  for (const auto& x : reports) pairs_.push_back(x.pairs_computed);

  const uint64_t age = first.steps - std::min(first.steps, epoch_since_);
  if (adopting) {
    note_ = fmt::format("waiting: placement epoch {} is being adopted", place.epoch() + 1);
    return std::nullopt;
  }
  if (!force && age < static_cast<uint64_t>(policy_.period_steps)) {
    note_ = fmt::format("next plan after {} more steps", policy_.period_steps - static_cast<int64_t>(age));
    return std::nullopt;
  }
  if (std::accumulate(window.begin(), window.end(), 0.0) <= 0) {
    note_ = "no routed tokens in the window yet";
    return std::nullopt;
  }
  auto plan = plan_placement(window, place, policy_);
  if (!plan) return std::unexpected(plan.error());
  return std::optional<placement_plan>(std::move(*plan));
}

void eplb_controller::offered(const placement_plan& plan, uint64_t at_step, bool forced, int64_t expert_bytes,
                              const std::string& error) {
  if (!error.empty()) {
    note_ = "offer of placement epoch " + std::to_string(plan.placement.epoch()) + " failed: " + error;
    return;
  }
  last_ = eplb_last_plan{plan.placement.epoch(), at_step, plan.imbalance_before, plan.imbalance_after,
                         plan.experts_moved, plan.experts_moved * expert_bytes, plan.swaps, forced};
  note_ = "offered placement epoch " + std::to_string(plan.placement.epoch());
  epoch_since_ = at_step;  // the next period counts from the offer
}

std::string eplb_controller::status() const {
  std::string s = fmt::format(
    "expert-parallel balancer: policy {} redundant expert(s) per rank, plan every {} steps, window {} steps, {}\n",
    policy_.redundant_per_rank, policy_.period_steps, policy_.window_steps,
    policy_.groups > 1 && policy_.groups % policy_.nodes == 0
      ? fmt::format("hierarchical ({} expert groups over {} node(s))", policy_.groups, policy_.nodes)
      : std::string("global"));
  if (!seen_) return s + "no report from the group yet\n";
  s += fmt::format("group {:016x}: {} ranks, placement epoch {} (since step {}), window covers {} steps\n", group_,
                   ranks_, epoch_, epoch_since_, window_steps_);
  s += fmt::format("imbalance (slowest rank / mean): now mean {:.3f} max {:.3f}; over the window mean {:.3f} max {:.3f}\n",
                   mean_of(now_), max_of(now_), mean_of(over_window_), max_of(over_window_));
  s += "layer   now     window\n";
  for (size_t l = 0; l < over_window_.size(); ++l)
    s += fmt::format("{:<7} {:<7.3f} {:.3f}\n", l, l < now_.size() ? now_[l] : 1.0, over_window_[l]);
  s += "pairs computed per rank:";
  for (int64_t p : pairs_) s += " " + std::to_string(p);
  s += "\n";
  if (last_)
    s += fmt::format(
      "last plan: epoch {} at step {}{}: imbalance mean {:.3f} -> {:.3f}, max {:.3f} -> {:.3f}; {} expert weights "
      "moved ({:.3f} MB), {} swaps\n",
      last_->epoch, last_->at_step, last_->forced ? " (asked for)" : "", mean_of(last_->before), mean_of(last_->after),
      max_of(last_->before), max_of(last_->after), last_->experts_moved, last_->bytes_moved / 1e6, last_->swaps);
  else
    s += "last plan: none yet\n";
  return s + note_ + "\n";
}

}  // namespace shoal::runtime
