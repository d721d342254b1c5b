#include "runtime/ep/expert_migration.hpp"

#include <algorithm>
#include <map>
#include <set>

#include "kernels/assert.hpp"

namespace shoal::runtime {

migration_plan plan_migration(const ep_placement& current, const ep_placement& next,
                              const std::vector<int32_t>& process_of) {
  const auto ranks = static_cast<int32_t>(process_of.size());
  SHOAL_ASSERT(current.ranks() == ranks && next.ranks() == ranks && current.slots() == next.slots());
  int32_t processes = 0;
  for (int32_t p : process_of) {
    SHOAL_ASSERT(p >= 0);
    processes = std::max(processes, p + 1);
  }
  migration_plan out;
  out.gains.resize(static_cast<size_t>(processes));
  std::vector<int64_t> asked(static_cast<size_t>(ranks), 0);
  std::map<int32_t, std::vector<std::pair<int32_t, int32_t>>> by_holder;
  for (int64_t s = 0; s < next.slots(); ++s)
    for (int32_t p = 0; p < processes; ++p) {
      std::set<int32_t> has, wants;
      for (int32_t r = 0; r < ranks; ++r) {
        if (process_of[r] != p) continue;
        for (int32_t e : current.experts_of(s, r)) has.insert(e);
        for (int32_t e : next.experts_of(s, r)) wants.insert(e);
      }
      for (int32_t e : wants) {
        if (has.contains(e)) continue;
        out.gains[p].emplace_back(static_cast<int32_t>(s), e);
        int32_t best = -1;  // replicas are never empty, and none is in p (p holds nothing of e)
        for (int32_t h : current.replicas(s, e))
          if (best < 0 || asked[h] < asked[best] || (asked[h] == asked[best] && h < best)) best = h;
        ++asked[best];
        by_holder[best].emplace_back(static_cast<int32_t>(s), e);
      }
    }
  for (auto& [holder, experts] : by_holder) out.lends.push_back({holder, std::move(experts)});
  return out;
}

}  // namespace shoal::runtime
