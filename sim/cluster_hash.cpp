// The simulated run's hash: what the determinism checks compare.
#include "sim/cluster_run.hpp"

#include <xxhash.h>

namespace shoal::sim::detail {

uint64_t cluster::hash(const sim_result& out) const {
  XXH3_state_t* s = XXH3_createState();
  XXH3_64bits_reset(s);
  for (const auto& r : out.requests) {
    const double v[3] = {r.arrival_s, r.first_token_s, r.finish_s};
    const int64_t n[5] = {r.id, r.cached_tokens, r.prefill_rank, r.decode_rank, r.output};
    XXH3_64bits_update(s, v, sizeof v);
    XXH3_64bits_update(s, n, sizeof n);
  }
  const double sums[4] = {out.prefill.busy_s, out.decode.busy_s, out.prefill.tokens, out.decode.tokens};
  XXH3_64bits_update(s, sums, sizeof sums);
  if (c_.faults.enabled) {
    const fault_outcome& f = out.faults;
    const int64_t n[13] = {f.completed, f.errored, f.lost, f.wrong_blocks, f.placed_on_dead, f.duplicates,
                           f.wrong_outputs, f.leaked_blocks, f.rerouted, f.handoff_failures, f.handoff_duplicates,
                           f.dropped_writes, f.damaged_caught};
    XXH3_64bits_update(s, n, sizeof n);
    for (const auto& r : out.requests) {
      XXH3_64bits_update(s, &r.attempts, sizeof r.attempts);
      XXH3_64bits_update(s, r.error.data(), r.error.size());
    }
  }
  const uint64_t h = XXH3_64bits_digest(s);
  XXH3_freeState(s);
  return h;
}

}  // namespace shoal::sim::detail
