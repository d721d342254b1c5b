// Sampling pipeline (greedy, temperature, top-k, top-p, inverse CDF), parameter validation
// and the stop checker. Every ordering is total — (value desc, id asc) — and every sum runs
// in a fixed order, so the drawn token depends only on the inputs, never on the batch.
#include "runtime/core/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>

#include "kernels/assert.hpp"

namespace shoal::runtime {

namespace {

constexpr float neg_inf = -std::numeric_limits<float>::infinity();

// splitmix64's output function: a bijective 64-bit mixer with full avalanche.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// NaN logits rank below everything so that every comparison below is a strict weak order.
float rank_value(float logit) { return std::isnan(logit) ? neg_inf : logit; }

struct candidate {
  int32_t id;
  float value;  // a logit, later an unnormalised probability
};

// (value desc, id asc): the one total order used for top-k, top-p and greedy ties. A
// function object rather than a function pointer so that the sorts inline it.
struct ranks_before_t {
  bool operator()(const candidate& a, const candidate& b) const {
    return a.value > b.value || (a.value == b.value && a.id < b.id);
  }
};
constexpr ranks_before_t ranks_before;

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  float best_value = rank_value(logits[0]);
  for (size_t i = 1; i < logits.size(); ++i) {
    // Strict: an equal later value never displaces the lower id; NaN compares false.
    if (logits[i] > best_value) {
      best = int32_t(i);
      best_value = logits[i];
    }
  }
  return best;
}

// Moves the k best ranked candidates to the front, sorted; the rest follow in any order.
void sort_best(std::vector<candidate>& c, size_t k) {
  auto kth = c.begin() + std::ptrdiff_t(std::min(k, c.size()));
  if (kth != c.end()) std::nth_element(c.begin(), kth, c.end(), ranks_before);  // O(vocab)
  std::sort(c.begin(), kth, ranks_before);
}

// All tokens in id order, or the k best ranked (sorted) when 0 < k < vocab.
std::vector<candidate> gather_candidates(std::span<const float> logits, int32_t top_k) {
  std::vector<candidate> c(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) c[i] = {int32_t(i), rank_value(logits[i])};
  if (top_k > 0 && size_t(top_k) < c.size()) {
    sort_best(c, size_t(top_k));
    c.resize(size_t(top_k));
  }
  return c;
}

// Replaces each logit by exp((logit − max) / temperature) (so the max gets exactly 1) and
// drops tokens whose weight underflows to 0: they are outside the support. Order is kept.
void to_weights(std::vector<candidate>& c, float temperature) {
  float max_value = neg_inf;
  for (const auto& x : c) max_value = std::max(max_value, x.value);
  SHOAL_ASSERT(max_value > neg_inf);  // at least one logit that is a number above −inf
  if (std::isinf(max_value)) {        // +inf logits share all the mass
    for (auto& x : c) x.value = x.value == max_value ? 1.0f : 0.0f;
  } else {
    for (auto& x : c) x.value = std::exp((x.value - max_value) / temperature);
  }
  std::erase_if(c, [](const candidate& x) { return !(x.value > 0.0f); });
}

double total_weight(const std::vector<candidate>& c) {
  double sum = 0;
  for (const auto& x : c) sum += x.value;  // fixed order: the vector's order
  return sum;
}

// Nucleus: keeps the smallest prefix of the (prob desc, id asc) order whose mass ≥ top_p,
// sorted in that order. The mass is counted on a sorted head of growing size, which gives
// the same prefix as sorting everything: the head IS the start of the full order.
void apply_top_p(std::vector<candidate>& c, float top_p) {
  double threshold = double(top_p) * total_weight(c);  // summed in the incoming order
  for (size_t head = 256;; head *= 4) {
    sort_best(c, head);
    size_t n = std::min(head, c.size());
    double mass = 0;
    for (size_t i = 0; i < n; ++i) {
      mass += c[i].value;
      if (mass >= threshold) {
        c.resize(i + 1);
        return;
      }
    }
    if (n == c.size()) return;  // rounding kept the sum just below the threshold: keep all
  }
}

std::string format_float(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", double(v));
  return buf;
}

}  // namespace

std::optional<std::string> validate(const sampling_params& p, int64_t vocab) {
  if (vocab <= 0) return "vocab must be > 0, got " + std::to_string(vocab);
  if (!std::isfinite(p.temperature) || p.temperature < 0)
    return "temperature must be a finite number >= 0, got " + format_float(p.temperature);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f))  // written so that NaN fails
    return "top_p must be in (0, 1], got " + format_float(p.top_p);
  if (p.top_k < 0) return "top_k must be >= 0 (0 = off), got " + std::to_string(p.top_k);
  if (p.max_tokens < 1) return "max_tokens must be >= 1, got " + std::to_string(p.max_tokens);
  for (size_t i = 0; i < p.stop_token_ids.size(); ++i) {
    int32_t id = p.stop_token_ids[i];
    if (id < 0 || id >= vocab)
      return "stop_token_ids[" + std::to_string(i) + "] = " + std::to_string(id) +
             " is outside the vocabulary [0, " + std::to_string(vocab) + ")";
  }
  for (size_t i = 0; i < p.stop_strings.size(); ++i)
    if (p.stop_strings[i].empty()) return "stop_strings[" + std::to_string(i) + "] is empty";
  for (size_t i = 0; i < p.logit_bias.size(); ++i) {
    const auto [id, bias] = p.logit_bias[i];
    if (id < 0 || id >= vocab)
      return "logit_bias token " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")";
    if (!(bias >= -100.0f && bias <= 100.0f))
      return "logit_bias of token " + std::to_string(id) + " must be in [-100, 100], got " + format_float(bias);
    for (size_t k = 0; k < i; ++k)
      if (p.logit_bias[k].first == id) return "logit_bias names token " + std::to_string(id) + " twice";
  }
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f))
    return "presence_penalty must be in [-2, 2], got " + format_float(p.presence_penalty);
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f))
    return "frequency_penalty must be in [-2, 2], got " + format_float(p.frequency_penalty);
  if (p.logprobs < -1 || p.logprobs > 20) return "logprobs must be -1 (off) or in [0, 20], got " + std::to_string(p.logprobs);
  return std::nullopt;
}

token_logprobs logprobs_of(std::span<const float> logits, int32_t token, int32_t n) {
  auto value = [&](size_t i) { return std::isnan(logits[i]) ? -std::numeric_limits<float>::infinity() : logits[i]; };
  float mx = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) mx = std::max(mx, value(i));
  double sum = 0;  // fixed order: the same figure in any batch
  for (size_t i = 0; i < logits.size(); ++i) sum += std::exp(static_cast<double>(value(i)) - mx);
  const double log_z = static_cast<double>(mx) + std::log(sum);
  token_logprobs out;
  if (token >= 0 && static_cast<size_t>(token) < logits.size())
    out.logprob = static_cast<float>(static_cast<double>(value(static_cast<size_t>(token))) - log_z);
  const size_t k = std::min(static_cast<size_t>(std::max(n, 0)), logits.size());
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  auto better = [&](int32_t a, int32_t b) {
    const float x = value(static_cast<size_t>(a)), y = value(static_cast<size_t>(b));
    return x > y || (x == y && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), better);
  for (size_t i = 0; i < k; ++i)
    out.top.emplace_back(ids[i], static_cast<float>(static_cast<double>(value(static_cast<size_t>(ids[i]))) - log_z));
  return out;
}

uint64_t sequence_seed(const sampling_params& p, uint64_t fallback) { return p.seed.value_or(fallback); }

double uniform_at(uint64_t seq_seed, int64_t step) {
  // Hash the seed first so that nearby seeds give unrelated streams, then mix in the step.
  uint64_t h = mix64(mix64(seq_seed + 0x9e3779b97f4a7c15ULL) ^ (uint64_t(step) * 0xd1b54a32d192ed03ULL));
  return double(h >> 11) * 0x1.0p-53;
}

std::span<const float> adjusted_logits(std::span<const float> logits, const sampling_params& p,
                                       std::span<const int32_t> generated, std::vector<float>& adjusted) {
  if (!p.adjusts_logits()) return logits;
  adjusted.assign(logits.begin(), logits.end());
  for (const auto& [id, bias] : p.logit_bias) adjusted[static_cast<size_t>(id)] += bias;
  if (p.presence_penalty != 0 || p.frequency_penalty != 0) {
    std::vector<int32_t> seen(generated.begin(), generated.end());
    std::sort(seen.begin(), seen.end());
    for (size_t i = 0; i < seen.size();) {
      size_t j = i;
      while (j < seen.size() && seen[j] == seen[i]) ++j;
      if (seen[i] >= 0 && static_cast<size_t>(seen[i]) < adjusted.size())
        adjusted[static_cast<size_t>(seen[i])] -= p.frequency_penalty * static_cast<float>(j - i) + p.presence_penalty;
      i = j;
    }
  }
  return adjusted;
}

double token_distribution::prob(int32_t id) const {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == id) return total > 0 ? weights[i] / total : 0.0;
  return 0.0;
}

token_distribution distribution_of(std::span<const float> logits, const sampling_params& p,
                                   std::span<const int32_t> generated) {
  SHOAL_ASSERT(!logits.empty() && p.temperature > 0 && p.top_p > 0 && p.top_p <= 1 && p.top_k >= 0);
  std::vector<float> scratch;
  std::vector<candidate> c = gather_candidates(adjusted_logits(logits, p, generated, scratch), p.top_k);
  to_weights(c, p.temperature);
  if (p.top_p < 1.0f) apply_top_p(c, p.top_p);
  token_distribution d;
  d.ids.reserve(c.size());
  d.weights.reserve(c.size());
  for (const auto& x : c) {
    d.ids.push_back(x.id);
    d.weights.push_back(x.value);
  }
  d.total = total_weight(c);
  return d;
}

int32_t draw_from(const token_distribution& d, double u) {
  SHOAL_ASSERT(!d.ids.empty());
  double target = u * d.total;
  double mass = 0;
  for (size_t i = 0; i < d.ids.size(); ++i) {
    mass += d.weights[i];
    if (mass > target) return d.ids[i];
  }
  return d.ids.back();  // unreachable unless rounding put target at the very top
}

int32_t sample_token(std::span<const float> logits, const sampling_params& p, uint64_t seq_seed,
                     int64_t step, std::span<const int32_t> generated) {
  SHOAL_ASSERT(!logits.empty());
  SHOAL_ASSERT(p.temperature >= 0 && p.top_p > 0 && p.top_p <= 1 && p.top_k >= 0);
  if (p.temperature == 0.0f) {
    std::vector<float> scratch;
    return argmax(adjusted_logits(logits, p, generated, scratch));
  }
  return draw_from(distribution_of(logits, p, generated), uniform_at(seq_seed, step));
}

stop_checker::stop_checker(const sampling_params& p, int32_t eos_id)
    : stop_ids_(p.stop_token_ids), stop_strings_(p.stop_strings), max_tokens_(p.max_tokens) {
  if (!p.ignore_eos) stop_ids_.push_back(eos_id);
  std::sort(stop_ids_.begin(), stop_ids_.end());
  for (const auto& s : stop_strings_) longest_stop_ = std::max(longest_stop_, s.size());
}

stop_result stop_checker::check(std::span<const int32_t> output_ids, std::string_view output_text_so_far,
                                size_t search_from) const {
  if (output_ids.empty()) return {};
  if (is_stop_token(output_ids.back()))
    return {finish_reason::stop, std::nullopt};
  // Whole-text search: a stop string may span tokens, and the earliest match wins.
  std::optional<size_t> earliest;
  for (const auto& s : stop_strings_) {
    size_t pos = output_text_so_far.find(s, search_from);
    if (pos != std::string_view::npos && (!earliest || pos < *earliest)) earliest = pos;
  }
  if (earliest) return {finish_reason::stop, earliest};
  if (output_ids.size() >= size_t(max_tokens_)) return {finish_reason::length, std::nullopt};
  return {};
}

}  // namespace shoal::runtime
