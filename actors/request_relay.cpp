// The relay actor: route → submit → forward tokens; on failure exclude a dead engine, back
// off, and submit again elsewhere, skipping the tokens already forwarded.
#include "actors/request_relay.hpp"

#include <algorithm>
#include <span>

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/system_messages.hpp>

#include "runtime/core/relay.hpp"

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

runtime::relay_error to_relay_error(const error_reply& r) {
  return {runtime::relay_failure::host, static_cast<int>(r.code), r.code == errc::invalid_request, r.message};
}

error_reply to_reply(const runtime::relay_error& e) {
  switch (e.kind) {
    case runtime::relay_failure::host: return {static_cast<errc>(e.host_code), e.message};
    case runtime::relay_failure::timed_out: return {errc::timed_out, e.message};
    case runtime::relay_failure::engine_down: return {errc::unreachable, e.message};
    case runtime::relay_failure::step_failed: return {errc::unknown, e.message};
  }
  return {errc::unknown, e.message};
}

struct relay_state;
using relay_pointer = caf::stateful_actor<relay_state>*;

// The actor hosts runtime::relay (the protocol) and does its messaging: engines are indices
// into `engines`. Private self-messages: route_atom = retry now, kill_atom = the request's
// time is up.
class actor_host final : public runtime::relay_host {
 public:
  explicit actor_host(relay_pointer self) : self_(self) {}
  engine_id intern(const caf::actor& a);
  const caf::actor& at(engine_id e) const { return engines_.at(static_cast<size_t>(e.value)); }
  std::optional<engine_id> find(const caf::actor_addr& a) const;
  std::vector<caf::actor> actors(std::span<const engine_id> ids) const;

  void encode_images() override;
  void route(std::span<const engine_id> exclude) override;
  void submit(engine_id e, int64_t resume) override;
  void watch(engine_id e) override;
  void unwatch(engine_id e) override;
  void release_prefill() override;
  void release_decode() override;
  void retry_after(double seconds) override;
  void route_decode(uint64_t placement, std::span<const engine_id> refused) override;
  void offer_to(engine_id d, uint64_t placement) override;
  void tell_placed(engine_id e, bool placed) override;
  void cancel_at(engine_id e) override;
  void fail(const runtime::relay_error& err) override;

 private:
  relay_pointer self_;
  std::vector<caf::actor> engines_;
};

struct relay_state {
  static inline const char* name = "request_relay";
  balancers bal;
  generation_request req;
  std::vector<int32_t> sent;  // the tokens the client has (a re-routed submit resumes after them)
  std::shared_ptr<stream_channel> channel;
  relay_options options;
  std::optional<handoff_offer> offer;  // the prefill engine's, while the machine places it
  std::unique_ptr<actor_host> host;
  std::unique_ptr<runtime::relay> machine;
};

// After each input: the machine done means the actor is too.
void settle(relay_pointer self) {
  auto& st = self->state;
  if (!st.machine->placing()) st.offer.reset();
  if (st.machine->done()) self->quit();
}

engine_id actor_host::intern(const caf::actor& a) {
  for (size_t i = 0; i < engines_.size(); ++i)
    if (engines_[i] == a) return engine_id{static_cast<int64_t>(i)};
  engines_.push_back(a);
  return engine_id{static_cast<int64_t>(engines_.size() - 1)};
}

std::optional<engine_id> actor_host::find(const caf::actor_addr& a) const {
  for (size_t i = 0; i < engines_.size(); ++i)
    if (engines_[i].address() == a) return engine_id{static_cast<int64_t>(i)};
  return std::nullopt;
}

std::vector<caf::actor> actor_host::actors(std::span<const engine_id> ids) const {
  std::vector<caf::actor> out;
  for (engine_id e : ids) out.push_back(at(e));
  return out;
}

// Images first, when the gateway has a VE balancer: the pool encodes them and the prefill
// engine reads their rows. Without a worker (or when the pool fails) the request goes on
// without rows and its prefill engine encodes; a bad image fails the request.
void actor_host::encode_images() {
  auto& st = self_->state;
  self_->request(st.bal.ve, st.options.request_timeout, encode_atom_v, st.req.id, st.req.images)
    .then(
      [self = self_](std::vector<runtime::remote_memory>& rows) {
        auto& st = self->state;
        if (rows.size() == st.req.images.size())
          for (size_t i = 0; i < rows.size(); ++i) st.req.images[i].rows = std::move(rows[i]);
        st.machine->images_encoded(nullptr);
        settle(self);
      },
      [self = self_](caf::error& e) {
        const runtime::relay_error err = to_relay_error(to_error_reply(e));
        self->state.machine->images_encoded(&err);
        settle(self);
      });
}

void actor_host::route(std::span<const engine_id> exclude) {
  auto& st = self_->state;
  self_->request(st.bal.prefill, st.options.request_timeout, route_atom_v, st.req.id, st.req.prompt, actors(exclude))
    .then(
      [self = self_](caf::actor& engine) {
        self->state.machine->routed(self->state.host->intern(engine));
        settle(self);
      },
          [self = self_](caf::error& e) {
            const error_reply r = to_error_reply(e);
            self->state.machine->route_failed(to_relay_error(r), r.code == errc::no_engine);
            settle(self);
          });
}

void actor_host::submit(engine_id e, int64_t resume) {
  auto& st = self_->state;
  self_->monitor(at(e));
  st.req.resumed.assign(st.sent.begin(), st.sent.begin() + std::min<int64_t>(resume, std::ssize(st.sent)));
  self_->request(caf::actor_cast<engine_actor>(at(e)), st.options.request_timeout, submit_atom_v, st.req,
                 caf::actor_cast<token_sink_actor>(self_))
    .then([](request_id) {},
          [self = self_, e](caf::error& err) {
            const error_reply r = to_error_reply(err);
            self->state.machine->submit_failed(e, to_relay_error(r),
                                               r.code == errc::unreachable || r.code == errc::draining);
            settle(self);
          });
}

void actor_host::watch(engine_id e) { self_->monitor(at(e)); }
void actor_host::unwatch(engine_id e) { self_->demonitor(at(e)); }

void actor_host::release_prefill() { self_->send(self_->state.bal.prefill, done_atom_v, self_->state.req.id); }
void actor_host::release_decode() { self_->send(self_->state.bal.decode, done_atom_v, self_->state.req.id); }

void actor_host::retry_after(double seconds) {
  self_->delayed_send(self_, std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(seconds)),
                      route_atom_v);
}

void actor_host::route_decode(uint64_t placement, std::span<const engine_id> refused) {
  auto& st = self_->state;
  const handoff_offer& o = *st.offer;
  const auto context = static_cast<int64_t>(o.tokens.size());
  const int64_t left = std::max<int64_t>(0, o.sampling.max_tokens - (context - o.prompt_len));
  self_->request(st.bal.decode, st.options.handoff_timeout, route_atom_v, decode_atom_v, st.req.id, o.blocks_needed,
                 context, left, actors(refused))
    .then(
      [self = self_, placement](caf::actor& d) {
        self->state.machine->decode_routed(placement, self->state.host->intern(d));
        settle(self);
      },
      [self = self_, placement](caf::error&) {
        self->state.machine->decode_route_failed(placement);
        settle(self);
      });
}

void actor_host::offer_to(engine_id d, uint64_t placement) {
  auto& st = self_->state;
  self_->request(caf::actor_cast<engine_actor>(at(d)), st.options.handoff_timeout, handoff_atom_v, *st.offer,
                 caf::actor_cast<token_sink_actor>(self_))
    .then(
      [self = self_, d, placement](request_id) {
        self->state.machine->decode_took(placement, d);
        settle(self);
      },
      [self = self_, d, placement](caf::error&) {
        self->state.machine->decode_refused(placement, d);
        settle(self);
      });
}

void actor_host::tell_placed(engine_id e, bool placed) {
  self_->send(caf::actor_cast<engine_actor>(at(e)), handoff_atom_v, self_->state.req.id, placed);
}

void actor_host::cancel_at(engine_id e) {
  caf::anon_send(caf::actor_cast<engine_actor>(at(e)), cancel_atom_v, self_->state.req.id);
}

void actor_host::fail(const runtime::relay_error& err) {
  self_->state.channel->push({-1, true, runtime::finish_reason::error, to_reply(err), 0});
}

std::optional<engine_id> sender_engine(relay_pointer self) {
  const auto sender = caf::actor_cast<caf::actor>(self->current_sender());
  if (!sender) return std::nullopt;
  return self->state.host->find(sender.address());
}

void on_offer(relay_pointer self, const handoff_offer& offer) {
  auto& st = self->state;
  const auto from = sender_engine(self);
  const auto generated = static_cast<int64_t>(offer.tokens.size()) - offer.prompt_len;
  std::optional<handoff_offer> previous = std::exchange(st.offer, offer);  // the machine places it
  if (offer.id == st.req.id && from && st.machine->offered(*from, generated)) return;
  st.offer = std::move(previous);  // a stale attempt's: nobody reads it
  if (offer.prefill) caf::anon_send(caf::actor_cast<engine_actor>(offer.prefill), cancel_atom_v, offer.id);
}

void on_token(relay_pointer self, const token_event& ev) {
  auto& st = self->state;
  const auto from = sender_engine(self);
  if (!from) return;
  const bool failed = ev.finished && ev.reason == runtime::finish_reason::error;
  const runtime::relay_verdict v = st.machine->token(*from, ev.token >= 0, ev.finished, failed);
  if (v.forward) {
    st.sent.push_back(ev.token);
    st.channel->push({ev.token, false, runtime::finish_reason::none, std::nullopt, 0, ev.logprobs});
  }
  if (v.final) st.channel->push({-1, true, ev.reason, std::nullopt, ev.cached_tokens});
}

caf::behavior relay_behavior(caf::stateful_actor<relay_state>* self, balancers bal,
                             generation_request req, std::shared_ptr<stream_channel> channel,
                             relay_options options) {
  auto& st = self->state;
  st.bal = std::move(bal);
  st.req = std::move(req);
  st.channel = std::move(channel);
  st.options = options;
  st.host = std::make_unique<actor_host>(self);
  const runtime::relay_limits limits{options.max_attempts, std::chrono::duration<double>(options.retry_backoff).count(),
                                     std::chrono::duration<double>(options.wait_for_engine).count(),
                                     options.handoff_attempts};
  st.machine = std::make_unique<runtime::relay>(limits, *st.host);
  self->set_down_handler([self](caf::down_msg& msg) {
    if (auto e = self->state.host->find(msg.source)) self->state.machine->engine_down(*e);
    settle(self);
  });
  self->delayed_send(self, options.request_timeout, kill_atom_v);
  st.machine->start(!st.req.images.empty() && st.bal.ve);
  settle(self);
  return {
    [self](const token_event& ev) { on_token(self, ev), settle(self); },
    [self](handoff_atom, const handoff_offer& offer) { on_offer(self, offer), settle(self); },
    [self](route_atom) { self->state.machine->retry_due(), settle(self); },
    [self](cancel_atom) { self->state.machine->cancel(), settle(self); },
    [self](kill_atom) {
      self->state.machine->timed_out("no answer within the request timeout of " +
                                     std::to_string(self->state.options.request_timeout.count()) + " ms");
      settle(self);
    },
  };
}

}  // namespace

caf::actor spawn_request_relay(caf::actor_system& sys, balancers bal, generation_request req,
                               std::shared_ptr<stream_channel> channel, relay_options options) {
  return sys.spawn(relay_behavior, std::move(bal), std::move(req), std::move(channel), options);
}

}  // namespace shoal::actors
