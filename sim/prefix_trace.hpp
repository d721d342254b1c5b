// Prefix-cache replay of Mooncake request traces (shared/traces/mooncake/*.jsonl). Each row
// lists the prefix-consistent hash ids of its 512-token blocks; replaying the rows in file
// order against a bounded cache gives the block hit ratio, either with the plain LRU of the
// traces README (reference numbers) or by driving the real block_pool the way an engine does.
#pragma once

#include <cstdint>
#include <expected>
#include <string>
#include <vector>

namespace shoal::sim {

struct trace_request {
  int64_t timestamp_ms = 0;
  int64_t input_length = 0;
  int64_t output_length = 0;
  std::vector<int64_t> hash_ids;  // one per (possibly partial) prefix block, in order
};

// Parses a Mooncake JSON Lines trace. Blank lines are skipped. Errors name the file and the
// 1-based line ("path:line: reason"): unreadable file, bad JSON, missing or mistyped fields.
std::expected<std::vector<trace_request>, std::string> load_mooncake_trace(const std::string& path);

enum class cache_policy {
  lru,   // README plain LRU: longest cached prefix hits, then every block inserted/touched as MRU
  pool,  // block_pool: touch hits, allocate misses, cache them, release the request in reverse
};

struct replay_stats {
  int64_t requests = 0;
  int64_t blocks = 0;      // all blocks of all requests
  int64_t hit_blocks = 0;  // blocks served by the longest cached prefix
  uint64_t evictions = 0;  // cached blocks dropped to make room
  double hit_ratio() const {
    return blocks == 0 ? 0.0 : static_cast<double>(hit_blocks) / static_cast<double>(blocks);
  }
};

// Replays `trace` in order against one global cache of `capacity_blocks` blocks (>= 0).
replay_stats replay_trace(const std::vector<trace_request>& trace, int32_t capacity_blocks,
                          cache_policy policy);

}  // namespace shoal::sim
