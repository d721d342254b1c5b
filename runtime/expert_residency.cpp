#include "runtime/expert_residency.hpp"

#include <algorithm>

#include "kernels/assert.hpp"
#include "model/forward.hpp"

namespace shoal::runtime {

std::expected<std::shared_ptr<expert_residency>, std::string> expert_residency::open(
  const std::string& dir, std::shared_ptr<const model::model_weights> weights) {
  auto reader = model::expert_reader::open(dir);
  if (!reader) return std::unexpected(reader.error().message);
  return std::shared_ptr<expert_residency>(new expert_residency(std::move(*reader), std::move(weights)));
}

expert_residency::expert_residency(model::expert_reader reader, std::shared_ptr<const model::model_weights> weights)
    : reader_(std::move(reader)),
      weights_(std::move(weights)),
      // The process's ranks share these weights read-only but for the routed experts, which
      // only this object changes (see the header).
      mutable_weights_(const_cast<model::model_weights&>(*weights_)),
      slots_(model::moe_slot_count(weights_->config)),
      experts_(weights_->config.n_routed_experts),
      resident_(static_cast<size_t>(slots_ * experts_), false) {
  for (int64_t s = 0; s < slots_; ++s)  // whatever the load kept counts as resident
    for (int64_t e = 0; e < experts_; ++e)
      resident_[s * experts_ + e] = !model::routed_expert_weights(mutable_weights_, s, e).gate_up.empty();
}

expert_residency::expert_set expert_residency::experts_for(const ep_placement& placement, int32_t rank,
                                                           const ep_placement* also) {
  expert_set out(static_cast<size_t>(placement.slots()));
  for (int64_t s = 0; s < placement.slots(); ++s) {
    auto mine = placement.experts_of(s, rank);
    out[s].assign(mine.begin(), mine.end());
    if (also) {
      auto more = also->experts_of(s, rank);
      out[s].insert(out[s].end(), more.begin(), more.end());
      std::sort(out[s].begin(), out[s].end());
      out[s].erase(std::unique(out[s].begin(), out[s].end()), out[s].end());
    }
  }
  return out;
}

std::expected<void, std::string> expert_residency::hold(const void* holder, const expert_set& experts) {
  std::lock_guard lock(mu_);
  SHOAL_ASSERT(static_cast<int64_t>(experts.size()) == slots_);
  std::vector<std::pair<int64_t, int64_t>> read;
  for (int64_t s = 0; s < slots_; ++s)
    for (int32_t e : experts[s]) {
      SHOAL_ASSERT(e >= 0 && e < experts_);
      if (resident_[s * experts_ + e]) continue;
      if (auto r = reader_.read(mutable_weights_, s, e); !r) {
        model::expert_reader::drop(mutable_weights_, s, e);  // a part of it may have been read
        for (auto [rs, re] : read) drop(rs, re);
        return std::unexpected("reading routed expert " + std::to_string(e) + " of MoE slot " + std::to_string(s) +
                               ": " + r.error().message);
      }
      resident_[s * experts_ + e] = true;
      read.emplace_back(s, e);
    }
  held_[holder] = experts;
  drop_unheld();
  return {};
}

void expert_residency::release(const void* holder) {
  std::lock_guard lock(mu_);
  held_.erase(holder);
  drop_unheld();
}

void expert_residency::drop(int64_t slot, int64_t expert) {
  model::expert_reader::drop(mutable_weights_, slot, expert);
  resident_[slot * experts_ + expert] = false;
}

void expert_residency::drop_unheld() {
  std::vector<bool> held(resident_.size(), false);
  for (const auto& [h, set] : held_)
    for (int64_t s = 0; s < slots_; ++s)
      for (int32_t e : set[s]) held[s * experts_ + e] = true;
  for (int64_t s = 0; s < slots_; ++s)
    for (int64_t e = 0; e < experts_; ++e)
      if (resident_[s * experts_ + e] && !held[s * experts_ + e]) drop(s, e);
}

int64_t expert_residency::resident_experts() const {
  std::lock_guard lock(mu_);
  return std::count(resident_.begin(), resident_.end(), true);
}

int64_t expert_residency::resident_bytes() const {
  std::lock_guard lock(mu_);
  int64_t bytes = 0;
  for (int64_t s = 0; s < slots_; ++s)
    for (int64_t e = 0; e < experts_; ++e)
      if (resident_[s * experts_ + e]) {
        const auto& x = model::routed_expert_weights(mutable_weights_, s, e);
        bytes += static_cast<int64_t>(x.gate_up.bytes() + x.down.bytes());
      }
  return bytes;
}

}  // namespace shoal::runtime
