// What a decode engine needs to continue a request exactly where the prefill engine left it
// (DISAGG.md): the tokens so far (the first sampled token included, so the sampler position
// follows), the sampling parameters and seed, the text so far (stop strings), and where the
// sequence's cache lives on the prefill engine: one remote_memory per block covering
// [0, computed) and one per SWA ring stream (shoal_flash: encoder window and decoder tail),
// each with its checksum. The prefill engine keeps those bytes pinned (its lease) until it is
// told the decode engine took them or refused; the decode engine reads them with the
// transport into blocks it reserved first, and recomputes from the tokens if any read fails.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/kv_format.hpp"
#include "runtime/base/ids.hpp"
#include "runtime/base/roles.hpp"
#include "runtime/vision/prompt_image.hpp"
#include "runtime/core/sampler.hpp"
#include "runtime/base/traffic_class.hpp"
#include "runtime/base/transport.hpp"

namespace shoal::runtime {

struct handoff_state {
  request_id id;                   // the request's (the same on both engines)
  std::vector<int32_t> tokens;     // prompt ++ output so far (≥ 1 generated token)
  int64_t prompt_len = 0;
  std::vector<prompt_image> images;  // of the prompt: a failed read recomputes with them
  sampling_params params;
  uint64_t seq_seed = 0;
  traffic_class cls = traffic_class::chat;
  std::string text;                // detokenised output so far
  int64_t computed = 0;            // positions [0, computed) are in the cache: tokens.size() − 1
  int64_t dec_from = 0;            // decoder tail start (shoal_flash)
  int64_t ring_tokens = 0;         // ring length of every stream (must match the decode engine's)
  std::vector<int64_t> ring_floor; // per stream
  int64_t cached_tokens = 0;       // prefix-hit tokens at the prefill engine (API usage)
  bool swa_approx = false;         // the window came from bounded replay
  int64_t snapshot_at = -1;
  model::kv_format kv;                // the stored form of the blocks' bytes
  std::vector<remote_memory> blocks;  // (ceil(computed / block_size)) block order
  std::vector<remote_memory> rings;   // (streams) ring_tokens slots each, in the kv format (sequence_cache::rings)
};

}  // namespace shoal::runtime
