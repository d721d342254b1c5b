// Every typed actor interface of shoal, the messages they exchange and the one CAF type-ID
// block. A type that crosses a process boundary must be listed in the block (CAF only finds
// out at run time otherwise) and has a remote round-trip test in tests/actors/. Only light
// CAF headers here: the heavy ones (actor_system, all.hpp) stay in the .cpp files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/type_id.hpp>
#include <caf/typed_actor.hpp>

#include "runtime/ids.hpp"
#include "runtime/sampler.hpp"

// -- strong ids on the wire ---------------------------------------------------------------

namespace shoal {

// request_id, block_id, ...: serialised as their integer value.
template <class Inspector, class Tag, class Rep>
typename Inspector::result_type inspect(Inspector& f, strong_id<Tag, Rep>& x) {
  return f(caf::meta::type_name("strong_id"), x.value);
}

}  // namespace shoal

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

// runtime::sampling_params on the wire (std::optional<uint64_t> seed → has_seed + seed).
struct sampling_options {
  float temperature = 0.0f;  // 0 = greedy
  int32_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // in (0, 1]; 1 = off
  int32_t max_tokens = 16;   // generated tokens, ≥ 1
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop_strings;
  bool ignore_eos = false;
  bool has_seed = false;
  uint64_t seed = 0;         // meaningful only with has_seed
  friend bool operator==(const sampling_options&, const sampling_options&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sampling_options& x) {
  return f(caf::meta::type_name("sampling_options"), x.temperature, x.top_k, x.top_p, x.max_tokens,
           x.stop_token_ids, x.stop_strings, x.ignore_eos, x.has_seed, x.seed);
}

sampling_options to_sampling_options(const runtime::sampling_params& p);
runtime::sampling_params to_sampling_params(const sampling_options& o);

// One generation request. `id` is chosen by the caller (the gateway makes it unique in the
// cluster); token events and cancel refer to it.
struct generation_request {
  request_id id;
  std::vector<int32_t> prompt;  // (n_prompt,) token ids, BOS included when the model wants one
  sampling_options sampling;
  friend bool operator==(const generation_request&, const generation_request&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, generation_request& x) {
  return f(caf::meta::type_name("generation_request"), x.id, x.prompt, x.sampling);
}

// One generated token of a request, streamed to the request's sink in generation order. The
// last event of a request has finished = true; a cancelled request ends with token -1 and
// reason aborted.
struct token_event {
  request_id id;
  int32_t token = -1;
  bool finished = false;
  runtime::finish_reason reason = runtime::finish_reason::none;  // on the wire: its integer
  friend bool operator==(const token_event&, const token_event&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_event& x) {
  return f(caf::meta::type_name("token_event"), x.id, x.token, x.finished, x.reason);
}

// A snapshot of an engine's counters (runtime::engine_stats plus the actor's own).
struct engine_stats_snapshot {
  uint64_t steps = 0;
  uint64_t prefill_tokens = 0;
  uint64_t decode_tokens = 0;
  uint64_t generated = 0;
  uint64_t prefix_hit_tokens = 0;
  int64_t requests_running = 0;  // submitted, not yet finished or cancelled
  int64_t blocks_free = 0;
  int64_t blocks_total = 0;
  friend bool operator==(const engine_stats_snapshot&, const engine_stats_snapshot&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, engine_stats_snapshot& x) {
  return f(caf::meta::type_name("engine_stats_snapshot"), x.steps, x.prefill_tokens, x.decode_tokens,
           x.generated, x.prefix_hit_tokens, x.requests_running, x.blocks_free, x.blocks_total);
}

}  // namespace shoal::actors

// -- atoms (≤ 10 characters) -----------------------------------------------------------------

CAF_ADD_ATOM(shoal, shoal, submit_atom, "submit")
CAF_ADD_ATOM(shoal, shoal, cancel_atom, "cancel")
CAF_ADD_ATOM(shoal, shoal, stats_atom, "stats")
CAF_ADD_ATOM(shoal, shoal, step_atom, "step")

// -- typed interfaces -----------------------------------------------------------------------

namespace shoal::actors {

// Receives the token stream of the requests it submitted (or was named as sink of).
using token_sink_actor = caf::typed_actor<
  // Handles one generated token; events of one request arrive in order, the last one with
  // finished = true. No reply.
  caf::reacts_to<token_event>>;

// One data-parallel engine replica (colocated prefill + decode). Owns a runtime::engine and
// steps it while it has work, one step per message, so submit/cancel/stats interleave.
using engine_actor = caf::typed_actor<
  // Queues `req` and streams its token events to the sender. Replies req.id once queued, or
  // an error: invalid_request (add_request's message), duplicate_request, no_sink.
  caf::replies_to<submit_atom, generation_request>::with<request_id>,
  // As above, streaming to `sink` instead of the sender (a gateway submitting for a client).
  caf::replies_to<submit_atom, generation_request, token_sink_actor>::with<request_id>,
  // Aborts request `id`: true when it was running (its sink then gets a final event with
  // reason aborted and nothing after it), false when unknown or already finished.
  caf::replies_to<cancel_atom, request_id>::with<bool>,
  // Reports the engine's counters.
  caf::replies_to<stats_atom>::with<engine_stats_snapshot>>;

// What an engine actor really handles: its public interface plus the step message it sends
// itself. Only engine_actor.cpp spawns this; everyone else holds an engine_actor.
using engine_actor_impl = engine_actor::extend<
  // Runs one engine step and sends the resulting token events; re-sent while work remains.
  caf::reacts_to<step_atom>>;

}  // namespace shoal::actors

// -- the type-ID block: every type that crosses a process boundary ------------------------

CAF_BEGIN_TYPE_ID_BLOCK(shoal, caf::first_custom_type_id)
  CAF_ADD_TYPE_ID(shoal, (shoal::request_id))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::error_reply))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::sampling_options))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::generation_request))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::token_event))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::engine_stats_snapshot))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::token_sink_actor))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::engine_actor))
CAF_END_TYPE_ID_BLOCK(shoal)

namespace shoal::actors {

// Registers the block's types and the "shoal" error category with `cfg`; call once per
// actor_system_config before constructing the system (both ends of a connection).
void add_message_types(caf::actor_system_config& cfg);

}  // namespace shoal::actors
