// DSpark policy, acceptance rules and accounting. See speculative.hpp.
#include "runtime/core/speculative.hpp"

#include <algorithm>
#include <bit>
#include <cmath>

#include "kernels/assert.hpp"

namespace shoal::runtime {

const char* to_string(spec_mode m) {
  switch (m) {
    case spec_mode::off: return "off";
    case spec_mode::fixed: return "fixed";
    case spec_mode::adaptive: return "adaptive";
    case spec_mode::automatic: return "auto";
  }
  return "off";
}

std::optional<spec_mode> spec_mode_from(std::string_view s) {
  if (s == "off") return spec_mode::off;
  if (s == "fixed") return spec_mode::fixed;
  if (s == "adaptive") return spec_mode::adaptive;
  if (s == "auto") return spec_mode::automatic;
  return std::nullopt;
}

namespace {
constexpr double likely_lo = 0.85, likely_hi = 1.0, unlikely_hi = 0.3;
constexpr double likely_mean = (likely_lo + likely_hi) / 2, unlikely_mean = unlikely_hi / 2;
// Separate counter-based streams: seeds offset by odd constants (uniform_at hashes the seed
// before mixing in the step, so the streams are unrelated).
constexpr uint64_t draft_stream = 0x6a09e667f3bcc909ULL, accept_stream = 0xbb67ae8584caa73bULL,
                   synth_mix = 0x3c6ef372fe94f82bULL, synth_pick = 0xa54ff53a5f1d36f1ULL,
                   synth_accept = 0x510e527fade682d1ULL;
}  // namespace

double draft_uniform(uint64_t seq_seed, int64_t step) { return uniform_at(seq_seed ^ draft_stream, step); }
double accept_uniform(uint64_t seq_seed, int64_t step) { return uniform_at(seq_seed ^ accept_stream, step); }

float synthetic_acceptance::confidence(uint64_t seed, int64_t step, int64_t depth) const {
  SHOAL_ASSERT(!mean.empty());
  const double m = mean[static_cast<size_t>(std::min<int64_t>(depth, static_cast<int64_t>(mean.size()) - 1))];
  const double likely = (m - unlikely_mean) / (likely_mean - unlikely_mean);
  const int64_t key = step * 64 + depth;
  const double v = uniform_at(seed ^ synth_mix, key);
  const double p = uniform_at(seed ^ synth_pick, key) < likely ? likely_lo + (likely_hi - likely_lo) * v
                                                                : unlikely_hi * v;
  return static_cast<float>(p);
}

bool synthetic_acceptance::accepted(uint64_t seed, int64_t step, int64_t depth, float confidence) const {
  return uniform_at(seed ^ synth_accept, step * 64 + depth) < confidence;
}

synthetic_acceptance production_acceptance() {
  // Σ_k Π_{j≤k} mean_j = 0.92 + 0.7912 + 0.6567 + 0.5254 + 0.4098 = 3.30 (MISSION.md: 3.29).
  return {{0.92, 0.86, 0.83, 0.80, 0.78}};
}

std::optional<std::string> validate(const spec_config& c, int64_t max_backtrack) {
  if (c.mode == spec_mode::off) return std::nullopt;
  if (c.nextn < 1 || c.nextn > 8) return "speculative.nextn must be in [1, 8], got " + std::to_string(c.nextn);
  if (c.nextn > max_backtrack)
    return "speculative.nextn " + std::to_string(c.nextn) + " exceeds the backtrack the sliding-window cache retains (" +
           std::to_string(max_backtrack) + " tokens: retained_tokens − sliding_window + 1)";
  if (c.fixed_k < 0 || c.fixed_k > c.nextn)
    return "speculative.fixed_k must be in [0, nextn] (0 = every draft), got " + std::to_string(c.fixed_k);
  if (c.draft_context < 0 || c.draft_context > 4096)
    return "speculative.draft_context must be in [0, 4096] (0 = default), got " + std::to_string(c.draft_context);
  if (c.adaptive_from < 0) return "speculative.adaptive_from must be >= 0, got " + std::to_string(c.adaptive_from);
  if (c.auto_from < 0) return "speculative.auto_from must be >= 0, got " + std::to_string(c.auto_from);
  if (c.mode == spec_mode::adaptive && !c.cost)
    return "speculative.mode adaptive needs a decode cost model (speculative.cost_model)";
  if (!(c.self_draft_noise >= 0 && c.self_draft_noise <= 1))
    return "speculative.self_draft_noise must be in [0, 1], got " + std::to_string(c.self_draft_noise);
  if (c.synthetic) {
    if (c.synthetic->mean.empty()) return "speculative.synthetic_acceptance is empty";
    for (size_t i = 0; i < c.synthetic->mean.size(); ++i) {
      const double m = c.synthetic->mean[i];
      if (!(m >= unlikely_mean && m <= likely_mean))
        return "speculative.synthetic_acceptance[" + std::to_string(i) + "] must be in [0.15, 0.925], got " +
               std::to_string(m);
    }
  }
  return std::nullopt;
}

double expected_accepted(std::span<const float> p, int64_t k) {
  double run = 1, sum = 0;
  for (int64_t i = 0; i < k && i < static_cast<int64_t>(p.size()); ++i) {
    run *= std::clamp(static_cast<double>(p[static_cast<size_t>(i)]), 0.0, 1.0);
    sum += run;
  }
  return sum;
}

std::vector<int64_t> choose_verify_lengths(std::span<const spec_candidate> c, const cost_model& cost,
                                           int64_t base_tokens) {
  struct yield {
    double y;
    size_t i;
    int64_t j;
  };
  std::vector<yield> order;
  double context = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    double run = 1;
    for (size_t j = 0; j < c[i].confidence.size(); ++j) {
      run *= std::clamp(static_cast<double>(c[i].confidence[j]), 0.0, 1.0);
      order.push_back({run, i, static_cast<int64_t>(j)});
    }
    context += static_cast<double>(c[i].context);
  }
  if (!c.empty()) context /= static_cast<double>(c.size());
  // Within a request the yields never grow, so this order keeps each request's drafts a prefix.
  std::stable_sort(order.begin(), order.end(), [](const yield& a, const yield& b) {
    return a.y > b.y || (a.y == b.y && (a.i < b.i || (a.i == b.i && a.j < b.j)));
  });
  const auto p = static_cast<int64_t>(std::llround(context));
  auto rate = [&](double tokens, int64_t n) {
    return tokens / std::max(cost.predict(base_tokens + n, p), 1e-12);
  };
  double tokens = static_cast<double>(c.size()), best = rate(tokens, 0);
  size_t best_n = 0;
  for (size_t n = 0; n < order.size(); ++n) {
    tokens += order[n].y;
    const double r = rate(tokens, static_cast<int64_t>(n + 1));
    if (r > best) {
      best = r;
      best_n = n + 1;
    }
  }
  std::vector<int64_t> k(c.size(), 0);
  for (size_t n = 0; n < best_n; ++n) k[order[n].i] = std::max(k[order[n].i], order[n].j + 1);
  return k;
}

void acceptance_estimate::record(int64_t verified, int64_t accepted) {
  if (static_cast<int64_t>(verified_.size()) < verified) {
    verified_.resize(static_cast<size_t>(verified), 0);
    accepted_.resize(static_cast<size_t>(verified), 0);
  }
  // Depth j was tested when the j earlier drafts were all accepted.
  for (int64_t j = 0; j < verified && j <= accepted; ++j) {
    ++verified_[static_cast<size_t>(j)];
    if (j < accepted) ++accepted_[static_cast<size_t>(j)];
  }
}

float acceptance_estimate::at(int64_t depth) const {
  const size_t j = static_cast<size_t>(depth);
  if (j >= verified_.size() || verified_[j] == 0) return 0.5f;
  return static_cast<float>(double(accepted_[j]) / double(verified_[j]));
}

bool accept_draft(const token_distribution& p, const token_distribution& q, int32_t x, double u) {
  const double px = p.prob(x), qx = q.prob(x);
  if (qx <= 0) return false;  // never drawn from q: cannot happen for a draft drawn from it
  return u < std::min(1.0, px / qx);
}

token_distribution residual(const token_distribution& p, const token_distribution& q) {
  token_distribution r;
  int32_t top = 0;
  for (int32_t id : p.ids) top = std::max(top, id);
  std::vector<double> qp(static_cast<size_t>(top) + 1, 0.0);
  for (size_t i = 0; i < q.ids.size(); ++i)
    if (q.ids[i] <= top && q.total > 0) qp[static_cast<size_t>(q.ids[i])] = q.weights[i] / q.total;
  for (size_t i = 0; i < p.ids.size(); ++i) {
    const double w = p.weights[i] / p.total - qp[static_cast<size_t>(p.ids[i])];
    if (w > 0) {
      r.ids.push_back(p.ids[i]);
      r.weights.push_back(static_cast<float>(w));
      r.total += static_cast<float>(w);
    }
  }
  if (r.ids.empty()) return p;  // p == q up to rounding: any draw from p is exact
  return r;
}

size_t auto_verify::index(int64_t decodes) {
  return static_cast<size_t>(std::bit_width(static_cast<uint64_t>(std::max<int64_t>(1, decodes))) - 1);
}

auto_verify::bucket& auto_verify::of(int64_t decodes) {
  const size_t b = index(decodes);
  if (buckets_.size() <= b) buckets_.resize(b + 1);
  return buckets_[b];
}

bool auto_verify::choose(int64_t decodes) {
  bucket& k = of(decodes);
  ++k.steps;
  const bool prior = decodes >= prior_from_;
  if (k.seen[0] < 3 || k.seen[1] < 3) return k.seen[prior ? 1 : 0] < 3 ? prior : !prior;
  const bool better = k.rate[1] > k.rate[0];
  if (k.trial >= 0 && k.trial_left > 0) {
    --k.trial_left;
    return k.trial == 1;
  }
  if (k.trial >= 0) {  // a trial ended: it confirmed the choice (back off) or changed it
    k.interval = better == k.trial_of ? std::min<int64_t>(2 * k.interval, 8192) : 256;
    k.retry_at = k.steps + k.interval;
    k.trial = -1;
  }
  if (k.steps < k.retry_at) return better;
  k.trial = better ? 0 : 1, k.trial_of = better, k.trial_left = 1;
  return k.trial == 1;
}

void auto_verify::measure(int64_t decodes, bool verified, bool decode_only, double rate) {
  const bool steady = verified == last_;
  last_ = verified;
  if (!steady || decodes == 0 || !decode_only || !(rate > 0)) return;  // a switch, or not a decode rate
  bucket& k = of(decodes);
  const int i = verified ? 1 : 0;
  const double w = k.trial == i ? 0.5 : 0.2;  // a trial's step is the fresh news of that choice
  k.rate[i] = k.seen[i] == 0 ? rate : (1 - w) * k.rate[i] + w * rate;
  ++k.seen[i];
}

double auto_verify::rate(int64_t decodes, bool verified) const {
  const size_t b = index(decodes);
  return b < buckets_.size() ? buckets_[b].rate[verified ? 1 : 0] : 0;
}

}  // namespace shoal::runtime
