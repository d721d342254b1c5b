// The counters core/ keeps (the cache manager's, the SWA pool's, speculation's): plain
// structs in a light header, so the engine's stats and the wire message that carries them
// (actors/messages.hpp) include no more than these.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shoal::runtime {

struct cache_stats {
  uint64_t lookups = 0, hit_tokens = 0, prompt_tokens = 0;
  uint64_t remote_hit_tokens = 0;     // of hit_tokens: fetched from the remote tier
  uint64_t remote_lookups = 0;        // requests that asked the remote tier (once each)
  uint64_t remote_fetch_failures = 0; // fetches that delivered fewer blocks than the tier listed
  uint64_t remote_timeouts = 0;       // fetches abandoned at their deadline (the request recomputed)
  uint64_t remote_format_misses = 0;  // fetches that stopped at a block stored in another KV format
  std::string remote_last_error;      // why the latest failed fetch fell short (empty: none failed)
  uint64_t remote_stored = 0, remote_dropped = 0;  // blocks offered for writing / dropped
  uint64_t replays = 0, swa_restores = 0;
  uint64_t swa_cut = 0;               // exact mode: hits cut back to a snapshot (tokens recomputed)
  uint64_t swa_lookups = 0;           // requests that asked other machines for a slot (once each)
  uint64_t swa_fetches = 0;           // of those, a slot arrived and was stored here
  uint64_t swa_fetch_failures = 0;    // the holder failed, died or sent a bad slot (replayed)
  uint64_t swa_fetch_timeouts = 0;    // abandoned at the deadline (replayed)
  uint64_t preemptions = 0;
  uint64_t imports = 0, import_failures = 0;  // handoffs read from a prefill engine / recomputed
  // Of import_failures, those whose reads timed out (the prefill engine slow or gone) and
  // those whose bytes failed their checksum (its blocks were released or reused meanwhile).
  uint64_t import_timeouts = 0, import_corrupt = 0;
  uint64_t import_bytes = 0;                  // of the imported handoffs
  uint64_t import_reads = 0;                  // transport reads they took (adjacent blocks coalesce)
  double import_read_s = 0;                   // their reads, first issued to last completed (summed)
  bool operator==(const cache_stats&) const = default;
};

struct swa_stats {
  uint64_t saves = 0, hits = 0, misses = 0, evictions = 0;  // evictions: of the store
  uint64_t shape_misses = 0;  // of misses and refused slots: a snapshot of another storage or shape
  bool operator==(const swa_stats&) const = default;
};

// The step-cost model that sizes prefill chunks: where it came from ("none": token budget
// only; "file": engine_config::cost_source names it; "fitted": from this engine's steps, see
// cost_fitter), the samples behind it and how well it fits them.
struct cost_stats {
  std::string source = "none";
  std::string detail;        // the file, or "collecting N/M steps"
  int64_t samples = 0;
  double r2 = 0, rms_rel_error = 0;
  std::vector<double> coef;  // the model's a, b, c, d (cost_model.hpp) once there is one: the prefill balancer's too
  bool operator==(const cost_stats&) const = default;
};

// Step accounting (MEASURE.md): verified and accepted drafts per decode step; tau = 1 +
// nextn × a with a = accepted / (steps × nextn) under full-draft counting; emitted tokens
// are actual counts (VARLEN records are never multiplied again).
struct spec_stats {
  uint64_t decode_steps = 0;  // request-steps that verified ≥ 0 drafts of a speculating request
  uint64_t drafted = 0, verified = 0, accepted = 0, emitted = 0;
  // spec_mode::automatic: whether the last step verified drafts, and how often that changed.
  bool auto_verifying = false;
  uint64_t auto_switches = 0;
  double verified_per_step() const { return decode_steps ? double(verified) / double(decode_steps) : 0; }
  double accepted_per_step() const { return decode_steps ? double(accepted) / double(decode_steps) : 0; }
  double tokens_per_step() const { return decode_steps ? double(emitted) / double(decode_steps) : 0; }
  bool operator==(const spec_stats&) const = default;
};

}  // namespace shoal::runtime
