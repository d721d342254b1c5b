#include "runtime/expert_residency.hpp"

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
      resident_(static_cast<size_t>(experts_), false) {
  for (int64_t e = 0; e < experts_; ++e)  // whatever the load kept counts as resident
    resident_[e] = slots_ > 0 && !model::routed_expert_weights(mutable_weights_, 0, e).gate_up.empty();
}

std::expected<void, std::string> expert_residency::hold(const void* holder, expert_range range) {
  std::lock_guard lock(mu_);
  std::vector<int64_t> read;
  for (int64_t e = range.first; e < range.last; ++e) {
    if (resident_[e]) continue;
    read.push_back(e);
    for (int64_t s = 0; s < slots_; ++s)
      if (auto r = reader_.read(mutable_weights_, s, e); !r) {
        for (int64_t x : read) drop(x);  // what this call read, e's slots so far included
        return std::unexpected("reading routed expert " + std::to_string(e) + ": " + r.error().message);
      }
    resident_[e] = true;
  }
  held_[holder] = range;
  drop_unheld();
  return {};
}

void expert_residency::release(const void* holder) {
  std::lock_guard lock(mu_);
  held_.erase(holder);
  drop_unheld();
}

void expert_residency::drop(int64_t expert) {
  for (int64_t s = 0; s < slots_; ++s) model::expert_reader::drop(mutable_weights_, s, expert);
  resident_[expert] = false;
}

void expert_residency::drop_unheld() {
  for (int64_t e = 0; e < experts_; ++e) {
    bool held = false;
    for (const auto& [h, r] : held_) held = held || (e >= r.first && e < r.last);
    if (resident_[e] && !held) drop(e);
  }
}

int64_t expert_residency::resident_experts() const {
  std::lock_guard lock(mu_);
  int64_t n = 0;
  for (bool r : resident_) n += r;
  return n;
}

int64_t expert_residency::resident_bytes() const {
  std::lock_guard lock(mu_);
  int64_t bytes = 0;
  for (int64_t e = 0; e < experts_; ++e)
    for (int64_t s = 0; s < slots_ && resident_[e]; ++s) {
      const auto& x = model::routed_expert_weights(mutable_weights_, s, e);
      bytes += static_cast<int64_t>(x.gate_up.bytes() + x.down.bytes());
    }
  return bytes;
}

}  // namespace shoal::runtime
