// Prefill step-time cost model used by the scheduler to size prefill chunks. A quadratic
// t(n, p) = a + b*n + c*n*p + d*n^2 (n = new tokens in the chunk, p = prefix tokens already
// computed) is fitted by least squares to measured steps, persisted per preset and machine,
// and asked for the largest chunk that fits both a token budget and the remaining time.
#pragma once

#include <cstdint>
#include <expected>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shoal::runtime {

// One measured prefill step: `n` new tokens on top of `p` already computed, taking `seconds`.
struct cost_sample {
  int64_t n = 0;
  int64_t p = 0;
  double seconds = 0.0;
};

// How well a fit matches the samples it was fitted to (zeros for a hand-built model).
struct fit_quality {
  int64_t samples = 0;
  double r2 = 0.0;             // 1 - SS_res / SS_tot over the samples, using predict()
  double rms_rel_error = 0.0;  // sqrt(mean(((predict - seconds) / seconds)^2)), seconds > 0 only
};

class cost_model {
 public:
  cost_model() = default;
  cost_model(double a, double b, double c, double d) : a_(a), b_(b), c_(c), d_(d) {}

  // Least squares on the features [1, n, n*p, n^2]. Timing noise is roughly proportional
  // to step time, so by default each residual is taken relative to its sample's seconds
  // (weights 1/seconds): unweighted OLS lets the 0.3 s samples swamp the 3 ms ones and can
  // miss small-chunk times by 2x; `absolute` gives plain OLS. The columns span 1..1e10, so
  // each is scaled to unit norm and the system is solved by Householder QR rather than
  // normal equations. Errors (a message saying why): fewer than 4 samples, n < 1, p < 0,
  // seconds non-finite, negative, or 0 under relative weighting, or samples that do not
  // determine all four coefficients (one (n, p) repeated, all p equal, < 3 distinct n...).
  // Negative coefficients are kept as fitted: predict() clamps instead.
  enum class weighting { relative, absolute };
  static std::expected<cost_model, std::string> fit(std::span<const cost_sample> samples,
                                                    weighting w = weighting::relative);

  // Predicted step time in seconds, never negative: an odd fit (say a < 0) can make the
  // quadratic dip below zero for small n, and a negative time would break every budget sum,
  // so the result is clamped at 0.
  double predict(int64_t n, int64_t p) const;

  // The largest n in [1, min(token_budget, remaining_tokens)] with predict(n, p) <=
  // time_budget_s. Progress is always made: when remaining_tokens >= 1 the result is at least
  // 1, even if no chunk meets the time budget or token_budget < 1. Returns 0 only when
  // remaining_tokens <= 0. predict need not be monotone in n (odd fits); the search is exact
  // for any coefficients because the model is quadratic in n, see the .cpp.
  int64_t largest_chunk(int64_t p, double time_budget_s, int64_t token_budget,
                        int64_t remaining_tokens) const;

  double a() const { return a_; }
  double b() const { return b_; }
  double c() const { return c_; }
  double d() const { return d_; }
  const fit_quality& quality() const { return quality_; }

  // Which model preset and machine the coefficients were measured on (persistence keys).
  const std::string& preset() const { return preset_; }
  const std::string& machine() const { return machine_; }
  void set_preset(std::string preset) { preset_ = std::move(preset); }
  void set_machine(std::string machine) { machine_ = std::move(machine); }

  // {"version":1, "preset", "machine", "coefficients":{"a","b","c","d"}, "samples", "r2",
  // "rms_rel_error"}; doubles are written with round-trip precision.
  std::string to_json() const;
  // Parses to_json() output. Errors start with "<file>: " and name the field: bad JSON,
  // missing or mistyped field, non-finite number, unsupported version. "rms_rel_error" is
  // optional (absent reads as 0).
  static std::expected<cost_model, std::string> from_json(std::string_view text,
                                                          const std::string& file);

 private:
  int64_t lowest_point(int64_t p, int64_t hi) const;

  double a_ = 0.0;  // seconds per step
  double b_ = 0.0;  // seconds per new token
  double c_ = 0.0;  // seconds per (new token x prefix token): attention over the prefix
  double d_ = 0.0;  // seconds per new token^2: attention within the chunk
  fit_quality quality_;
  std::string preset_;
  std::string machine_;
};

// Fitting a cost model from the steps an engine runs (shoald's default when no fitted file is
// at hand: an expert-parallel rank holds no routed experts before its group forms, so it cannot
// be timed alone at start; its real steps, exchanges included, are what the model must
// predict). A step of n new tokens in total over items i of n_i tokens on p_i computed ones is
// the sample (n, Σ n_i·p_i / n): c·n·p is then the step's attention term exactly. Steps that
// computed a multi-token chunk are kept, one per distinct (n, p) (the latest), at most
// `capacity`; fit() is tried once `min_samples` are in with at least 4 distinct n.
class cost_fitter {
 public:
  explicit cost_fitter(int64_t min_samples = 32, int64_t capacity = 256);
  void add(int64_t n, int64_t p, double seconds);
  int64_t samples() const { return static_cast<int64_t>(samples_.size()); }
  // The fitted model once the samples determine it (nullopt before, or when they do not yet).
  std::optional<cost_model> fit() const;

 private:
  int64_t min_samples_, capacity_;
  std::vector<cost_sample> samples_;
};

// Maps `name` onto [A-Za-z0-9._-] for use in a file name: each run of other characters
// becomes one '_', leading/trailing '_' are dropped, and an empty result becomes "unknown".
std::string sanitize_name(std::string_view name);

// "<cpu model name from /proc/cpuinfo, sanitized>-<compute threads>c", e.g.
// "Intel_R_Xeon_R_Platinum_8480-16c" (the kernels' thread count, kernels::num_threads: a fit
// with 1 thread is another machine than one with 2); the name part is "unknown" when
// /proc/cpuinfo has no "model name" line.
std::string machine_id();

// `<dir>/cost-<sanitize(preset)>-<sanitize(machine)>.json`
std::string cost_model_path(const std::string& dir, const std::string& preset,
                            const std::string& machine);

// Reads a model file (to_json's format); errors start with the path.
std::expected<cost_model, std::string> read_cost_model_file(const std::string& path);

// Reads the model for (preset, machine); the file's own "preset" and "machine" fields must
// equal the requested ones (sanitizing can map two names onto one file).
std::expected<cost_model, std::string> load_cost_model(const std::string& dir,
                                                       const std::string& preset,
                                                       const std::string& machine);

// Writes `model` to cost_model_path(dir, model.preset(), model.machine()) atomically (a
// temporary file in `dir`, fsync, rename), creating `dir` if needed; returns the path.
std::expected<std::string, std::string> save_cost_model(const std::string& dir,
                                                        const cost_model& model);

}  // namespace shoal::runtime
