// Every typed actor interface of shoal, its atoms and the one CAF type-ID block; the messages
// they exchange are in actors/messages.hpp. A type that crosses a process boundary must be listed in the block (CAF only finds
// out at run time otherwise) and has a remote round-trip test in tests/actors/. Only light
// CAF headers here: the heavy ones (actor_system, all.hpp) stay in the .cpp files.
#pragma once

#include <caf/fwd.hpp>
#include <caf/replies_to.hpp>
#include <caf/type_id.hpp>
#include <caf/typed_actor.hpp>

#include "actors/messages.hpp"

// -- atoms (≤ 10 characters) -----------------------------------------------------------------

CAF_ADD_ATOM(shoal, shoal, submit_atom, "submit")
CAF_ADD_ATOM(shoal, shoal, cancel_atom, "cancel")
CAF_ADD_ATOM(shoal, shoal, stats_atom, "stats")
CAF_ADD_ATOM(shoal, shoal, step_atom, "step")
CAF_ADD_ATOM(shoal, shoal, join_atom, "join")
CAF_ADD_ATOM(shoal, shoal, update_atom, "update")
CAF_ADD_ATOM(shoal, shoal, members_atom, "members")
CAF_ADD_ATOM(shoal, shoal, drain_atom, "drain")
CAF_ADD_ATOM(shoal, shoal, kill_atom, "kill")
CAF_ADD_ATOM(shoal, shoal, requests_atom, "requests")
CAF_ADD_ATOM(shoal, shoal, describe_atom, "describe")
CAF_ADD_ATOM(shoal, shoal, subscribe_atom, "subscribe")
CAF_ADD_ATOM(shoal, shoal, route_atom, "route")
CAF_ADD_ATOM(shoal, shoal, done_atom, "done")
CAF_ADD_ATOM(shoal, shoal, expert_atom, "expert")
CAF_ADD_ATOM(shoal, shoal, lockstep_atom, "lockstep")
CAF_ADD_ATOM(shoal, shoal, put_atom, "put")
CAF_ADD_ATOM(shoal, shoal, get_atom, "get")
CAF_ADD_ATOM(shoal, shoal, exists_atom, "exists")
CAF_ADD_ATOM(shoal, shoal, corrupt_atom, "corrupt")
CAF_ADD_ATOM(shoal, shoal, gc_atom, "gc")
CAF_ADD_ATOM(shoal, shoal, handoff_atom, "handoff")
CAF_ADD_ATOM(shoal, shoal, release_atom, "release")
CAF_ADD_ATOM(shoal, shoal, decode_atom, "decode")
CAF_ADD_ATOM(shoal, shoal, lease_atom, "lease")
CAF_ADD_ATOM(shoal, shoal, tick_atom, "tick")
CAF_ADD_ATOM(shoal, shoal, swa_atom, "swa")
CAF_ADD_ATOM(shoal, shoal, lookup_atom, "lookup")
CAF_ADD_ATOM(shoal, shoal, encode_atom, "encode")
CAF_ADD_ATOM(shoal, shoal, eplb_atom, "eplb")

// -- typed interfaces -----------------------------------------------------------------------

namespace shoal::actors {

// Receives the token stream of the requests it submitted (or was named as sink of).
using token_sink_actor = caf::typed_actor<
  // Handles one generated token; events of one request arrive in order, the last one with
  // finished = true. No reply.
  caf::reacts_to<token_event>,
  // A prefill engine lends the request (after its first token): the sink places it on a
  // decode engine and answers the prefill engine with (handoff, id, placed). A sink that
  // never answers gets the rest of the stream from the prefill engine after its lease
  // deadline. No reply.
  caf::reacts_to<handoff_atom, handoff_offer>>;

// One data-parallel engine replica (prefill, decode or both, runtime::engine_role). Owns a runtime::engine and
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
  caf::replies_to<stats_atom>::with<engine_stats_snapshot>,
  // Stops taking new requests (submit then fails with errc::draining); running ones finish.
  // Replies true when the engine was not draining before.
  caf::replies_to<drain_atom>::with<bool>,
  // Decode side of a handoff: reserves blocks, starts reading the offer's ranges and streams
  // the rest of the request to `sink`; replies the offer's id. Errors: no_room (nothing
  // reserved: ask another), invalid_request (what is wrong with the offer), draining,
  // duplicate_request, no_sink. When the reads are over (taken or recomputed) it sends
  // (release, source) to the offer's prefill engine.
  caf::replies_to<handoff_atom, handoff_offer, token_sink_actor>::with<request_id>,
  // Prefill side, from the sink: request `id` was placed on a decode engine (true: wait for
  // its release, at most the lease deadline) or not (false: decode it here). No reply.
  caf::reacts_to<handoff_atom, request_id, bool>,
  // Prefill side, from the decode engine: it is done reading the lent request `source` (the
  // prefill engine's own id); the lease ends. No reply.
  caf::reacts_to<release_atom, request_id, uint64_t>,
  // Expert parallelism, from the engine's rank actor: join lockstep step `step` of group
  // `group` unless this engine has begun it already. No reply.
  caf::reacts_to<lockstep_atom, uint64_t, uint64_t>,
  // Expert parallelism, from the engine's rank actor: adopt group `group` (between steps),
  // in which this engine is rank `rank` of the rank actors `ranks`. No reply.
  caf::reacts_to<lockstep_atom, uint64_t, int32_t, std::vector<caf::actor>>,
  // Expert parallelism, from the group's balancer: this rank's load report. Error
  // not_found without expert parallelism.
  caf::replies_to<eplb_atom>::with<expert_load_msg>,
  // Expert parallelism, from the group's balancer: describe experts this rank's process
  // holds for the processes that gain them (runtime::expert_residency::lend). Error
  // not_found without partitioned weights or a bulk transport, invalid_request naming an
  // expert not held here or another group.
  caf::replies_to<eplb_atom, expert_lend_msg>::with<std::vector<runtime::expert_part>>,
  // Expert parallelism, from the group's balancer: the group's next placement and where the
  // experts it gains can be read; the engine reads them while it keeps stepping, holds them
  // and the ranks switch in band. true once offered; error invalid_request naming what does
  // not fit (bad lists, epoch, shape, one pending, descriptions not of this model).
  caf::replies_to<eplb_atom, placement_msg, std::vector<runtime::expert_part>>::with<bool>>;

// The expert-parallel endpoint of one rank: receives the frames its group's other ranks send
// and hands them to its engine's transport (actors/rank_actor.hpp). Never blocks.
using rank_actor = caf::typed_actor<
  // One frame of the collective; frames of another group are kept until that group is
  // current (a newer one) or dropped when it is replaced (an older one). No reply.
  caf::reacts_to<expert_atom, ep_frame>>;

// The agent of one shoald node: membership (join through any member, announce, monitor the
// others' agents), the node's local actors by name, and the operator commands of the shell.
using node_agent_actor = caf::typed_actor<
  // A node joins through this one: adds `joining` (monitoring its agent) and replies the
  // membership as this agent knows it, the joiner included.
  caf::replies_to<join_atom, node_info>::with<membership>,
  // A member announces itself or a change (draining); added or replaced by name. No reply.
  caf::reacts_to<update_atom, node_info>,
  // The membership as this agent knows it.
  caf::replies_to<members_atom>::with<membership>,
  // Drains this node: its engines and gateway stop taking requests, the change is announced;
  // true when it was not draining before.
  caf::replies_to<drain_atom>::with<bool>,
  // Human-readable state of one local actor: "node", "gateway", "rank<i>" (engine counters).
  // Error not_found for other names.
  caf::replies_to<describe_atom, std::string>::with<std::string>,
  // One line per request in flight at this node's gateway (empty without the role).
  caf::replies_to<requests_atom>::with<std::vector<std::string>>,
  // Kills a local actor ("rank<i>": its engine stops) or, with the node's own name, the
  // whole node process (as kill -9 would, after the reply is sent). Error not_found.
  caf::replies_to<kill_atom, std::string>::with<bool>,
  // Generates `max_tokens` for the prompt text through this node's gateway and streams
  // text_events to `sink`; replies the request id. Error not_found without the gateway role.
  caf::replies_to<submit_atom, std::string, int32_t, caf::actor>::with<request_id>,
  // The expert-parallel balancer's state ("status") or a rebalance now ("rebalance"), as
  // text. Error not_found on a node without expert-parallel ranks.
  caf::replies_to<eplb_atom, std::string>::with<std::string>,
  // Local actors (balancers, rank actors) that want the membership after every change. No reply.
  caf::reacts_to<subscribe_atom, caf::actor>>;

// One storage node: a chunk store on a local directory with its GC and TTL sweeper
// (actors/storage_node_actor.hpp). Every reply is bounded by the request's timeout; bad
// requests (empty or oversized chunks, unknown keys) get an error naming the problem.
using storage_node_actor = caf::typed_actor<
  // Stores a chunk durably (per the node's fsync policy) before replying true. Errors:
  // invalid_request (empty, too large, bad class), storage_full (capacity or disk), unknown.
  caf::replies_to<put_atom, chunk_put>::with<bool>,
  // The chunk's bytes (block key, chunk index). Error not_found (absent or expired) or
  // corrupt (failed its checksum: removed, never served).
  caf::replies_to<get_atom, runtime::block_key, int32_t>::with<std::vector<uint8_t>>,
  // One byte per queried chunk: 1 when held and not expired.
  caf::replies_to<exists_atom, chunk_query>::with<std::vector<uint8_t>>,
  caf::replies_to<stats_atom>::with<storage_stats_snapshot>,
  // Test fault: flips a byte of the chunk's file on disk; true when the chunk existed.
  caf::replies_to<corrupt_atom, runtime::block_key, int32_t>::with<bool>,
  // Runs GC (if over the high watermark) and the TTL sweep now; replies chunks removed.
  caf::replies_to<gc_atom>::with<uint64_t>>;

// The balancers of a gateway node (actors/balancer_actors.hpp), fed the membership by the
// node agent. Both track each request they placed by id until done.
using prefill_balancer_actor = caf::typed_actor<
  // An entry engine (prefill or colocated) for request `id` with this prompt, never one of
  // `exclude` (engines that failed it already; placing it again ends the old placement):
  // runtime::prefill_balancer's policy. Error no_engine when none is left.
  caf::replies_to<route_atom, request_id, std::vector<int32_t>, std::vector<caf::actor>>::with<caf::actor>,
  // Request `id`'s prefill ended (handed off, finished, failed or re-routed). No reply.
  caf::reacts_to<done_atom, request_id>,
  caf::replies_to<stats_atom>::with<balancer_report>,
  caf::reacts_to<membership>>;

using decode_balancer_actor = caf::typed_actor<
  // A decode engine for request `id`'s handoff needing `blocks` free blocks, of `context`
  // tokens and up to `max_new` more, never one of `refused`: the configured
  // runtime::decode_placement over the in-flight counts and the KV tokens and free blocks
  // polled from each decode engine. Error no_engine when none fits.
  caf::replies_to<route_atom, decode_atom, request_id, int64_t, int64_t, int64_t, std::vector<caf::actor>>::with<caf::actor>,
  // Request `id` left the decode engine it was placed at (finished, failed, refused). No reply.
  caf::reacts_to<done_atom, request_id>,
  caf::replies_to<stats_atom>::with<balancer_report>,
  caf::reacts_to<membership>>;

// A vision-encoder worker (ve role, actors/ve_actors.hpp): runs the encoder over images and
// keeps their rows registered with its transport for the prefill engines to read.
using ve_worker_actor = caf::typed_actor<
  // The rows of each image ((count, hidden_size) floats, in order), registered and described
  // (its crc32c included); an image it holds already skips the encoder. Error
  // invalid_request naming a bad image (pixels that do not fit the encoder or its hash).
  caf::replies_to<encode_atom, std::vector<runtime::prompt_image>>::with<std::vector<runtime::remote_memory>>,
  caf::replies_to<stats_atom>::with<ve_worker_stats>>;

// The VE balancer of a gateway node (runtime::ve_balancer over the membership's VE workers).
using ve_balancer_actor = caf::typed_actor<
  // Encodes request `id`'s images on the worker with the least patches queued and replies its
  // rows' ranges; a job whose worker dies, drains or fails is placed again. Error no_engine
  // when no worker is up (the engines encode instead), invalid_request for a bad image.
  caf::replies_to<encode_atom, request_id, std::vector<runtime::prompt_image>>::with<std::vector<runtime::remote_memory>>,
  caf::replies_to<stats_atom>::with<ve_report>,
  caf::reacts_to<membership>>;

// The balancers as the gateway's request relays hold them (ve: invalid when the node runs
// none; images are then encoded by the prefill engines).
struct balancers {
  prefill_balancer_actor prefill;
  decode_balancer_actor decode;
  ve_balancer_actor ve = {};
};

// The OpenAI-compatible HTTP front of a gateway node (actors/gateway_actor.hpp). Its HTTP
// connections run on threads of their own; this interface is the node's view of it.
using gateway_actor = caf::typed_actor<
  // One line per request in flight (id, tokens so far, age, engine attempts).
  caf::replies_to<requests_atom>::with<std::vector<std::string>>,
  // Stops taking new requests (503); running ones finish. True when not draining before.
  caf::replies_to<drain_atom>::with<bool>,
  // Counters as one line of text (requests, tokens, in flight, engines known).
  caf::replies_to<describe_atom>::with<std::string>,
  // Requests in flight.
  caf::replies_to<stats_atom>::with<int64_t>,
  // An operator's request (see node_agent_actor's submit): text_events go to the sink.
  caf::replies_to<submit_atom, std::string, int32_t, caf::actor>::with<request_id>>;

// One machine's SWA slot store (runtime::swa_store, shared by the node's engines): describes
// slots to other machines' engines, which read them with the transport, and reports its keys
// to the directory named in the membership (everything when that directory is new, then the
// changes every 200 ms).
using swa_store_actor = caf::typed_actor<
  // The registered range of the slot saved for `key` (its crc32c taken now). Error not_found.
  caf::replies_to<swa_atom, get_atom, runtime::block_key>::with<runtime::remote_memory>,
  caf::replies_to<stats_atom>::with<swa_store_stats>,
  // The node agent's view after a change. No reply.
  caf::reacts_to<membership>>;

// The SWA-cache directory: prefix block key at a slot's position → holder. Built only from
// the stores' reports, so a restarted directory is complete again once every store reported.
using swa_directory_actor = caf::typed_actor<
  caf::reacts_to<swa_report>,
  // The deepest of `keys` held by a store of a node other than `asker`.
  caf::replies_to<swa_atom, lookup_atom, std::vector<runtime::block_key>, std::string>::with<swa_hit>,
  caf::replies_to<stats_atom>::with<swa_directory_stats>>;

// What an engine actor really handles: its public interface plus the step message it sends
// itself. Only engine_actor.cpp spawns this; everyone else holds an engine_actor.
using engine_actor_impl = engine_actor::extend<
  // Runs one engine step and sends the resulting token events; re-sent while work remains.
  caf::reacts_to<step_atom>,
  // The lease deadline of lent request (engine id, lease number) passed.
  caf::reacts_to<lease_atom, request_id, uint64_t>>;

}  // namespace shoal::actors

// -- the type-ID block: every type that crosses a process boundary ------------------------

CAF_BEGIN_TYPE_ID_BLOCK(shoal, caf::first_custom_type_id)
  CAF_ADD_TYPE_ID(shoal, (shoal::request_id))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::error_reply))
  CAF_ADD_TYPE_ID(shoal, (shoal::runtime::sampling_params))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::generation_request))
  CAF_ADD_TYPE_ID(shoal, (shoal::runtime::token_event))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::engine_stats_snapshot))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::token_sink_actor))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::engine_actor))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::rank_info))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::node_info))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::membership))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::ep_frame))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::text_event))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::rank_actor))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::node_agent_actor))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::prefill_balancer_actor))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::decode_balancer_actor))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::balancer_engine_row))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::balancer_report))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::gateway_actor))
  CAF_ADD_TYPE_ID(shoal, (std::vector<std::string>))
  CAF_ADD_TYPE_ID(shoal, (std::vector<int32_t>))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::chunk_put))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::chunk_query))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::storage_stats_snapshot))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::storage_node_actor))
  CAF_ADD_TYPE_ID(shoal, (std::vector<uint8_t>))
  CAF_ADD_TYPE_ID(shoal, (shoal::runtime::block_key))
  CAF_ADD_TYPE_ID(shoal, (std::vector<shoal::runtime::block_key>))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::handoff_offer))
  CAF_ADD_TYPE_ID(shoal, (shoal::runtime::remote_memory))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::swa_report))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::swa_hit))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::swa_directory_stats))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::swa_store_stats))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::swa_store_actor))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::swa_directory_actor))
  CAF_ADD_TYPE_ID(shoal, (shoal::runtime::prompt_image))
  CAF_ADD_TYPE_ID(shoal, (std::vector<shoal::runtime::prompt_image>))
  CAF_ADD_TYPE_ID(shoal, (std::vector<shoal::runtime::remote_memory>))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::ve_worker_stats))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::ve_worker_row))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::ve_report))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::ve_worker_actor))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::ve_balancer_actor))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::placement_msg))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::expert_load_msg))
  CAF_ADD_TYPE_ID(shoal, (shoal::actors::expert_lend_msg))
  CAF_ADD_TYPE_ID(shoal, (shoal::runtime::expert_part))
  CAF_ADD_TYPE_ID(shoal, (std::vector<shoal::runtime::expert_part>))
CAF_END_TYPE_ID_BLOCK(shoal)

namespace shoal::actors {

// Registers the block's types and the "shoal" error category with `cfg`; call once per
// actor_system_config before constructing the system (both ends of a connection).
void add_message_types(caf::actor_system_config& cfg);

}  // namespace shoal::actors
