// The decode placements (decode_placement.hpp): least loaded, least KV, the decode balancer, round-robin.
#include "runtime/placement/decode_placement.hpp"

#include <algorithm>
#include <tuple>

namespace shoal::runtime {

namespace {

bool usable(const decode_candidate& c, const decode_ask& ask, std::span<const engine_id> refused) {
  return !c.draining && c.blocks_free >= ask.blocks_needed &&
         std::find(refused.begin(), refused.end(), c.engine) == refused.end();
}

}  // namespace

std::optional<engine_id> least_loaded_placement::choose(const decode_ask& ask, std::span<const decode_candidate> engines,
                                                      std::span<const engine_id> refused) const {
  const decode_candidate* best = nullptr;
  auto rank = [](const decode_candidate& c) { return std::make_tuple(c.running, -c.blocks_free, c.engine); };
  for (const auto& c : engines) {
    if (!usable(c, ask, refused)) continue;
    if (!best || rank(c) < rank(*best)) best = &c;
  }
  if (!best) return std::nullopt;
  return best->engine;
}

std::optional<engine_id> least_kv_placement::choose(const decode_ask& ask, std::span<const decode_candidate> engines,
                                                  std::span<const engine_id> refused) const {
  const decode_candidate* best = nullptr;
  auto rank = [](const decode_candidate& c) { return std::make_tuple(c.kv_tokens, c.running, c.engine); };
  for (const auto& c : engines) {
    if (!usable(c, ask, refused)) continue;
    if (!best || rank(c) < rank(*best)) best = &c;
  }
  if (!best) return std::nullopt;
  return best->engine;
}

double decode_balancer::score(const decode_candidate& e, int64_t L, double w_r, double w_k) {
  const double r = static_cast<double>(e.running), k = static_cast<double>(e.kv_tokens), l = static_cast<double>(L);
  return w_r * w_r * (2 * r + 1) + w_k * w_k * (2 * k * l + l * l);
}

std::optional<engine_id> decode_balancer::choose(const decode_ask& ask, std::span<const decode_candidate> engines,
                                               std::span<const engine_id> refused) const {
  const int64_t L = cache_tokens(ask);
  double w_r = w_r_, w_k = w_k_;
  if (w_r <= 0 || w_k <= 0) {
    double sum_r = 0, sum_k = 0, n = 0;
    for (const auto& c : engines)
      if (!c.draining) sum_r += static_cast<double>(c.running), sum_k += static_cast<double>(c.kv_tokens), n += 1;
    if (n == 0) return std::nullopt;
    w_r = n / std::max(sum_r + 1, 1e-9);
    w_k = n / std::max(sum_k + static_cast<double>(L), 1e-9);
  }
  const decode_candidate* best = nullptr;
  double best_score = 0;
  for (const auto& c : engines) {
    if (!usable(c, ask, refused)) continue;
    const double s = score(c, L, w_r, w_k);
    if (!best || s < best_score || (s == best_score && c.engine < best->engine)) best = &c, best_score = s;
  }
  if (!best) return std::nullopt;
  return best->engine;
}

std::optional<engine_id> round_robin_placement::choose(const decode_ask& ask, std::span<const decode_candidate> engines,
                                                     std::span<const engine_id> refused) const {
  for (size_t k = 0; k < engines.size(); ++k) {
    const auto& c = engines[(next_ + k) % engines.size()];
    if (!usable(c, ask, refused)) continue;
    next_ = (next_ + k + 1) % engines.size();
    return c.engine;
  }
  return std::nullopt;
}

double balance_ratio(std::span<const double> loads) {
  if (loads.empty()) return 1.0;
  double sum = 0, mx = 0;
  for (double l : loads) sum += l, mx = std::max(mx, l);
  return mx > 0 ? sum / static_cast<double>(loads.size()) / mx : 1.0;
}

std::unique_ptr<decode_placement> make_decode_placement(const std::string& name, double per_request_s,
                                                        double per_kv_token_s) {
  if (name == "decode_balancer")
    return per_request_s > 0 && per_kv_token_s > 0 ? std::make_unique<decode_balancer>(per_request_s, per_kv_token_s)
                                                   : std::make_unique<decode_balancer>();
  if (name == "least_loaded" || name == "least_requests") return std::make_unique<least_loaded_placement>();
  if (name == "least_kv") return std::make_unique<least_kv_placement>();
  if (name == "round_robin") return std::make_unique<round_robin_placement>();
  return nullptr;
}

}  // namespace shoal::runtime
