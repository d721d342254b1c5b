// An engine's counters (engine::stats()): what the shell, the node's metrics and the
// balancers read, carried to them as this struct itself (actors/messages.hpp).
#pragma once

#include <cstdint>

#include "runtime/core/stats.hpp"
#include "runtime/vision/embedding_cache.hpp"

namespace shoal::runtime {

struct engine_stats {
  uint64_t steps = 0, prefill_tokens = 0, decode_tokens = 0, generated = 0;
  uint64_t failed_steps = 0;   // EP steps whose exchange failed (their requests recomputed, or finished as error)
  uint64_t recomputed_steps = 0;  // of them, steps whose requests stayed to be computed again
  // EP: the last group's agreed start (runtime/placement/regroup.hpp): (slot, expert) weights no
  // survivor computed (the lost ranks' only copies) and those given to joining ranks.
  int64_t regroup_orphans = 0, regroup_moved_to_new = 0;
  double forward_s = 0;        // compute thread busy in forward passes
  double idle_s = 0;           // compute thread waiting between consecutive steps (exposed overhead)
  double plan_s = 0;           // time spent planning (overlapped when async)
  double plan_exposed_s = 0;   // of it, planning while no forward pass ran (the step waited for it)
  int64_t running = 0, waiting = 0, waiting_for_remote = 0;
  cache_stats cache;
  swa_stats swa;
  int64_t blocks_free = 0, blocks_total = 0;
  int64_t kv_tokens = 0;       // cache positions of the running requests (the decode balancer's KV load)
  // Handoffs, prefill side: offered (first token out, caches lent), lent (a decode engine took
  // it: finished here as handed_off), kept (nobody took it: decoded here). Decode side: the
  // cache stats' imports / import_failures, and handoffs refused because their KV blocks are
  // in another format than this engine's.
  uint64_t handoffs_offered = 0, handoffs_lent = 0, handoffs_kept = 0;
  uint64_t handoffs_refused_format = 0;
  // Vision: images run through the encoder here, their patches, and the embedding cache.
  uint64_t images_encoded = 0, image_patches_encoded = 0;
  // Encoder rows read from a vision-encoder worker (prompt_image::rows) / reads that failed
  // (the engine encoded those images itself).
  uint64_t image_rows_read = 0, image_row_read_failures = 0;
  embedding_cache_stats image_cache;
  spec_stats spec;
  cost_stats cost;
  // Decode steps (n = the step's rows, p = their mean context, as shoal bench fit-cost --decode
  // fits them) fitted from this engine's own steps: the decode balancer's weights.
  cost_stats decode_cost;
  bool operator==(const engine_stats&) const = default;
};

}  // namespace shoal::runtime
