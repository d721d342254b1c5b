// The relay actor: route → submit → forward tokens; on failure exclude a dead engine, back
// off, and submit again elsewhere, skipping the tokens already forwarded.
#include "actors/request_relay.hpp"

#include <algorithm>

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/system_messages.hpp>

namespace shoal::actors {

void stream_channel::push(stream_item item) {
  {
    std::lock_guard lock(mu_);
    items_.push_back(std::move(item));
  }
  cv_.notify_one();
}

std::optional<stream_item> stream_channel::pop(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_until(lock, deadline, [&] { return !items_.empty(); })) return std::nullopt;
  stream_item item = std::move(items_.front());
  items_.pop_front();
  return item;
}

namespace {

// Private self-messages: route_atom = try (again) now, kill_atom = the request's time is up.
struct relay_state {
  static inline const char* name = "request_relay";
  balancers bal;
  generation_request req;
  std::shared_ptr<stream_channel> channel;
  relay_options options;
  std::vector<caf::actor> exclude;  // engines that went down under this request
  caf::actor engine;                // the current attempt's engine
  int attempt = 0;
  int64_t forwarded = 0;            // tokens the client has
  int64_t received = 0;             // tokens of the current attempt
  // A handoff being placed: the offer of the current (prefill) engine, the decode engines
  // that refused it, and a number that makes answers to an older placement stale.
  std::optional<handoff_offer> offer;
  std::vector<caf::actor> refused;
  uint64_t placement = 0;
};

using relay_pointer = caf::stateful_actor<relay_state>*;

// The request left its engine: each balancer ends its placement of it (one that did not
// place it ignores the id).
void release(relay_pointer self) {
  self->send(self->state.bal.prefill, done_atom_v, self->state.req.id);
  self->send(self->state.bal.decode, done_atom_v, self->state.req.id);
}

void finish(relay_pointer self) {
  auto& st = self->state;
  if (st.engine) release(self);
  st.engine = nullptr;
  self->quit();
}

void give_up(relay_pointer self, error_reply err) {
  self->state.channel->push({-1, true, runtime::finish_reason::error, std::move(err), 0});
  finish(self);
}

// Drops the current engine (excluded from now on when it is gone for good) and tries again
// after a backoff, unless the error is the request's own fault or attempts are used up.
void retry(relay_pointer self, error_reply err, bool exclude_engine) {
  auto& st = self->state;
  st.offer.reset();
  ++st.placement;
  if (st.engine) {
    self->demonitor(st.engine);
    release(self);
    if (exclude_engine) st.exclude.push_back(st.engine);
    st.engine = nullptr;
  }
  if (err.code == errc::invalid_request) return give_up(self, std::move(err));
  if (++st.attempt >= st.options.max_attempts) {
    err.message = "gave up after " + std::to_string(st.attempt) + " attempt(s): " + err.message;
    return give_up(self, std::move(err));
  }
  self->delayed_send(self, st.options.retry_backoff * st.attempt, route_atom_v);
}

void submit_to(relay_pointer self, caf::actor engine) {
  auto& st = self->state;
  st.engine = engine;
  st.received = 0;
  self->monitor(engine);
  self->request(caf::actor_cast<engine_actor>(engine), st.options.request_timeout, submit_atom_v, st.req,
                caf::actor_cast<token_sink_actor>(self))
    .then([](request_id) {},
          [self, engine](caf::error& e) {
            if (engine != self->state.engine) return;  // a stale attempt
            error_reply r = to_error_reply(e);
            retry(self, r, r.code == errc::unreachable || r.code == errc::draining);
          });
}

void attempt(relay_pointer self) {
  auto& st = self->state;
  self->request(st.bal.prefill, st.options.request_timeout, route_atom_v, st.req.id, st.req.prompt, st.exclude)
    .then([self](caf::actor& engine) { submit_to(self, std::move(engine)); },
          [self](caf::error& e) { give_up(self, to_error_reply(e)); });
}

// Images first, when the gateway has a VE balancer: the pool encodes them and the prefill
// engine reads their rows. Without a worker (or when the pool fails) the request goes on
// without rows and its prefill engine encodes; a bad image fails the request.
void encode_images(relay_pointer self) {
  auto& st = self->state;
  self->request(st.bal.ve, st.options.request_timeout, encode_atom_v, st.req.id, st.req.images)
    .then(
      [self](std::vector<runtime::remote_memory>& rows) {
        auto& st = self->state;
        if (rows.size() == st.req.images.size())
          for (size_t i = 0; i < rows.size(); ++i) st.req.images[i].rows = std::move(rows[i]);
        attempt(self);
      },
      [self](caf::error& e) {
        error_reply r = to_error_reply(e);
        if (r.code == errc::invalid_request) return give_up(self, std::move(r));
        attempt(self);
      });
}

// -- handoff placement -------------------------------------------------------------------

// Nobody takes the offer: the prefill engine decodes the request itself.
void keep_on_prefill(relay_pointer self) {
  auto& st = self->state;
  st.offer.reset();
  ++st.placement;
  self->send(caf::actor_cast<engine_actor>(st.engine), handoff_atom_v, st.req.id, false);
}

void place(relay_pointer self);

// Hands the offer to decode engine `d`; on success `d` is the request's engine from now on.
void ask_decode(relay_pointer self, caf::actor d, uint64_t placement) {
  auto& st = self->state;
  self->request(caf::actor_cast<engine_actor>(d), st.options.handoff_timeout, handoff_atom_v, *st.offer,
                caf::actor_cast<token_sink_actor>(self))
    .then(
      [self, d, placement](request_id) {
        auto& st = self->state;
        if (placement != st.placement || !st.offer) {  // the request moved on meanwhile
          caf::anon_send(caf::actor_cast<engine_actor>(d), cancel_atom_v, st.req.id);
          self->send(st.bal.decode, done_atom_v, st.req.id);
          return;
        }
        const caf::actor prefill = st.engine;
        self->demonitor(prefill);
        self->send(st.bal.prefill, done_atom_v, st.req.id);  // its prefill is over
        self->send(caf::actor_cast<engine_actor>(prefill), handoff_atom_v, st.req.id, true);
        st.engine = d;
        self->monitor(d);
        st.received = static_cast<int64_t>(st.offer->tokens.size()) - st.offer->prompt_len;
        st.offer.reset();
        ++st.placement;
      },
      [self, d, placement](caf::error&) {
        auto& st = self->state;
        self->send(st.bal.decode, done_atom_v, st.req.id);
        if (placement != st.placement || !st.offer) return;
        st.refused.push_back(d);
        if (static_cast<int>(st.refused.size()) >= st.options.handoff_attempts) return keep_on_prefill(self);
        place(self);
      });
}

void place(relay_pointer self) {
  auto& st = self->state;
  const uint64_t placement = st.placement;
  const auto context = static_cast<int64_t>(st.offer->tokens.size());
  const int64_t left = std::max<int64_t>(0, st.offer->sampling.max_tokens - (context - st.offer->prompt_len));
  self->request(st.bal.decode, st.options.handoff_timeout, route_atom_v, decode_atom_v, st.req.id, st.offer->blocks_needed, context,
                left, st.refused)
    .then(
      [self, placement](caf::actor& d) {
        if (placement != self->state.placement || !self->state.offer) {
          self->send(self->state.bal.decode, done_atom_v, self->state.req.id);
          return;
        }
        ask_decode(self, std::move(d), placement);
      },
      [self, placement](caf::error&) {
        if (placement == self->state.placement && self->state.offer) keep_on_prefill(self);
      });
}

void on_offer(relay_pointer self, handoff_offer& offer) {
  auto& st = self->state;
  if (!st.engine || self->current_sender() != caf::actor_cast<caf::strong_actor_ptr>(st.engine) ||
      offer.id != st.req.id) {  // a stale attempt's: nobody reads it
    if (offer.prefill) caf::anon_send(caf::actor_cast<engine_actor>(offer.prefill), cancel_atom_v, offer.id);
    return;
  }
  st.offer = std::move(offer);
  st.refused.clear();
  ++st.placement;
  place(self);
}

void on_token(relay_pointer self, const token_event& ev) {
  auto& st = self->state;
  if (!st.engine || self->current_sender() != caf::actor_cast<caf::strong_actor_ptr>(st.engine)) return;
  if (ev.finished && ev.reason == runtime::finish_reason::error)
    return retry(self, {errc::unknown, "the engine failed a step of this request"}, false);
  if (ev.token >= 0 && ++st.received > st.forwarded) {
    ++st.forwarded;
    st.channel->push({ev.token, false, runtime::finish_reason::none, std::nullopt, 0, ev.logprobs});
  }
  if (ev.finished) {
    st.channel->push({-1, true, ev.reason, std::nullopt, ev.cached_tokens});
    finish(self);
  }
}

caf::behavior relay_behavior(caf::stateful_actor<relay_state>* self, balancers bal,
                             generation_request req, std::shared_ptr<stream_channel> channel,
                             relay_options options) {
  auto& st = self->state;
  st.bal = std::move(bal);
  st.req = std::move(req);
  st.channel = std::move(channel);
  st.options = options;
  self->set_down_handler([self](caf::down_msg& msg) {
    if (self->state.engine && msg.source == self->state.engine.address())
      retry(self, {errc::unreachable, "its engine went down"}, true);
  });
  self->delayed_send(self, options.request_timeout, kill_atom_v);
  if (!st.req.images.empty() && st.bal.ve) encode_images(self);
  else attempt(self);
  return {
    [self](const token_event& ev) { on_token(self, ev); },
    [self](handoff_atom, handoff_offer& offer) { on_offer(self, offer); },
    [self](route_atom) { attempt(self); },
    [self](cancel_atom) {
      if (self->state.engine) caf::anon_send(caf::actor_cast<engine_actor>(self->state.engine), cancel_atom_v,
                                             self->state.req.id);
      finish(self);
    },
    [self](kill_atom) {
      give_up(self, {errc::timed_out, "no answer within the request timeout of " +
                                          std::to_string(self->state.options.request_timeout.count()) + " ms"});
    },
  };
}

}  // namespace

caf::actor spawn_request_relay(caf::actor_system& sys, balancers bal, generation_request req,
                               std::shared_ptr<stream_channel> channel, relay_options options) {
  return sys.spawn(relay_behavior, std::move(bal), std::move(req), std::move(channel), options);
}

}  // namespace shoal::actors
