// The engine actor's state and handlers. The state owns the runtime::engine and routes each
// request (by the id its caller gave it, the engine's too) to its sink; the handlers translate
// messages into engine calls. Each step message runs exactly one engine step, so submit/cancel/stats queued
// meanwhile are handled between steps.
#include "actors/engine_actor.hpp"

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/system_messages.hpp>
#include <caf/result.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/eplb_actor.hpp"
#include "runtime/ep/expert_residency.hpp"
#include "kernels/assert.hpp"
#include "model/forward.hpp"
#include "runtime/base/metrics.hpp"
#include "runtime/core/handoff_leases.hpp"

namespace shoal::actors {

namespace {

// The last requests that left an engine (stats: the shell and tests follow a request by id).
class request_history {
 public:
  void add(request_id id, runtime::finish_reason reason) {
    if (records_.size() == capacity) records_.pop_front();
    records_.push_back({id, reason});
  }
  std::vector<request_record> list() const { return {records_.begin(), records_.end()}; }

 private:
  static constexpr size_t capacity = 64;
  std::deque<request_record> records_;
};

struct engine_state {
  static inline const char* name = "engine";

  std::unique_ptr<runtime::engine> engine;
  std::unordered_map<request_id, token_sink_actor> routes;  // request → where its events go
  std::map<caf::actor_addr, int64_t> sinks;               // monitored sink → open requests
  request_history history;                                // the last requests that left
  bool step_pending = false;                              // a step message is in the mailbox
  bool draining = false;                                  // refuses new requests
  std::shared_ptr<caf_ep_transport> ep;                   // expert parallelism, else null
  std::shared_ptr<const model::model_weights> weights;    // the engine's (for expert sizes)

  // Prefill side: a request lent to a decode engine, its caches pinned until the decode
  // engine releases them or the lease deadline passes (runtime::handoff_leases). Until
  // placed, the route stays (a refused handoff is decoded here); once placed, the route goes
  // and only the lease is left (a re-routed attempt of the same id that arrives meanwhile
  // ends it: see make_room).
  runtime::handoff_leases leases;
  std::chrono::milliseconds lease_timeout{10'000};
  // Decode side: who lent each imported request (and which lease), told when its reads are over.
  struct lender {
    caf::actor prefill;
    uint64_t lease = 0;
  };
  std::unordered_map<request_id, lender> lenders;

  // Refusals that need no engine: bad id, id still running, nowhere to stream.
  std::optional<error_reply> check_submit(const generation_request& req,
                                          const token_sink_actor& sink) const {
    if (draining) return error_reply{errc::draining, "engine is draining: it takes no new requests"};
    if (!sink) return error_reply{errc::no_sink, "no actor to stream tokens to (anonymous sender?)"};
    if (!req.id.valid()) return error_reply{errc::invalid_request, "request id must be >= 0"};
    if (routes.contains(req.id))
      return error_reply{errc::duplicate_request, "request " + to_string(req.id) + " is still running"};
    return std::nullopt;
  }

  // Records a route; true when its sink is new and needs a monitor.
  bool add_route(request_id id, token_sink_actor sink) {
    bool fresh = sinks[sink.address()]++ == 0;
    routes.emplace(id, std::move(sink));
    return fresh;
  }

  // Removes the route of `id` (must exist) and returns its sink.
  token_sink_actor remove_route(request_id id) {
    auto it = routes.find(id);
    SHOAL_ASSERT(it != routes.end());
    token_sink_actor sink = std::move(it->second);
    routes.erase(it);
    if (auto s = sinks.find(sink.address()); s != sinks.end() && --s->second == 0) sinks.erase(s);
    return sink;
  }

  // Stops request `id` and drops its route; its later events are discarded.
  token_sink_actor drop(request_id id) {
    engine->abort(id);
    leases.drop(id);
    token_sink_actor sink = remove_route(id);
    history.add(id, runtime::finish_reason::aborted);
    engine->forget(id);  // no-op while it is in the running step; see deliver
    return sink;
  }

  engine_stats_snapshot snapshot() const {
    const std::vector<double> fetch_s = engine->swa_fetch_seconds();
    std::vector<request_id> running;
    for (const auto& [id, r] : routes) running.push_back(id);
    std::ranges::sort(running);
    return {engine->stats(),
            runtime::to_string(engine->role()),
            static_cast<int64_t>(routes.size()),
            1000 * runtime::percentile(fetch_s, 0.5),
            1000 * runtime::percentile(fetch_s, 0.99),
            std::move(running),
            history.list()};
  }
};

using self_pointer = engine_actor_impl::stateful_pointer<engine_state>;

// How often an engine whose every request waits on a remote read looks at them again.
constexpr auto remote_poll_interval = std::chrono::milliseconds(1);

void schedule_step(self_pointer self) {
  auto& st = self->state;
  if (st.step_pending || !st.engine->has_work()) return;
  st.step_pending = true;
  self->send(self, step_atom::value);
}

// Stops monitoring `sink` once it has no open request left.
void release_sink(self_pointer self, const token_sink_actor& sink) {
  if (!self->state.sinks.contains(sink.address())) self->demonitor(sink.address());
}

// Sends one runtime event to its request's sink; finished requests leave the tables.
void deliver(self_pointer self, const runtime::token_event& ev) {
  auto& st = self->state;
  if (auto it = st.routes.find(ev.id); it != st.routes.end()) {
    self->send(it->second, ev);
    if (ev.finished) {
      st.history.add(ev.id, ev.reason);
      release_sink(self, st.remove_route(ev.id));
    }
  }
  if (ev.finished) st.engine->forget(ev.id);
}

// A runtime refusal as the reply's code: decided by its errc, never by its text.
error_reply to_reply(runtime::error e) {
  switch (e.code) {
    case runtime::errc::no_room: return {errc::no_room, std::move(e.message)};
    case runtime::errc::duplicate: return {errc::duplicate_request, std::move(e.message)};
    case runtime::errc::timed_out: return {errc::timed_out, std::move(e.message)};
    case runtime::errc::not_found: return {errc::not_found, std::move(e.message)};
    case runtime::errc::refused: return {errc::refused, std::move(e.message)};
    case runtime::errc::corrupt: return {errc::corrupt, std::move(e.message)};
    case runtime::errc::invalid_argument:
    case runtime::errc::unavailable:  // this engine cannot serve it, nor could its peers (same config)
      return {errc::invalid_request, std::move(e.message)};
    default: return {errc::unknown, std::move(e.message)};
  }
}

void end_lease(self_pointer self, request_id id, bool taken);

// A re-routed attempt of a request this engine lent to a decode engine that the relay gave up
// on: that lease ends as if its deadline passed (a late read of the freed blocks fails its
// checksum), so the id is free for the new attempt.
void make_room(self_pointer self, request_id id) {
  auto& st = self->state;
  if (st.leases.lent_out(id) && !st.routes.contains(id)) {
    st.leases.drop(id);
    end_lease(self, id, true);
  }
}

caf::result<request_id> submit(self_pointer self, generation_request& req, token_sink_actor sink) {
  auto& st = self->state;
  if (auto refused = st.check_submit(req, sink)) return make_error(std::move(*refused));
  make_room(self, req.id);
  auto id = st.engine->add_request(req.id, std::move(req.prompt), req.sampling, req.cls,
                                   std::move(req.images), req.resumed);
  if (!id) return make_error(to_reply(std::move(id.error())));
  if (st.add_route(*id, sink)) self->monitor(sink);
  schedule_step(self);
  return *id;
}

void release_lender(self_pointer self, request_id id);

bool cancel(self_pointer self, request_id id) {
  auto& st = self->state;
  if (!st.routes.contains(id)) return false;
  auto sink = st.drop(id);
  release_lender(self, id);
  self->send(sink, token_event{id, -1, true, runtime::finish_reason::aborted});
  release_sink(self, sink);
  return true;
}

// -- handoff ------------------------------------------------------------------------------

void arm_lease(self_pointer self, request_id id, uint64_t number) {
  self->delayed_send(self, self->state.lease_timeout, lease_atom_v, id, number);
}

// Prefill side, after a step: every request that just streamed its first token is offered
// to its sink (the relay places it), under a lease.
void offer_handoffs(self_pointer self) {
  auto& st = self->state;
  for (runtime::handoff_state& h : st.engine->take_handoffs()) {
    auto it = st.routes.find(h.id);
    if (it == st.routes.end()) {  // dropped in the meantime: nothing to lend
      st.engine->handoff_done(h.id, true);
      st.engine->forget(h.id);
      continue;
    }
    const uint64_t lease = st.leases.offer(h.id);
    arm_lease(self, h.id, lease);
    const int64_t need = st.engine->handoff_blocks_needed(h);
    self->send(it->second, handoff_atom_v, to_handoff_offer(h, caf::actor_cast<caf::actor>(self), need, lease));
  }
}

// Prefill side: the lease of `id` ended (the table no longer holds it); taken = the decode
// engine has the request.
void end_lease(self_pointer self, request_id id, bool taken) {
  auto& st = self->state;
  st.engine->handoff_done(id, taken);
  if (!taken) return schedule_step(self);
  if (st.routes.contains(id)) {  // the decode engine's release came before the sink said placed
    st.history.add(id, runtime::finish_reason::handed_off);
    release_sink(self, st.remove_route(id));
  }
  st.engine->forget(id);
}

// Prefill side, from the sink: placed on a decode engine (wait for its release) or not.
void on_placed(self_pointer self, request_id id, bool placed) {
  auto& st = self->state;
  if (!st.routes.contains(id)) return;  // released already, or cancelled
  const auto p = st.leases.placed(id, placed);
  if (p.ended) return end_lease(self, id, false);
  if (!p.rearm) return;
  st.history.add(id, runtime::finish_reason::handed_off);
  release_sink(self, st.remove_route(id));
  arm_lease(self, id, *p.rearm);
}

// Prefill side, from the decode engine: its reads of lease `offer` of `id` are over (this
// engine may lend `id` again after a re-routed attempt: a stale release names an older lease).
void on_release(self_pointer self, request_id id, uint64_t offer) {
  if (self->state.leases.release(id, offer)) end_lease(self, id, true);
}

// Placed: the decode engine went quiet (a late read fails its checksum). Never placed: the
// sink did not answer, so the request is decoded here.
void on_lease_deadline(self_pointer self, request_id id, uint64_t number) {
  if (auto taken = self->state.leases.expire(id, number)) end_lease(self, id, *taken);
}

void release_lender(self_pointer self, request_id id) {
  auto& st = self->state;
  auto it = st.lenders.find(id);
  if (it == st.lenders.end()) return;
  self->send(caf::actor_cast<engine_actor>(it->second.prefill), release_atom_v, id, it->second.lease);
  st.lenders.erase(it);
}

// Decode side: reserve, start the reads, stream the rest to `sink`.
caf::result<request_id> take_handoff(self_pointer self, const handoff_offer& offer, token_sink_actor sink) {
  auto& st = self->state;
  generation_request probe;
  probe.id = offer.id;
  if (auto refused = st.check_submit(probe, sink)) return make_error(std::move(*refused));
  make_room(self, offer.id);
  auto id = st.engine->add_handoff(to_handoff_state(offer));
  if (!id) return make_error(to_reply(std::move(id.error())));
  if (st.add_route(*id, sink)) self->monitor(sink);
  st.lenders[*id] = {offer.prefill, offer.lease};
  schedule_step(self);
  return *id;
}

// One engine step (with expert parallelism: one lockstep step of the group, which runs even
// without work when a peer began it, see join).
void run_step(self_pointer self) {
  auto& st = self->state;
  for (const runtime::token_event& ev : st.engine->step()) deliver(self, ev);
  for (request_id id : st.engine->take_imports_over()) release_lender(self, id);
  offer_handoffs(self);
  if (st.engine->stalled() && !st.ep) {  // remote reads pending: look again shortly, not at once
    if (!st.step_pending) {
      st.step_pending = true;
      self->delayed_send(self, remote_poll_interval, step_atom::value);
    }
    return;
  }
  schedule_step(self);
}

void step(self_pointer self) {
  self->state.step_pending = false;
  if (self->state.engine->has_work()) run_step(self);
}

// A peer began lockstep step `s` of `group`: join it unless this engine has begun it.
void join(self_pointer self, uint64_t group, uint64_t s) {
  auto& st = self->state;
  if (!st.ep || st.ep->group() != group || st.engine->steps_started() > s) return;
  run_step(self);
}

void adopt_group(self_pointer self, uint64_t group, int32_t rank, std::vector<caf::actor>& ranks) {
  auto& st = self->state;
  if (!st.ep) return;
  std::vector<rank_actor> peers;
  for (auto& r : ranks) peers.push_back(caf::actor_cast<rank_actor>(std::move(r)));
  auto size = static_cast<int32_t>(peers.size());
  // Where each rank of the previous group is now: the group agrees its placement from what
  // its ranks ran (runtime/placement/regroup.hpp).
  std::vector<int32_t> moved;
  for (const rank_actor& old : st.ep->peers()) {
    auto it = std::find(peers.begin(), peers.end(), old);
    moved.push_back(it == peers.end() ? -1 : static_cast<int32_t>(it - peers.begin()));
  }
  bool waiting = st.ep->set_group(group, rank, std::move(peers));
  st.engine->set_ep_group({rank, size}, st.ep, std::move(moved));
  if (waiting) run_step(self);
}

// Expert parallelism: this rank's load report for the group's balancer.
caf::result<expert_load_msg> load_report(self_pointer self) {
  auto& st = self->state;
  const runtime::ep_moe_exchange* ex = st.engine->expert_exchange();
  if (!st.ep || !ex) return make_error(errc::not_found, "engine runs without expert parallelism");
  expert_load_msg m;
  m.group = st.ep->group();
  m.steps = ex->steps_started();
  m.window_steps = ex->loads().steps();
  m.window = ex->loads().totals();
  m.recent = ex->loads().latest();
  m.placement = to_msg(*ex->placement());
  m.offered_epoch = ex->offered() ? ex->offered()->epoch() : 0;
  m.pairs_computed = ex->pairs_computed();
  auto& w = const_cast<model::model_weights&>(*st.weights);  // read only: sizes of resident experts
  for (int64_t s = 0; s < ex->slot_count() && m.expert_bytes == 0; ++s)
    for (int32_t e : ex->placement()->experts_of(s, ex->layout().rank)) {
      const auto& x = model::routed_expert_weights(w, s, e);
      if (!x.gate_up.empty()) {
        m.expert_bytes = static_cast<int64_t>(x.gate_up.bytes() + x.down.bytes());
        break;
      }
    }
  for (int64_t s = 0; s < ex->slot_count(); ++s)
    m.experts_computed += static_cast<int64_t>(ex->placement()->experts_of(s, ex->layout().rank).size());
  m.process_rss_bytes = runtime::process_resident_bytes();
  if (const auto* experts = st.engine->expert_residency_of()) {
    m.process_experts = experts->resident_experts();
    m.process_expert_bytes = experts->resident_bytes();
    const auto mig = experts->migration();
    m.fetched_bytes = mig.fetched_bytes;
    m.kept_bytes = mig.kept_bytes;
    m.checkpoint_bytes = mig.checkpoint_bytes;
    m.lent_bytes = mig.lent_bytes;
    m.fetch_failures = mig.fetch_failures;
    m.fetch_error = mig.last_failure;
  }
  return m;
}

// Answers one lend request with `job`'s descriptions, then quits.
using lender_actor =
  caf::typed_actor<caf::replies_to<eplb_atom, expert_lend_msg>::with<std::vector<runtime::expert_part>>>;

lender_actor::behavior_type lender_behavior(lender_actor::pointer self, runtime::engine::lend_job job) {
  return {
    [self, job = std::move(job)](eplb_atom, const expert_lend_msg&) -> caf::result<std::vector<runtime::expert_part>> {
      self->quit();
      auto parts = job();
      if (!parts) return make_error(to_reply(std::move(parts.error())));
      return std::move(*parts);
    },
  };
}

// Expert parallelism: describe experts this process holds for the processes that gain them.
caf::result<std::vector<runtime::expert_part>> lend_experts(self_pointer self, const expert_lend_msg& m) {
  auto& st = self->state;
  if (!st.ep || !st.engine->expert_exchange()) return make_error(errc::not_found, "engine runs without expert parallelism");
  if (m.group != st.ep->group())
    return make_error(errc::invalid_request, "asked to lend experts for another expert-parallel group");
  if (m.slots.size() != m.experts.size() || m.lease_ms < 1 || m.lease_ms > 3'600'000)
    return make_error(errc::invalid_request, "lend request with " + std::to_string(m.slots.size()) + " slots, " +
                                                 std::to_string(m.experts.size()) + " experts and a lease of " +
                                                 std::to_string(m.lease_ms) + " ms");
  std::vector<std::pair<int32_t, int32_t>> experts;
  for (size_t i = 0; i < m.slots.size(); ++i) experts.emplace_back(m.slots[i], m.experts[i]);
  auto job = st.engine->prepare_lend(m.epoch, std::move(experts), std::chrono::milliseconds(m.lease_ms));
  if (!job) return make_error(to_reply(std::move(job.error())));
  // Registering and checksumming the weights takes time in proportion to their bytes: a
  // one-shot detached actor does it and answers the balancer, the engine keeps stepping.
  auto lender = self->spawn<caf::detached>(lender_behavior, std::move(*job));
  return self->delegate(lender, eplb_atom_v, m);
}

// Expert parallelism: the group's next placement from its balancer.
caf::result<bool> take_placement(self_pointer self, const placement_msg& m,
                                 const std::vector<runtime::expert_part>& sources) {
  auto& st = self->state;
  if (!st.ep || !st.engine->expert_exchange()) return make_error(errc::not_found, "engine runs without expert parallelism");
  auto place = to_placement(m);
  if (!place) return make_error(errc::invalid_request, place.error());
  auto offered = st.engine->offer_placement(std::make_shared<const runtime::ep_placement>(std::move(*place)), sources);
  if (!offered) return make_error(to_reply(std::move(offered.error())));
  return true;
}

// A sink went away: its requests stop (nobody would read their tokens).
void on_sink_down(self_pointer self, const caf::down_msg& msg) {
  auto& st = self->state;
  std::vector<request_id> orphans;
  for (const auto& [id, r] : st.routes)
    if (r.address() == msg.source) orphans.push_back(id);
  for (request_id id : orphans) {
    st.drop(id);
    release_lender(self, id);
  }
  st.sinks.erase(msg.source);
}

engine_actor_impl::behavior_type engine_behavior(self_pointer self,
                                                 std::shared_ptr<const model::model_weights> weights,
                                                 runtime::engine_config config,
                                                 std::shared_ptr<caf_ep_transport> ep,
                                                 std::shared_ptr<const model::tokenizer> tok) {
  if (ep) {  // the rank's own transport; the rest (load window, bulk transport) as configured
    auto c = config.ep.value_or(runtime::engine_config::ep_config{});
    if (!config.ep) c.load_window_steps = runtime::eplb_policy::decode().window_steps;
    c.layout = {0, 1};
    c.transport = ep;
    config.ep = std::move(c);
  }
  self->state.ep = std::move(ep);
  self->state.weights = weights;
  self->state.lease_timeout = 2 * config.handoff_read_timeout;
  self->state.engine = std::make_unique<runtime::engine>(std::move(weights), config, std::move(tok));
  self->set_down_handler([self](caf::down_msg& msg) { on_sink_down(self, msg); });
  return {
    [self](submit_atom, generation_request& req) -> caf::result<request_id> {
      return submit(self, req, caf::actor_cast<token_sink_actor>(self->current_sender()));
    },
    [self](submit_atom, generation_request& req, token_sink_actor& sink) -> caf::result<request_id> {
      return submit(self, req, std::move(sink));
    },
    [self](cancel_atom, request_id id) { return cancel(self, id); },
    [self](stats_atom) { return self->state.snapshot(); },
    [self](drain_atom) { return !std::exchange(self->state.draining, true); },
    [self](handoff_atom, const handoff_offer& offer, token_sink_actor& sink) -> caf::result<request_id> {
      return take_handoff(self, offer, std::move(sink));
    },
    [self](handoff_atom, request_id id, bool placed) { on_placed(self, id, placed); },
    [self](release_atom, request_id id, uint64_t lease) { on_release(self, id, lease); },
    [self](lease_atom, request_id id, uint64_t number) { on_lease_deadline(self, id, number); },
    [self](step_atom) { step(self); },
    [self](lockstep_atom, uint64_t group, uint64_t s) { join(self, group, s); },
    [self](lockstep_atom, uint64_t group, int32_t rank, std::vector<caf::actor>& ranks) {
      adopt_group(self, group, rank, ranks);
    },
    [self](eplb_atom) { return load_report(self); },
    [self](eplb_atom, const expert_lend_msg& m) { return lend_experts(self, m); },
    [self](eplb_atom, const placement_msg& m, const std::vector<runtime::expert_part>& sources) {
      return take_placement(self, m, sources);
    },
  };
}

}  // namespace

engine_actor spawn_engine(caf::actor_system& sys, std::shared_ptr<const model::model_weights> weights,
                          const runtime::engine_config& config, bool detached,
                          std::shared_ptr<caf_ep_transport> ep, std::shared_ptr<const model::tokenizer> tok) {
  if (detached || ep)
    return sys.spawn<caf::detached>(engine_behavior, std::move(weights), config, std::move(ep), std::move(tok));
  return sys.spawn(engine_behavior, std::move(weights), config, std::move(ep), std::move(tok));
}

}  // namespace shoal::actors
