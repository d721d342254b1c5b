// Which decode engine continues a request a prefill engine has just handed off (DISAGG.md
// step 3). A policy sees the request's needs and a snapshot of every decode engine, and
// skips those that already refused it (no room) or drain; nullopt means none can take it and
// the prefill engine decodes it itself. This file ships the least-loaded policy; the decode
// balancer (request count and KV length at once) implements the same interface.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

namespace shoal::runtime {

struct decode_candidate {
  int64_t engine = -1;        // the caller's index of the engine
  int64_t running = 0;        // requests it runs or is reading
  int64_t kv_tokens = 0;      // tokens in their caches
  int64_t blocks_free = 0;
  bool draining = false;
};

struct decode_ask {
  int64_t context_tokens = 0;  // tokens handed off (prompt + first token)
  int64_t max_new_tokens = 0;
  int64_t blocks_needed = 0;   // to take the handoff and decode one token
};

class decode_placement {
 public:
  virtual ~decode_placement() = default;
  virtual std::string name() const = 0;
  // The engine to ask next, never one of `refused`; nullopt when no engine fits.
  virtual std::optional<int64_t> choose(const decode_ask& ask, std::span<const decode_candidate> engines,
                                        std::span<const int64_t> refused) const = 0;
};

// Fewest running requests among the engines with room for the handoff; ties go to the most
// free blocks, then the lowest engine index (deterministic).
class least_loaded_placement final : public decode_placement {
 public:
  std::string name() const override { return "least_loaded"; }
  std::optional<int64_t> choose(const decode_ask& ask, std::span<const decode_candidate> engines,
                                std::span<const int64_t> refused) const override;
};

}  // namespace shoal::runtime
