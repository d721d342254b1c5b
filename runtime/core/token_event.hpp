// What an engine reports per generated token.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/base/finish_reason.hpp"
#include "runtime/base/ids.hpp"
#include "runtime/core/sampler.hpp"

namespace shoal::runtime {

// One generated token of a request, in generation order; the last has finished = true (a
// cancelled request ends with token -1 and reason aborted). The same struct travels to the
// request's sink (actors/messages.hpp: its wire form leaves logits out).
struct token_event {
  request_id id;
  int32_t token = -1;
  bool finished = false;
  finish_reason reason = finish_reason::none;
  int32_t cached_tokens = 0;  // on the last event: prompt tokens served from the prefix cache
  std::vector<float> logits = {};  // with capture_logits (tests; never sent)
  // With sampling_params::logprobs ≥ 0: the token's log probability and the likeliest tokens'.
  std::optional<token_logprobs> logprobs = std::nullopt;
  friend bool operator==(const token_event&, const token_event&) = default;
};

}  // namespace shoal::runtime
