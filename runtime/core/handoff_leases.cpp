// The prefill side's handoff leases (handoff_leases.hpp).
#include "runtime/core/handoff_leases.hpp"

namespace shoal::runtime {

uint64_t handoff_leases::offer(request_id id) {
  lease& l = leases_[id];
  l = {++numbers_, numbers_, false};
  return l.number;
}

handoff_leases::placement handoff_leases::placed(request_id id, bool placed) {
  auto it = leases_.find(id);
  if (it == leases_.end() || it->second.placed) return {};
  if (!placed) {
    leases_.erase(it);
    return {true, std::nullopt};
  }
  it->second.placed = true;
  it->second.number = ++numbers_;
  return {false, it->second.number};
}

bool handoff_leases::release(request_id id, uint64_t offer) {
  auto it = leases_.find(id);
  if (it == leases_.end() || it->second.offer != offer) return false;
  leases_.erase(it);
  return true;
}

std::optional<bool> handoff_leases::expire(request_id id, uint64_t number) {
  auto it = leases_.find(id);
  if (it == leases_.end() || it->second.number != number) return std::nullopt;
  if (bug_ == lease_bug::never_expires && it->second.placed) return std::nullopt;  // planted
  const bool taken = it->second.placed;
  leases_.erase(it);
  return taken;
}

}  // namespace shoal::runtime
