// Token sampling and stop conditions for one sequence step. Sampling is a pure function of
// (logits, params, seq_seed, step): the random number comes from a counter-based hash, never
// from shared RNG state, so a sequence draws the same token whatever batch it runs in and a
// replay with the same seed reproduces it. The stop checker decides when a sequence finishes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/base/finish_reason.hpp"
#include "runtime/structured/constraint.hpp"

namespace shoal::runtime {

struct sampling_params {
  float temperature = 0.0f;  // 0 = greedy
  int32_t top_k = 0;         // 0 = off; ≥ vocab is also off
  float top_p = 1.0f;        // in (0, 1]; 1 = off
  int32_t max_tokens = 16;   // generated tokens, ≥ 1
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop_strings;
  bool ignore_eos = false;
  std::optional<uint64_t> seed;  // the caller's seq_seed when set (see sequence_seed)
  // OpenAI's logit adjustments, applied to the logits before any other step: + bias of each
  // listed token (ids distinct, bias in [−100, 100]); − frequency_penalty × (times the token
  // was generated so far) − presence_penalty × (1 if it was), both in [−2, 2].
  std::vector<std::pair<int32_t, float>> logit_bias;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // Structured output: the output must match this (the engine compiles it and masks the
  // logits each step; eos only where the match can end, and a whole match that nothing can
  // extend finishes the request as stop).
  constraint_spec constraint;
  // −1: off; n ≥ 0: each sampled token's log probability and the n likeliest tokens' (n ≤ 20),
  // from the model's distribution (the log-softmax of the raw logits, before any adjustment,
  // temperature or mask).
  int32_t logprobs = -1;
  bool adjusts_logits() const { return !logit_bias.empty() || presence_penalty != 0 || frequency_penalty != 0; }
  friend bool operator==(const sampling_params&, const sampling_params&) = default;
};

// Bad request parameters are operating errors: returns a message naming the first bad field
// ("top_p must be in (0, 1], got 0"), or nullopt when the params are usable with `vocab`.
std::optional<std::string> validate(const sampling_params& p, int64_t vocab);

// The seed a sequence samples with: params.seed when given, else `fallback` (e.g. a value
// drawn once per request), so seeded requests replay exactly.
uint64_t sequence_seed(const sampling_params& p, uint64_t fallback);

// The uniform number in [0, 1) for (seq_seed, step): splitmix64-style finalisers over the
// pair, top 53 bits as a double. Exposed so tests can reason about a draw.
double uniform_at(uint64_t seq_seed, int64_t step);

// Draws one token id from logits (vocab). Greedy (temperature 0): argmax, ties to the lower
// id. Otherwise, in this order: top-k keeps the k largest logits (ties to the lower id);
// softmax of (logit − max)/temperature, summed in a fixed order; top-p keeps the smallest
// prefix of the (prob desc, id asc) order whose mass ≥ top_p; renormalise; inverse CDF at
// uniform_at(seq_seed, step). NaN logits count as −inf; at least one logit must be finite.
// Before all of it, the logit adjustments of `p` (sampling_params::logit_bias, penalties
// over `generated`, the tokens the sequence generated so far). `p` must pass validate().
// Thread-safe (no shared state).
int32_t sample_token(std::span<const float> logits, const sampling_params& p, uint64_t seq_seed,
                     int64_t step, std::span<const int32_t> generated = {});

// The distribution sample_token draws from at temperature > 0, after the logit adjustments,
// top-k, temperature and top-p: token ids with unnormalised weights, in draw order (see
// sample_token). Speculative sampling compares a target's and a draft's.
struct token_distribution {
  std::vector<int32_t> ids;
  std::vector<float> weights;
  double total = 0;  // Σ weights, summed in order
  double prob(int32_t id) const;  // normalised; 0 outside the support
};
token_distribution distribution_of(std::span<const float> logits, const sampling_params& p,
                                   std::span<const int32_t> generated = {});
// Inverse CDF over the distribution's order at u in [0, 1) (sample_token's draw).
int32_t draw_from(const token_distribution& d, double u);
// The logits after sampling_params' adjustments (bias, penalties over `generated`); `logits`
// itself when the params adjust nothing (then `scratch` is untouched).
std::span<const float> adjusted_logits(std::span<const float> logits, const sampling_params& p,
                                       std::span<const int32_t> generated, std::vector<float>& scratch);

// The log-softmax of `logits` at `token`, and the n likeliest tokens with theirs (most likely
// first, ties to the lower id). NaN logits count as −inf.
struct token_logprobs {
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
  friend bool operator==(const token_logprobs&, const token_logprobs&) = default;
};
token_logprobs logprobs_of(std::span<const float> logits, int32_t token, int32_t n);


struct stop_result {
  finish_reason reason = finish_reason::none;
  // Set when a stop string matched: the byte offset in the text where the earliest match
  // starts; the visible output is text[0, truncate_at).
  std::optional<size_t> truncate_at;
};

// Decides after each generated token whether the sequence is done. Stateless between calls:
// it looks at the last token and the whole text, so a detokeniser may revise trailing text.
// Precedence: eos (unless ignore_eos) / stop id on the last token, then stop strings, then
// length (output_ids.size() ≥ max_tokens).
class stop_checker {
 public:
  stop_checker(const sampling_params& p, int32_t eos_id);

  // output_ids: every generated token so far (prompt excluded); output_text_so_far: their
  // detokenised text. search_from: stop strings are looked for from this byte on (a caller
  // that only appends text passes where the newest piece could start a match).
  stop_result check(std::span<const int32_t> output_ids, std::string_view output_text_so_far,
                    size_t search_from = 0) const;
  stop_result check(const std::vector<int32_t>& output_ids, std::string_view output_text_so_far,
                    size_t search_from = 0) const {
    return check(std::span<const int32_t>(output_ids), output_text_so_far, search_from);
  }
  // Longest stop string, in bytes.
  size_t longest_stop() const { return longest_stop_; }
  // Whether `token` ends a sequence (eos unless ignore_eos, stop_token_ids).
  bool is_stop_token(int32_t token) const { return std::binary_search(stop_ids_.begin(), stop_ids_.end(), token); }

 private:
  std::vector<int32_t> stop_ids_;  // sorted, eos included unless ignore_eos
  std::vector<std::string> stop_strings_;
  size_t longest_stop_ = 0;
  int32_t max_tokens_;
};

}  // namespace shoal::runtime
