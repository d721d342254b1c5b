// Roles: what a node runs, and what part of a request's life one of its engines serves
// (DISAGG.md): both (colocated), prefill only (hands each request off after its first token)
// or decode only (takes requests handed off).
#pragma once

#include <cstdint>

namespace shoal::runtime {

// What a node runs. A node has at least one role and each at most once.
// directory: the SWA-cache directory; ve: a vision-encoder worker
enum class role : uint8_t { gateway, engine, storage, directory, ve };
constexpr const char* to_string(role r) {
  switch (r) {
    case role::gateway: return "gateway";
    case role::engine: return "engine";
    case role::storage: return "storage";
    case role::directory: return "directory";
    case role::ve: return "ve";
  }
  return "?";
}

enum class engine_role : uint8_t { both, prefill, decode };
constexpr const char* to_string(engine_role r) {
  return r == engine_role::prefill ? "prefill" : r == engine_role::decode ? "decode" : "both";
}

}  // namespace shoal::runtime
