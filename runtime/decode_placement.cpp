// The least-loaded decode placement (decode_placement.hpp).
#include "runtime/decode_placement.hpp"

#include <algorithm>
#include <tuple>

namespace shoal::runtime {

std::optional<int64_t> least_loaded_placement::choose(const decode_ask& ask, std::span<const decode_candidate> engines,
                                                      std::span<const int64_t> refused) const {
  const decode_candidate* best = nullptr;
  auto rank = [](const decode_candidate& c) { return std::make_tuple(c.running, -c.blocks_free, c.engine); };
  for (const auto& c : engines) {
    if (c.draining || c.blocks_free < ask.blocks_needed) continue;
    if (std::find(refused.begin(), refused.end(), c.engine) != refused.end()) continue;
    if (!best || rank(c) < rank(*best)) best = &c;
  }
  if (!best) return std::nullopt;
  return best->engine;
}

}  // namespace shoal::runtime
