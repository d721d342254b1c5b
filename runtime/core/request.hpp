// One generation request as the engine tracks it: tokens (prompt ++ output), sampling
// parameters, its share of the caches (block ids, chain keys, the model's sequence cache
// with its SWA rings) and the bookkeeping the scheduler and the API need.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "model/forward.hpp"
#include "runtime/core/block_pool.hpp"
#include "runtime/base/ids.hpp"
#include "runtime/core/sampler.hpp"
#include "runtime/base/traffic_class.hpp"

namespace shoal::runtime {

class grammar_matcher;

// waiting_for_remote_kv: its local prefix hit is pinned and pool blocks are reserved while
// the remote tier reads the blocks that extend it (cache_manager::try_start_remote); it is
// not scheduled until the read is done, failed or past its deadline.
// handing_off: a prefill engine's request whose cache a decode engine is reading (pinned,
// not scheduled).
enum class request_status { waiting, waiting_for_remote_kv, running, handing_off, finished };

struct request {
  request_id id;
  std::vector<int32_t> tokens;   // prompt ++ output
  int64_t prompt_len = 0;
  int64_t resumed = 0;            // output tokens it was admitted with (a re-routed request's)
  std::vector<prompt_image> images;  // in prompt order, their placeholder tokens in `tokens`
  sampling_params params;
  uint64_t seq_seed = 0;
  request_status status = request_status::waiting;
  finish_reason finish = finish_reason::none;

  // Cache state (valid while running).
  model::sequence_cache cache;
  std::vector<block_id> blocks;  // block i covers positions [i·bs, (i+1)·bs)
  std::vector<block_key> keys;   // chain keys of the full blocks of `tokens`
  int64_t blocks_cached = 0;     // leading blocks already registered in the pool
  int64_t cached_tokens = 0;     // prefix-hit tokens at the last admission (API usage)
  traffic_class cls = traffic_class::chat;  // storage TTL class of its written-back blocks
  int64_t dec_from = -1;         // decoder tail start (shoal_flash), fixed at first admission so
                                 // a preempted request recomputes exactly what it computed
  int64_t blocks_valid_until = 0;  // replay: runs ending before this are already in the blocks
  bool swa_approx = false;       // the SWA window came from bounded replay
  int64_t snapshot_at = -1;      // last position an SWA snapshot was saved at
  int64_t preemptions = 0;
  bool handed_off = false;       // a prefill engine already offered it to a decode engine
  bool remote_checked = false;   // the remote tier was asked (once per request)
  bool swa_checked = false;      // other machines' SWA stores were asked (once per request)
  std::shared_ptr<grammar_matcher> matcher;  // structured output: where the output is in its grammar
  bool abort_requested = false;  // aborted while its step was computing: finishes after it
  // Speculative decoding: the drafts proposed after tokens.back() (for the cache at `drafted_at`
  // positions), their confidences and, when sampling, their distributions; the main model's
  // hidden rows of positions hidden_from … computed − 1 the next drafts start from; and how
  // far the rings were written (a rejected draft's entries lie past computed until rewritten).
  struct speculation {
    std::vector<int32_t> drafts;
    std::vector<float> confidence;
    std::vector<token_distribution> q;
    int64_t drafted_at = -1;
    std::vector<float> hidden;
    int64_t hidden_from = 0;
    int64_t ring_written = 0;
    model::mtp_state mtp;  // the MTP depths' own rings (incremental drafting)
  } spec;

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t computed() const { return cache.computed; }
  int64_t output_len() const { return num_tokens() - prompt_len; }
  bool prefill_done() const { return computed() >= num_tokens() - 1 && computed() > 0; }
};

}  // namespace shoal::runtime
