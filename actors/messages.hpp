// The messages shoal's actors exchange: plain structs with their CAF inspect functions, the
// error codes and the strong ids' wire form. Listed in the type-ID block of
// actors/interfaces.hpp (which includes this); only light CAF headers here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/fwd.hpp>
#include <caf/error.hpp>
#include <caf/meta/load_callback.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/sec.hpp>
#include <caf/replies_to.hpp>
#include <caf/type_id.hpp>
#include <caf/typed_actor.hpp>

#include "runtime/base/block_key.hpp"
#include "runtime/ep/expert_migration.hpp"
#include "runtime/core/handoff.hpp"
#include "runtime/base/ids.hpp"
#include "runtime/core/sampler.hpp"
#include "runtime/core/token_event.hpp"
#include "runtime/engine/engine_stats.hpp"
#include "runtime/base/traffic_class.hpp"
#include "runtime/vision/image.hpp"
#include "runtime/vision/prompt_image.hpp"

// -- strong ids on the wire ---------------------------------------------------------------

namespace shoal {

// request_id, block_id, ...: serialised as their integer value.
template <class Inspector, class Tag, class Rep>
typename Inspector::result_type inspect(Inspector& f, strong_id<Tag, Rep>& x) {
  return f(caf::meta::type_name("strong_id"), x.value);
}

}  // namespace shoal

namespace shoal::runtime {

// The block key's one wire form: its two halves, hi first (as in the chunk files and the bulk
// frames).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, block_key& x) {
  return f(caf::meta::type_name("block_key"), x.hi, x.lo);
}

// A registered range on the wire (a handoff's blocks and rings): the owner's transport
// address, then address, key, length and checksum. The receiver validates it before reading.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, remote_memory& x) {
  return f(caf::meta::type_name("remote_memory"), x.owner, x.addr, x.key, x.length, x.crc32c);
}

}  // namespace shoal::runtime

namespace shoal::model {

// A KV cache format on the wire (handoffs name the form of their blocks' bytes).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_format& x) {
  return f(caf::meta::type_name("kv_format"), x.dtype, x.latent, x.rope, x.layers, x.per_layer);
}

}  // namespace shoal::model

namespace shoal::runtime {

// One array of a lent routed expert (runtime/ep/expert_migration.hpp); the reader checks it
// against its own model before reading.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, expert_part& x) {
  return f(caf::meta::type_name("expert_part"), x.slot, x.expert, x.tensor, x.field, x.block_in, x.memory);
}

}  // namespace shoal::runtime

namespace shoal::actors {

// -- errors -------------------------------------------------------------------------------

// Operating errors an actor reports back (as caf::error of category "shoal", see
// make_error / to_error_reply). Codes start at 1: CAF reserves 0 for "no error".
enum class errc : uint8_t {
  invalid_request = 1,  // add_request refused it (empty prompt, bad token, bad params, too long)
  duplicate_request,    // a request with this id is still running on this engine
  no_sink,              // no actor to stream tokens to (anonymous sender, invalid handle)
  timed_out,            // the request's timeout expired; the peer may still have acted on it
  unreachable,          // the peer is down or its node disconnected
  unknown,              // any other caf::error
  draining,             // the engine or node is draining: no new requests (retry elsewhere)
  no_engine,            // a balancer knows no engine that could take the request
  not_found,            // a named actor, node or chunk does not exist
  corrupt,              // a stored chunk failed its checksum (removed, never served)
  storage_full,         // a storage node cannot take the chunk (capacity or disk full)
  no_room,              // a decode engine cannot reserve the blocks of a handoff (ask another)
  too_many_requests,    // the gateway serves its bound of requests at once (retry later; HTTP 429)
  refused,              // the peer cannot take it now (a placement still being adopted): ask again later
  conflict,             // it disagrees with what the peer holds (a node unlike its group's members): retrying cannot help
};

const char* to_string(errc e);

// The payload of every error reply: a code and a message naming the bad field.
struct error_reply {
  errc code = errc::unknown;
  std::string message;
  friend bool operator==(const error_reply&, const error_reply&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, error_reply& x) {
  return f(caf::meta::type_name("error_reply"), x.code, x.message);
}

// Wraps `r` as a caf::error (category "shoal", code r.code, context = r) for a response.
caf::error make_error(error_reply r);
caf::error make_error(errc code, std::string message);

// Reads any caf::error back as an error_reply: shoal errors unchanged, CAF's request_timeout
// → timed_out, remote/down errors → unreachable, the rest → unknown with CAF's rendering.
error_reply to_error_reply(const caf::error& e);

// -- generation -----------------------------------------------------------------------------

}  // namespace shoal::actors

namespace shoal::runtime {

// runtime::sampling_params on the wire, the struct itself: the optional seed as has_seed +
// seed, logit_bias as two lists of equal length (unequal ones from another process fail the
// message), the constraint's kind as its byte (an unknown one is refused by the engine, by
// number).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sampling_params& x) {
  bool has_seed = x.seed.has_value();
  uint64_t seed = x.seed.value_or(0);
  std::vector<int32_t> bias_tokens;
  std::vector<float> bias_values;
  for (const auto& [token, bias] : x.logit_bias) bias_tokens.push_back(token), bias_values.push_back(bias);
  uint8_t kind = static_cast<uint8_t>(x.constraint.kind);
  auto loaded = caf::meta::load_callback([&]() -> caf::error {
    if (bias_tokens.size() != bias_values.size()) return caf::make_error(caf::sec::invalid_argument);
    x.seed = has_seed ? std::optional<uint64_t>(seed) : std::nullopt;
    x.logit_bias.clear();
    for (size_t i = 0; i < bias_tokens.size(); ++i) x.logit_bias.emplace_back(bias_tokens[i], bias_values[i]);
    x.constraint.kind = static_cast<constraint_kind>(kind);
    return caf::none;
  });
  return f(caf::meta::type_name("sampling_params"), x.temperature, x.top_k, x.top_p, x.max_tokens, x.stop_token_ids,
           x.stop_strings, x.ignore_eos, has_seed, seed, bias_tokens, bias_values, x.presence_penalty,
           x.frequency_penalty, kind, x.constraint.source, x.logprobs, loaded);
}

// The engine's counters on the wire (engine_stats_snapshot), each struct itself.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, cache_stats& x) {
  return f(caf::meta::type_name("cache_stats"), x.lookups, x.hit_tokens, x.prompt_tokens, x.remote_hit_tokens,
           x.remote_lookups, x.remote_fetch_failures, x.remote_timeouts, x.remote_format_misses, x.remote_last_error, x.remote_stored,
           x.remote_dropped, x.replays, x.swa_restores, x.swa_cut, x.swa_lookups, x.swa_fetches, x.swa_fetch_failures,
           x.swa_fetch_timeouts, x.preemptions, x.imports, x.import_failures, x.import_timeouts, x.import_corrupt, x.import_bytes, x.import_reads,
           x.import_read_s);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, swa_stats& x) {
  return f(caf::meta::type_name("swa_stats"), x.saves, x.hits, x.misses, x.evictions, x.shape_misses);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, spec_stats& x) {
  return f(caf::meta::type_name("spec_stats"), x.decode_steps, x.drafted, x.verified, x.accepted, x.emitted,
           x.auto_verifying, x.auto_switches);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, embedding_cache_stats& x) {
  return f(caf::meta::type_name("embedding_cache_stats"), x.hits, x.misses, x.evictions, x.entries, x.bytes,
           x.capacity_bytes);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, runtime::cost_stats& x) {
  return f(caf::meta::type_name("cost_stats"), x.source, x.detail, x.samples, x.r2, x.rms_rel_error, x.coef);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, engine_stats& x) {
  return f(caf::meta::type_name("engine_stats"), x.steps, x.prefill_tokens, x.decode_tokens, x.generated,
           x.failed_steps, x.recomputed_steps, x.forward_s, x.idle_s, x.plan_s, x.plan_exposed_s, x.running, x.waiting, x.waiting_for_remote, x.cache, x.swa,
           x.blocks_free, x.blocks_total, x.kv_tokens, x.handoffs_offered, x.handoffs_lent, x.handoffs_kept,
           x.handoffs_refused_format, x.images_encoded, x.image_patches_encoded, x.image_rows_read, x.image_row_read_failures, x.image_cache,
           x.spec, x.cost, x.decode_cost);
}


// One image of a prompt on the wire, runtime::prompt_image itself: its placeholder tokens,
// content hash and pixels (fit to the encoder's patches), and where a vision-encoder worker
// holds its encoder rows (an empty owner when none does: the engine encodes). It comes from
// another process: the engine that takes it checks it against the prompt and the encoder,
// recomputes the hash (check_prompt_images) and checks the rows' length and checksum when it
// reads them. A received image always has pixels (empty ones when none were sent).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, prompt_image& x) {
  uint64_t hash_lo = x.hash[0], hash_hi = x.hash[1];
  int64_t width = x.pixels ? x.pixels->width : 0, height = x.pixels ? x.pixels->height : 0;
  std::vector<uint8_t> rgb = x.pixels ? x.pixels->rgb : std::vector<uint8_t>{};
  auto loaded = caf::meta::load_callback([&]() -> caf::error {
    x.hash = {hash_lo, hash_hi};
    auto px = std::make_shared<rgb_image>();
    px->width = width, px->height = height, px->rgb = std::move(rgb);
    x.pixels = std::move(px);
    return caf::none;
  });
  return f(caf::meta::type_name("prompt_image"), x.pos, x.count, hash_lo, hash_hi, width, height, rgb, x.rows, loaded);
}

}  // namespace shoal::runtime

namespace shoal::actors {

// One generation request. `id` is chosen by the caller (the gateway makes it unique in the
// cluster); token events and cancel refer to it.
struct generation_request {
  request_id id;
  std::vector<int32_t> prompt;  // (n_prompt,) token ids, BOS included when the model wants one
  runtime::sampling_params sampling;
  runtime::traffic_class cls = runtime::traffic_class::chat;  // storage TTL of the blocks it writes back
  std::vector<runtime::prompt_image> images = {};  // of the prompt, in order
  // Output tokens the client already has: a request re-routed from a failed engine continues
  // after them (runtime::engine::add_request).
  std::vector<int32_t> resumed = {};
  friend bool operator==(const generation_request&, const generation_request&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, generation_request& x) {
  return f(caf::meta::type_name("generation_request"), x.id, x.prompt, x.sampling, x.cls, x.images, x.resumed);
}

}  // namespace shoal::actors

namespace shoal::runtime {

// A generated token on its way to the request's sink (runtime::token_event itself, logits left
// out): the optional log probabilities as has_logprobs, the token's, and the likeliest tokens
// with theirs as two lists of equal length.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_event& x) {
  bool has_logprobs = x.logprobs.has_value();
  float logprob = x.logprobs ? x.logprobs->logprob : 0.0f;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
  if (x.logprobs)
    for (const auto& [id, lp] : x.logprobs->top) top_ids.push_back(id), top_logprobs.push_back(lp);
  auto loaded = caf::meta::load_callback([&]() -> caf::error {
    if (top_ids.size() != top_logprobs.size()) return caf::make_error(caf::sec::invalid_argument);
    x.logprobs.reset();
    if (has_logprobs) {
      x.logprobs = token_logprobs{logprob, {}};
      for (size_t i = 0; i < top_ids.size(); ++i) x.logprobs->top.emplace_back(top_ids[i], top_logprobs[i]);
    }
    return caf::none;
  });
  return f(caf::meta::type_name("token_event"), x.id, x.token, x.finished, x.reason, x.cached_tokens, has_logprobs,
           logprob, top_ids, top_logprobs, loaded);
}

}  // namespace shoal::runtime

namespace shoal::actors {

using token_event = runtime::token_event;

// A request that left an engine, by its one id, and how it ended there (handed_off: a
// decode engine took it on).
struct request_record {
  request_id id;
  runtime::finish_reason reason = runtime::finish_reason::none;
  friend bool operator==(const request_record&, const request_record&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, request_record& x) {
  return f(caf::meta::type_name("request_record"), x.id, x.reason);
}

// An engine's counters: runtime::engine_stats itself, with what the actor adds.
struct engine_stats_snapshot {
  runtime::engine_stats engine;
  std::string role = "both";          // runtime::engine_role
  int64_t requests_running = 0;       // routed here: submitted, not yet finished or cancelled
  double swa_fetch_p50_ms = 0, swa_fetch_p99_ms = 0;  // of the last ≤ 1024 SWA slot fetches that arrived
  std::vector<request_id> running;    // the requests routed here now, by id
  std::vector<request_record> recent;  // the last (≤ 64) that left, oldest first
  friend bool operator==(const engine_stats_snapshot&, const engine_stats_snapshot&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, engine_stats_snapshot& x) {
  return f(caf::meta::type_name("engine_stats_snapshot"), x.engine, x.role, x.requests_running, x.swa_fetch_p50_ms,
           x.swa_fetch_p99_ms, x.running, x.recent);
}


// A piece of generated text for an operator's `submit` (the shell): the gateway decodes
// tokens incrementally (never splitting a UTF-8 character) and streams the new text.
struct text_event {
  request_id id;
  std::string text;
  bool finished = false;
  runtime::finish_reason reason = runtime::finish_reason::none;  // set when finished
  std::string error;  // why, when reason is error
  friend bool operator==(const text_event&, const text_event&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, text_event& x) {
  return f(caf::meta::type_name("text_event"), x.id, x.text, x.finished, x.reason, x.error);
}

// -- disaggregation --------------------------------------------------------------------------

// A prefill engine's offer of one request to a decode engine (runtime::handoff_state on the
// wire, DISAGG.md steps 3-4). The prefill engine sends it to the request's sink (the gateway's
// relay) after streaming the first token; the relay places it on a decode engine, which reads
// the ranges with its transport and releases the prefill engine's lease when the reads are
// over. Every field comes from another process: the decode engine validates it
// (runtime::engine::add_handoff) before reserving anything.
struct handoff_offer {
  request_id id;               // the request's (the gateway's, on every engine)
  caf::actor prefill;          // the engine actor holding the lease
  int64_t blocks_needed = 0;   // decode blocks to take it and decode one token
  uint64_t lease = 0;          // which of the prefill engine's leases of `id` (release names it)
  std::vector<int32_t> tokens; // prompt ++ output so far
  int64_t prompt_len = 0;
  std::vector<runtime::prompt_image> images;  // of the prompt (a failed read recomputes with them)
  runtime::sampling_params sampling;
  uint64_t seq_seed = 0;
  runtime::traffic_class cls = runtime::traffic_class::chat;
  std::string text;
  int64_t computed = 0, dec_from = 0, ring_tokens = 0;
  std::vector<int64_t> ring_floor;
  int64_t cached_tokens = 0;
  bool swa_approx = false;
  int64_t snapshot_at = -1;
  model::kv_format kv;         // what the blocks' bytes are
  std::vector<runtime::remote_memory> blocks, rings;
  friend bool operator==(const handoff_offer&, const handoff_offer&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, handoff_offer& x) {
  return f(caf::meta::type_name("handoff_offer"), x.id, x.prefill, x.blocks_needed, x.lease, x.tokens, x.prompt_len,
           x.images, x.sampling, x.seq_seed, x.cls, x.text, x.computed, x.dec_from, x.ring_tokens, x.ring_floor, x.cached_tokens,
           x.swa_approx, x.snapshot_at, x.kv, x.blocks, x.rings);
}

handoff_offer to_handoff_offer(const runtime::handoff_state& s, caf::actor prefill, int64_t blocks_needed,
                               uint64_t lease);
runtime::handoff_state to_handoff_state(const handoff_offer& o);

// -- the vision-encoder pool -------------------------------------------------------------------

// A vision-encoder worker's counters (shell `ve`).
struct ve_worker_stats {
  std::string node;
  uint64_t jobs = 0;               // encode requests answered
  uint64_t images_encoded = 0;     // images run through the encoder
  uint64_t patches_encoded = 0;
  uint64_t cache_hits = 0;         // images whose rows were already held (encoder skipped)
  int64_t cache_entries = 0, cache_bytes = 0, cache_capacity = 0;  // registered rows held
  double encode_s = 0;             // seconds in the encoder
  friend bool operator==(const ve_worker_stats&, const ve_worker_stats&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ve_worker_stats& x) {
  return f(caf::meta::type_name("ve_worker_stats"), x.node, x.jobs, x.images_encoded, x.patches_encoded,
           x.cache_hits, x.cache_entries, x.cache_bytes, x.cache_capacity, x.encode_s);
}

// One worker as the VE balancer sees it (runtime::ve_worker_load with its node's name).
struct ve_worker_row {
  std::string node;
  bool draining = false;
  int64_t jobs = 0, patches = 0;   // outstanding: the queue depth in patches
  int64_t placed = 0, completed = 0, given_back = 0;
  friend bool operator==(const ve_worker_row&, const ve_worker_row&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ve_worker_row& x) {
  return f(caf::meta::type_name("ve_worker_row"), x.node, x.draining, x.jobs, x.patches, x.placed, x.completed,
           x.given_back);
}

struct ve_report {
  std::vector<ve_worker_row> workers;
  uint64_t jobs = 0;          // encode requests taken
  uint64_t replaced = 0;      // placements made again (worker died, drained or failed the job)
  uint64_t failed = 0;        // answered with an error (no worker left, bad image)
  friend bool operator==(const ve_report&, const ve_report&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ve_report& x) {
  return f(caf::meta::type_name("ve_report"), x.workers, x.jobs, x.replaced, x.failed);
}

// -- KV-cache storage ------------------------------------------------------------------------

// One erasure-coded chunk of a KV block (storage/erasure.hpp frames it, crc included): block
// key (the prefix hash chain's 128-bit key) + chunk index, and the traffic class (0 agent,
// 1 chat) whose TTL the storage node applies.
struct chunk_put {
  runtime::block_key key;
  int32_t index = 0;
  runtime::traffic_class cls = runtime::traffic_class::agent;  // wire form: its byte (validated)
  std::vector<uint8_t> bytes;
  friend bool operator==(const chunk_put&, const chunk_put&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, chunk_put& x) {
  return f(caf::meta::type_name("chunk_put"), x.key, x.index, x.cls, x.bytes);
}

// Which of a list of chunks a storage node holds: a block key and a chunk index each; the
// answer has one byte (0/1) per chunk.
struct chunk_query {
  std::vector<runtime::block_key> keys;  // (n)
  std::vector<int32_t> indices;          // (n)
  friend bool operator==(const chunk_query&, const chunk_query&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, chunk_query& x) {
  return f(caf::meta::type_name("chunk_query"), x.keys, x.indices);
}

// A storage node's state for the shell and the benches.
struct storage_stats_snapshot {
  uint64_t chunks = 0, usage_bytes = 0, capacity_bytes = 0;
  int32_t high_watermark_pct = 0, low_watermark_pct = 0;
  uint64_t puts = 0, put_failures = 0, gets = 0, get_hits = 0;
  uint64_t gc_runs = 0, evicted_chunks = 0, sweeps = 0, expired_chunks = 0, corrupt_removed = 0;
  double put_seconds = 0, get_seconds = 0;  // summed over successful puts / get hits (latency = / count)
  friend bool operator==(const storage_stats_snapshot&, const storage_stats_snapshot&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, storage_stats_snapshot& x) {
  return f(caf::meta::type_name("storage_stats_snapshot"), x.chunks, x.usage_bytes, x.capacity_bytes,
           x.high_watermark_pct, x.low_watermark_pct, x.puts, x.put_failures, x.gets, x.get_hits, x.gc_runs,
           x.evicted_chunks, x.sweeps, x.expired_chunks, x.corrupt_removed, x.put_seconds, x.get_seconds);
}

// -- the SWA-cache tier -------------------------------------------------------------------------

// A machine's store tells the directory what it holds: everything (`full`, after the store
// or the directory started) or what changed since its last report (evictions applied first).
struct swa_report {
  std::string node;                    // the store's node name
  caf::actor store;                    // its swa_store_actor
  bool full = false;
  std::vector<runtime::block_key> added, evicted;
  friend bool operator==(const swa_report&, const swa_report&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, swa_report& x) {
  return f(caf::meta::type_name("swa_report"), x.node, x.store, x.full, x.added, x.evicted);
}

// The directory's answer to a lookup: the deepest of the asked keys some store holds.
struct swa_hit {
  int32_t index = -1;                  // into the asked keys; −1: none
  caf::actor store;                    // the holder's swa_store_actor
  std::string node;
  friend bool operator==(const swa_hit&, const swa_hit&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, swa_hit& x) {
  return f(caf::meta::type_name("swa_hit"), x.index, x.store, x.node);
}

// The directory's state for the shell: keys known, slots per store, lookups and hits.
struct swa_directory_stats {
  int64_t entries = 0;
  std::vector<std::string> nodes;      // one per store
  std::vector<int64_t> slots;          // (nodes) keys registered by each
  uint64_t lookups = 0, hits = 0, reports = 0, full_reports = 0;
  friend bool operator==(const swa_directory_stats&, const swa_directory_stats&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, swa_directory_stats& x) {
  return f(caf::meta::type_name("swa_directory_stats"), x.entries, x.nodes, x.slots, x.lookups, x.hits, x.reports,
           x.full_reports);
}

// One machine's store for the shell.
struct swa_store_stats {
  int64_t slots = 0, capacity = 0;
  uint64_t slot_bytes = 0, puts = 0, evictions = 0, served = 0;
  friend bool operator==(const swa_store_stats&, const swa_store_stats&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, swa_store_stats& x) {
  return f(caf::meta::type_name("swa_store_stats"), x.slots, x.capacity, x.slot_bytes, x.puts, x.evictions, x.served);
}

// -- cluster membership ---------------------------------------------------------------------

// One rank of an engine node: its engine replica and, with expert parallelism, the rank
// actor that exchanges expert activations with the other ranks of its group. Handles are
// caf::actor on the wire (typed handles are cast back by the receiver) so that the structs
// below do not depend on the interfaces declared after them.
// One engine as a balancer sees it (shell `balancers`).
struct balancer_engine_row {
  std::string engine;             // "node/rank"
  int32_t tier = -1;              // prefill: its tier (−1 serves every tier); decode: −1
  int64_t in_flight = 0;          // requests placed there and not done
  int64_t kv_tokens = 0;          // decode: KV tokens as last polled; prefill: prompt tokens in flight
  double predicted_finish_s = 0;  // prefill: seconds from now until its predicted queue end
  int64_t placed = 0;             // requests placed there since start
  friend bool operator==(const balancer_engine_row&, const balancer_engine_row&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, balancer_engine_row& x) {
  return f(caf::meta::type_name("balancer_engine_row"), x.engine, x.tier, x.in_flight, x.kv_tokens,
           x.predicted_finish_s, x.placed);
}

struct balancer_report {
  std::string kind;                    // "prefill" or "decode"
  std::string policy;
  std::vector<balancer_engine_row> engines;
  std::vector<int64_t> tier_bounds;    // prefill
  std::vector<int64_t> tier_placements;  // prefill: requests placed per tier
  double balance_now = 1;              // decode: mean / max of (requests, KV) load now
  double balance_window = 1;           // decode: mean of the polls over the last minute
  std::string cost;                    // which step-cost models weigh the engines (decode: its two dimensions)
  friend bool operator==(const balancer_report&, const balancer_report&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, balancer_report& x) {
  return f(caf::meta::type_name("balancer_report"), x.kind, x.policy, x.engines, x.tier_bounds, x.tier_placements,
           x.balance_now, x.balance_window, x.cost);
}

struct rank_info {
  int32_t index = 0;    // rank number on its node, 0-based
  caf::actor engine;    // an engine_actor
  caf::actor rank;      // a rank_actor; invalid when the node runs without expert parallelism
  friend bool operator==(const rank_info&, const rank_info&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rank_info& x) {
  return f(caf::meta::type_name("rank_info"), x.index, x.engine, x.rank);
}

// What a node announces about itself when it joins (and again whenever it changes).
struct node_info {
  std::string name;                // node.name, unique in the cluster
  std::string host;                // node.listen host
  uint16_t port = 0;               // node.listen port (the bound one when 0 was asked)
  std::vector<std::string> roles;  // "gateway", "engine", "storage"
  caf::actor agent;                // the node's node_agent_actor
  std::vector<rank_info> ranks;    // engine role: one per rank, by index
  std::vector<caf::actor> storage; // storage role: its storage_node_actors, by index
  bool draining = false;           // SIGTERM or `drain`: takes no new requests
  std::vector<uint16_t> storage_ports;  // storage role: each storage node's bulk port on `host`
  std::string engine_role = "both";     // engine role: "both", "prefill" or "decode" (every rank)
  caf::actor swa_store;                 // shoal_flash engine nodes: the machine's swa_store_actor
  caf::actor swa_directory;             // directory role: the swa_directory_actor
  std::vector<caf::actor> balancers;    // gateway role: its prefill_balancer_actor, decode_balancer_actor, ve_balancer_actor
  caf::actor ve_worker;                 // ve role: the node's ve_worker_actor
  // Engine role: the checkpoint it serves (model id and a hash of its config and weight
  // files), which a group's members and a handoff's two ends must share.
  std::string checkpoint;
  // engine.expert_parallel: the group its ranks join ("" without expert parallelism), the
  // group's size as the node declared it (0: not declared) and the speculative drafts per
  // lockstep step (0: off); every member of a group must agree (ep_join_conflict).
  std::string ep_group;
  int32_t ep_group_size = 0;
  int32_t ep_spec_depth = 0;
  friend bool operator==(const node_info&, const node_info&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_info& x) {
  return f(caf::meta::type_name("node_info"), x.name, x.host, x.port, x.roles, x.agent, x.ranks,
           x.storage, x.draining, x.storage_ports, x.engine_role, x.swa_store, x.swa_directory, x.balancers,
           x.ve_worker, x.checkpoint, x.ep_group, x.ep_group_size, x.ep_spec_depth);
}

// The nodes one node agent knows to be up, sorted by name. version grows with every change
// that agent saw (it is local: two agents may number the same view differently).
struct membership {
  uint64_t version = 0;
  std::vector<node_info> nodes;
  friend bool operator==(const membership&, const membership&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, membership& x) {
  return f(caf::meta::type_name("membership"), x.version, x.nodes);
}

// -- expert parallelism ---------------------------------------------------------------------

// One payload of the expert-parallel collective (runtime::expert_transport) from rank
// `source` of group `group` (a hash of the group's member list, so frames of an older or a
// newer group are never mixed with the current one): the dispatch (phase 0) or combine
// (phase 1) bytes of MoE slot `slot` in lockstep step `step`. The bytes are msgpack-framed
// tensors (runtime/ep/expert_parallel.hpp) and are validated by the receiver. With a bulk
// transport the bytes stay in the sender's registered memory and `bulk` describes them
// (length > 0, `bytes` empty): the receiver reads them over libfabric, checked by crc32c.
// `formation` numbers the group's formations: the same members may form the same group again
// (a process cut off and back), and a frame of an earlier formation is never taken for one of
// the current (caf_ep_transport).
struct ep_frame {
  uint64_t group = 0;
  uint64_t step = 0;
  int32_t slot = 0;
  int32_t phase = 0;
  int32_t source = 0;
  std::vector<uint8_t> bytes;
  runtime::remote_memory bulk;
  uint64_t formation = 0;
  friend bool operator==(const ep_frame&, const ep_frame&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ep_frame& x) {
  return f(caf::meta::type_name("ep_frame"), x.group, x.step, x.slot, x.phase, x.source, x.bytes, x.bulk,
           x.formation);
}

// An expert placement (runtime::ep_placement) between processes: the experts of (slot s,
// rank r) are experts[offsets[s·ranks + r] .. offsets[s·ranks + r + 1]). Checked on arrival
// (to_placement).
struct placement_msg {
  uint64_t epoch = 0;
  int64_t slots = 0, logical = 0;
  int32_t ranks = 0;
  std::vector<int32_t> offsets, experts;
  friend bool operator==(const placement_msg&, const placement_msg&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, placement_msg& x) {
  return f(caf::meta::type_name("placement_msg"), x.epoch, x.slots, x.logical, x.ranks, x.offsets, x.experts);
}

// One rank's load report to its group's balancer (runtime::rank_load_report).
struct expert_load_msg {
  uint64_t group = 0, steps = 0;
  int64_t window_steps = 0;
  std::vector<double> window, recent;
  placement_msg placement;
  uint64_t offered_epoch = 0;
  int64_t pairs_computed = 0, expert_bytes = 0;
  // The rank's process: expert weights read from holders / from the checkpoint, lent to
  // peers (bytes), reads from holders that failed, and the last such failure.
  int64_t fetched_bytes = 0, checkpoint_bytes = 0, lent_bytes = 0, fetch_failures = 0;
  int64_t kept_bytes = 0;  // adopted from memory: another rank of the process held them
  std::string fetch_error;
  // Memory: the (slot, expert) pairs this rank computes (redundant copies included); its
  // process's routed experts in memory and their bytes, and its resident set.
  int64_t experts_computed = 0, process_experts = 0, process_expert_bytes = 0, process_rss_bytes = 0;
  friend bool operator==(const expert_load_msg&, const expert_load_msg&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, expert_load_msg& x) {
  return f(caf::meta::type_name("expert_load_msg"), x.group, x.steps, x.window_steps, x.window, x.recent, x.placement,
           x.offered_epoch, x.pairs_computed, x.expert_bytes, x.fetched_bytes, x.checkpoint_bytes, x.lent_bytes,
           x.fetch_failures, x.kept_bytes, x.fetch_error, x.experts_computed, x.process_experts, x.process_expert_bytes,
           x.process_rss_bytes);
}

// The balancer to a rank whose experts other processes gain under placement `epoch`:
// describe (slots[i], experts[i]) for them, and keep them readable for `lease_ms`.
struct expert_lend_msg {
  uint64_t group = 0, epoch = 0;
  int64_t lease_ms = 0;
  std::vector<int32_t> slots, experts;
  friend bool operator==(const expert_lend_msg&, const expert_lend_msg&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, expert_lend_msg& x) {
  return f(caf::meta::type_name("expert_lend_msg"), x.group, x.epoch, x.lease_ms, x.slots, x.experts);
}

}  // namespace shoal::actors
