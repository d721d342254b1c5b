// The relay state machine (relay.hpp).
#include "runtime/core/relay.hpp"

#include <algorithm>

namespace shoal::runtime {

void relay::start(bool encode_images) {
  if (encode_images) host_.encode_images();
  else attempt();
}

// Without rows (the pool failed) the prefill engine encodes; a bad image fails the request.
void relay::images_encoded(const relay_error* err) {
  if (done_) return;
  if (err && err->request_fault) return give_up(*err);
  attempt();
}

void relay::attempt() {
  if (!done_) host_.route(exclude_);
}

void relay::routed(engine_id e) {
  if (done_) return;
  engine_ = e;
  received_ = forwarded_;  // the engine emits what follows the tokens the client has
  host_.submit(e, bug_ == relay_bug::repeat_tokens ? 0 : forwarded_);
}

void relay::route_failed(relay_error err, bool none_up) {
  if (done_) return;
  if (!none_up || waited_s_ >= limits_.wait_for_engine_s) return give_up(err);
  const double wait = std::max(0.01, limits_.retry_backoff_s);
  waited_s_ += wait;
  host_.retry_after(wait);
}

void relay::submit_failed(engine_id e, relay_error err, bool exclude_engine) {
  if (done_ || e != engine_) return;  // a stale attempt's
  retry(std::move(err), exclude_engine);
}

void relay::engine_down(engine_id e) {
  if (done_ || !engine_.valid() || e != engine_) return;
  retry({relay_failure::engine_down, 0, false, "its engine went down"}, true);
}

void relay::release() {
  host_.release_prefill();
  host_.release_decode();
}

void relay::finish() {
  if (engine_.valid()) release();
  engine_ = {};
  done_ = true;
}

void relay::give_up(const relay_error& err) {
  host_.fail(err);
  finish();
}

// Drops the current engine (excluded from now on when it is gone for good) and tries again
// after a backoff, unless the error is the request's own fault or attempts are used up.
void relay::retry(relay_error err, bool exclude_engine) {
  offer_pending_ = false;
  ++placement_;
  if (engine_.valid()) {
    host_.unwatch(engine_);
    release();
    if (exclude_engine && bug_ != relay_bug::keep_dead) exclude_.push_back(engine_);
    engine_ = {};
  }
  if (err.request_fault) return give_up(err);
  if (++attempt_ >= limits_.max_attempts) {
    err.message = "gave up after " + std::to_string(attempt_) + " attempt(s): " + err.message;
    return give_up(err);
  }
  host_.retry_after(limits_.retry_backoff_s * attempt_);
}

void relay::retry_due() { attempt(); }

relay_verdict relay::token(engine_id from, bool has_token, bool finished, bool failed) {
  if (done_ || !engine_.valid() || from != engine_) return {};
  if (finished && failed) {
    retry({relay_failure::step_failed, 0, false, "the engine failed a step of this request"}, false);
    return {};
  }
  relay_verdict v;
  if (has_token && ++received_ > forwarded_) {
    ++forwarded_;
    v.forward = true;
  }
  if (finished) {
    v.final = true;
    finish();
  }
  return v;
}

// -- handoff placement -------------------------------------------------------------------

bool relay::offered(engine_id from, int64_t generated) {
  if (done_ || !engine_.valid() || from != engine_) return false;
  offer_pending_ = true;
  offer_generated_ = generated;
  refused_.clear();
  ++placement_;
  place();
  return true;
}

void relay::place() { host_.route_decode(placement_, refused_); }

// Nobody takes the offer: the prefill engine decodes the request itself.
void relay::keep_on_prefill() {
  offer_pending_ = false;
  ++placement_;
  host_.tell_placed(engine_, false);
}

void relay::decode_routed(uint64_t placement, engine_id d) {
  if (done_ || placement != placement_ || !offer_pending_) {
    host_.release_decode();
    return;
  }
  host_.offer_to(d, placement);
}

void relay::decode_route_failed(uint64_t placement) {
  if (!done_ && placement == placement_ && offer_pending_) keep_on_prefill();
}

// `d` has the request from now on; the prefill engine's part is over.
void relay::decode_took(uint64_t placement, engine_id d) {
  if (done_ || placement != placement_ || !offer_pending_) {  // the request moved on meanwhile
    host_.cancel_at(d);
    host_.release_decode();
    return;
  }
  const engine_id prefill = engine_;
  host_.unwatch(prefill);
  host_.release_prefill();
  host_.tell_placed(prefill, true);
  engine_ = d;
  host_.watch(d);
  received_ = offer_generated_;  // the decode engine streams what follows
  offer_pending_ = false;
  ++placement_;
}

void relay::decode_refused(uint64_t placement, engine_id d) {
  host_.release_decode();
  if (done_ || placement != placement_ || !offer_pending_) return;
  refused_.push_back(d);
  if (static_cast<int>(refused_.size()) >= limits_.handoff_attempts) return keep_on_prefill();
  place();
}

void relay::cancel() {
  if (done_) return;
  if (engine_.valid()) host_.cancel_at(engine_);
  finish();
}

void relay::timed_out(std::string message) {
  if (!done_) give_up({relay_failure::timed_out, 0, false, std::move(message)});
}

}  // namespace shoal::runtime
