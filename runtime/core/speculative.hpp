// DSpark speculative decoding: the policy that chooses how many MTP drafts each request
// verifies in a step, the acceptance rules (greedy and lossless rejection sampling), the
// per-depth acceptance estimates that stand in for a missing confidence head, a synthetic
// acceptance model for benchmarks, and the step accounting of MEASURE.md. Plain state; the
// engine drafts (model::mtp_chain), verifies and rolls back.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/core/cost_model.hpp"
#include "runtime/core/sampler.hpp"
#include "runtime/core/stats.hpp"

namespace shoal::runtime {

// off: no drafts. fixed: every request verifies all its drafts (VARLEN off: the same count
// whatever the batch, as the deterministic mode needs). adaptive: the batch verifies the
// drafts of highest expected yield that maximise expected tokens per second of step time.
// automatic: every draft verified or none, per concurrency the choice that measured more tokens
// per second of step on this engine (auto_verify below; auto_from is the prior before both
// were measured); no drafting while it verifies none.
enum class spec_mode { off, fixed, adaptive, automatic };
const char* to_string(spec_mode m);
std::optional<spec_mode> spec_mode_from(std::string_view s);

// Synthetic acceptance (benchmarks and policy tests; the output is then NOT the target
// model's): draft j of a step gets a conditional acceptance probability drawn from a
// two-point mixture — likely (uniform in [0.85, 1)) with the probability that makes its mean
// `mean[j]`, else unlikely (uniform in [0, 0.3)) — reported as its confidence and then
// accepted with that probability. Draws are counter-based on (seed, step, depth).
struct synthetic_acceptance {
  std::vector<double> mean;  // conditional acceptance per depth, each in [0.15, 0.925]
  float confidence(uint64_t seed, int64_t step, int64_t depth) const;
  bool accepted(uint64_t seed, int64_t step, int64_t depth, float confidence) const;
};
// MISSION.md's production figure: fixed-5 accepts 3.29 drafts per step on average.
synthetic_acceptance production_acceptance();

struct spec_config {
  spec_mode mode = spec_mode::off;
  int64_t nextn = 5;           // drafts per step: chained MTP depths (the last module reused
                               // past the checkpoint's modules), 1 … 8
  int64_t fixed_k = 0;         // fixed mode: verify the first min(fixed_k, nextn) drafts (0 = all)
  int64_t draft_context = 0;   // deepseek_v3: the MTP entries each depth attends over (0: 64);
                               // shoal_flash's MTP layers use the model's sliding window
  // adaptive: below this many decoding requests in the step every draft is verified (the
  // selection costs more than it saves there; measured with `shoal bench spec`).
  int64_t adaptive_from = 16;
  // automatic: before a concurrency has measured both choices, drafts are verified from this
  // many decoding requests in a step on.
  int64_t auto_from = 16;
  std::optional<cost_model> cost;  // step time t(tokens, mean context); adaptive needs it
  std::optional<synthetic_acceptance> synthetic;
  // Test and calibration drafts in place of the MTP modules: the target model itself over
  // the whole sequence (acceptance 1 at temperature 0), mixed with the uniform distribution
  // over the vocabulary with weight self_draft_noise (acceptance 1 − noise × TV(p, uniform));
  // the confidence reported is 1 − noise. Costs a full forward pass per draft.
  bool self_draft = false;
  double self_draft_noise = 0.0;  // in [0, 1]
};
// Nothing (valid) or what is wrong, naming the field.
std::optional<std::string> validate(const spec_config& c, int64_t model_max_backtrack);

// One request's drafts as the policy sees them.
struct spec_candidate {
  std::vector<float> confidence;  // conditional acceptance of each draft, in [0, 1]
  int64_t context = 0;            // positions already in its cache
};
// Expected drafts accepted when verifying the first k: Σ_{i≤k} Π_{j≤i} p_j.
double expected_accepted(std::span<const float> p, int64_t k);
// The adaptive choice: drafts ordered by expected yield Π_{j≤i} p_j (ties: request, then
// depth), and the prefix of that order verified that maximises (decodes + Σ yields) /
// t(base_tokens + drafts, mean context), with `base_tokens` the step's tokens without drafts
// (one per decode plus prefill chunks). Returns the verify length of each candidate.
std::vector<int64_t> choose_verify_lengths(std::span<const spec_candidate> c, const cost_model& cost,
                                           int64_t base_tokens);

// Per-depth acceptance seen so far (accepted / verified at that depth, given all earlier
// drafts were accepted): the policy's confidence when the model has no confidence head.
class acceptance_estimate {
 public:
  void record(int64_t verified, int64_t accepted);  // one request's verification
  float at(int64_t depth) const;                    // prior 0.5 until seen
 private:
  std::vector<uint64_t> verified_, accepted_;
};

// spec_mode::automatic's choice: verification per concurrency (decoding requests, in
// power-of-two buckets) between two measured rates, tokens emitted per second of step with
// every draft verified (drafting included) and with none. Before a bucket has measured both
// (3 steps each, the prior's first: verify from `prior_from` decodes on), the prior decides;
// then the better one. The machine's load and the acceptance drift, so the other is tried
// again: a trial of 2 steps (the switch, which is not measured because it pays for drafting
// without verifying or the other way round, then one measured step, weighted 0.5 against 0.2
// for an ordinary one), 256 steps after the last trial, the interval doubling up to 8,192 each
// time a trial leaves the choice as it was and back to 256 when it changes it.
class auto_verify {
 public:
  explicit auto_verify(int64_t prior_from) : prior_from_(prior_from) {}
  // Whether the next step, with `decodes` > 0 decoding requests, verifies.
  bool choose(int64_t decodes);
  // A completed step: its decodes, whether it verified, whether it decoded only (no prefill
  // chunk), and its tokens emitted per second. Measured when it decoded only and made the same
  // choice as the step before it.
  void measure(int64_t decodes, bool verified, bool decode_only, double rate);
  double rate(int64_t decodes, bool verified) const;  // 0 until measured

 private:
  struct bucket {  // decoding requests in [2^b, 2^(b+1))
    double rate[2] = {0, 0};  // [0] without, [1] with verification
    int64_t seen[2] = {0, 0};
    int64_t steps = 0;
    int64_t retry_at = 256, interval = 256, trial_left = 0;
    int trial = -1;         // the choice on trial (0 / 1), -1: none
    bool trial_of = false;  // the better choice when the trial began
  };
  static size_t index(int64_t decodes);  // its bucket: floor(log2(decodes)), 0 for none
  bucket& of(int64_t decodes);
  int64_t prior_from_;
  std::vector<bucket> buckets_;
  bool last_ = false;  // the previous measured step's choice
};

// Rejection sampling (Leviathan et al.; Chen et al.): draft token x drawn from q is accepted
// with probability min(1, p(x) / q(x)) (u uniform in [0, 1)); on rejection the token is drawn
// from the residual max(0, p − q), normalised. The output distribution is p's.
bool accept_draft(const token_distribution& p, const token_distribution& q, int32_t x, double u);
token_distribution residual(const token_distribution& p, const token_distribution& q);

// Counter-based draws of speculation, apart from the sampler's stream: the draft's and the
// acceptance test's uniform numbers for output index `step`.
double draft_uniform(uint64_t seq_seed, int64_t step);
double accept_uniform(uint64_t seq_seed, int64_t step);

}  // namespace shoal::runtime
