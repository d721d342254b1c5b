// One request of the gateway in flight: a relay actor, host of runtime::relay (the protocol,
// runtime/core/relay.hpp, which the simulator runs too), that asks the prefill balancer for an engine,
// submits, forwards the token events into a stream_channel the HTTP connection thread reads,
// and re-routes the request when its engine fails (down, draining, a failed expert-parallel
// step): the new engine gets the tokens the client already has with the request, prefills
// them after the prompt and samples on with the same seed, so the client sees one
// uninterrupted stream.
//
// A request with images goes to the VE balancer first (when the gateway has one): the
// rows' ranges it answers ride in the request's images, and the prefill engine reads them.
//
// With disaggregation the relay also places the request: a prefill engine offers it after
// the first token (handoff_offer), the relay asks the decode balancer for a decode engine and hands
// it the offer; the one that takes it becomes the request's engine (monitored, re-routed
// from on failure), and the prefill engine is told. When every decode engine refuses (no
// room) or none is up, the prefill engine decodes the request itself.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "actors/interfaces.hpp"

namespace shoal::actors {

// What the relay hands the connection thread: tokens, then one final item.
struct stream_item {
  int32_t token = -1;                    // -1 on the final item
  bool finished = false;
  runtime::finish_reason reason = runtime::finish_reason::none;
  std::optional<error_reply> error;      // set when the request failed for good
  int32_t cached_tokens = 0;             // final item: prompt tokens from the prefix cache
  std::optional<runtime::token_logprobs> logprobs = std::nullopt;  // when the request asked for them
};

// A bounded-by-construction queue between one relay actor (producer) and one connection
// thread (consumer; at most max_tokens + 1 items ever). cancel() is the consumer's way to
// say the client left.
class stream_channel {
 public:
  void push(stream_item item);
  // The next item, or nullopt when `deadline` passed first.
  std::optional<stream_item> pop(std::chrono::steady_clock::time_point deadline);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<stream_item> items_;
};

struct relay_options {
  int max_attempts = 4;                          // engines tried before giving up
  std::chrono::milliseconds request_timeout{60'000};  // whole request, all attempts
  std::chrono::milliseconds retry_backoff{200};  // × attempt number, before re-routing
  std::chrono::milliseconds wait_for_engine{5'000};  // while no engine is up: retried this long
  int handoff_attempts = 3;                       // decode engines asked per handoff
  std::chrono::milliseconds handoff_timeout{5'000};  // one decode engine's answer
};

// Spawns the relay of `req` (its sampling must carry a seed: re-routing relies on it).
// Cancel it by sending cancel_atom (it then cancels at the engine and quits).
caf::actor spawn_request_relay(caf::actor_system& sys, balancers bal, generation_request req,
                               std::shared_ptr<stream_channel> channel, relay_options options);

}  // namespace shoal::actors
