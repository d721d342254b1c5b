// The relay protocol of one request, as a plain state machine: route → submit → forward
// tokens; when its engine fails (down, draining, a failed step) exclude it, back off and
// submit again elsewhere with the tokens the client already has (the new engine prefills the
// prompt and them, and samples on from there with the same seed, so the client sees one
// stream whose recovery does not grow with its length); with
// disaggregation, place the prefill engine's handoff offer on a decode engine (asking the
// decode balancer, at most `handoff_attempts` engines), and keep it on the prefill engine when
// none takes it.
//
// The machine does no I/O. It asks its host (`relay_host`) to send messages and start
// timers, and the host feeds the answers back as calls. The gateway's relay actor
// (actors/request_relay.cpp) hosts it over CAF; the simulator (sim/) hosts the same machine in
// virtual time, so the fault campaign runs this code. A host must not call into the machine
// from inside one of its own `relay_host` calls: answers arrive later, as messages do.
//
// Engines are `engine_id`s minted by the host (the actor: an index into its table of actors;
// the simulator: a rank and its incarnation). Answers carry the engine (or the placement
// number) they answer for, so a late answer to an earlier attempt is recognised and dropped.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/base/ids.hpp"

namespace shoal::runtime {

// Why the relay gives up or retries. `host` errors come from the host's own messages and
// carry its code back unchanged; the others the machine raises itself.
enum class relay_failure : uint8_t {
  host,         // host_code says what (the engine's or a balancer's answer)
  timed_out,    // the request's time ran out
  engine_down,  // its engine went down (or was cut off)
  step_failed,  // its engine failed a step of this request
};

struct relay_error {
  relay_failure kind = relay_failure::host;
  int host_code = 0;
  bool request_fault = false;  // the request itself is wrong: never retried elsewhere
  std::string message;
};

struct relay_limits {
  int max_attempts = 4;               // engines tried before giving up
  double retry_backoff_s = 0.2;       // × attempt number, before re-routing
  double wait_for_engine_s = 10;      // while no engine is up: retried this long, then an error
  int handoff_attempts = 3;           // decode engines asked per handoff
};

// Test-only switches that break the protocol on purpose; the simulator's fault campaign must
// catch each (tests/sim). Never set outside tests.
enum class relay_bug : uint8_t {
  none,
  repeat_tokens,   // after a re-route, tokens the client has are sent again (resubmitted
                   // without them, and the new engine's tokens taken as following them)
  keep_dead,       // an engine that went down is not excluded from the next route
};

class relay_host {
 public:
  virtual ~relay_host() = default;
  // Ask the VE pool to encode the request's images; answer: images_encoded.
  virtual void encode_images() = 0;
  // Ask the prefill balancer for an engine other than `exclude`; answer: routed or
  // route_failed.
  virtual void route(std::span<const engine_id> exclude) = 0;
  // Submit the request to `e` with the first `resume` output tokens the client has (0 on the
  // first attempt; the engine continues after them) and watch it (a down notice:
  // engine_down); answer only on refusal: submit_failed.
  virtual void submit(engine_id e, int64_t resume) = 0;
  virtual void watch(engine_id e) = 0;
  virtual void unwatch(engine_id e) = 0;
  // The request left its engine: the prefill (decode) balancer ends its placement of it.
  virtual void release_prefill() = 0;
  virtual void release_decode() = 0;
  // Call retry_due after `seconds`.
  virtual void retry_after(double seconds) = 0;
  // Ask the decode balancer for a decode engine for the pending offer, other than `refused`;
  // answer: decode_routed or decode_route_failed, with `placement`.
  virtual void route_decode(uint64_t placement, std::span<const engine_id> refused) = 0;
  // Hand the pending offer to decode engine `d`; answer: decode_took or decode_refused.
  virtual void offer_to(engine_id d, uint64_t placement) = 0;
  // Tell prefill engine `e` whether its offer was placed (false: it decodes the request).
  virtual void tell_placed(engine_id e, bool placed) = 0;
  virtual void cancel_at(engine_id e) = 0;
  // The final error item to the client (the machine is done after it).
  virtual void fail(const relay_error& err) = 0;
};

// What to do with one token event (see relay::token).
struct relay_verdict {
  bool forward = false;  // pass the token to the client (the next one it lacks)
  bool final = false;    // the request finished: push the final item (the machine is done)
};

class relay {
 public:
  relay(relay_limits limits, relay_host& host, relay_bug bug = relay_bug::none)
      : limits_(limits), host_(host), bug_(bug) {}

  // Start: images first when the host has a VE pool for them.
  void start(bool encode_images);
  void images_encoded(const relay_error* err);  // null: encoded (or the pool failed benignly)

  void routed(engine_id e);
  // The prefill balancer found no engine: `none_up` = no engine is up at all (wait for one,
  // up to wait_for_engine_s), else every engine failed this request already (give up).
  void route_failed(relay_error err, bool none_up);
  void submit_failed(engine_id e, relay_error err, bool exclude_engine);
  void engine_down(engine_id e);
  // A token event from `from` (has_token: it carries a token; finished: the last event;
  // failed: it finished with an error, which re-routes).
  relay_verdict token(engine_id from, bool has_token, bool finished, bool failed);
  // The prefill engine `from` offers a handoff after `generated` output tokens; false: the
  // offer is stale (the host cancels it at the engine that made it).
  bool offered(engine_id from, int64_t generated);
  void decode_routed(uint64_t placement, engine_id d);
  void decode_route_failed(uint64_t placement);
  void decode_took(uint64_t placement, engine_id d);
  void decode_refused(uint64_t placement, engine_id d);
  void retry_due();
  void cancel();
  void timed_out(std::string message);

  bool done() const { return done_; }
  bool placing() const { return offer_pending_; }
  engine_id engine() const { return engine_; }
  int64_t forwarded() const { return forwarded_; }

 private:
  void attempt();
  void retry(relay_error err, bool exclude_engine);
  void give_up(const relay_error& err);
  void finish();
  void release();
  void place();
  void keep_on_prefill();

  relay_limits limits_;
  relay_host& host_;
  relay_bug bug_;
  std::vector<engine_id> exclude_;  // engines that went down under this request
  engine_id engine_;                // the current attempt's engine (invalid: none)
  int attempt_ = 0;
  int64_t forwarded_ = 0;           // tokens the client has
  int64_t received_ = 0;            // output tokens up to the current engine's last (those it resumed after included)
  double waited_s_ = 0;             // spent waiting for any engine to be up
  // A handoff being placed: the decode engines that refused it, and a number that makes
  // answers to an older placement stale.
  bool offer_pending_ = false;
  int64_t offer_generated_ = 0;     // output tokens the offer carries
  std::vector<engine_id> refused_;
  uint64_t placement_ = 0;
  bool done_ = false;
};

}  // namespace shoal::runtime
