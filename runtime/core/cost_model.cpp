// Fitting, querying and persisting the prefill cost model. The fit is a 4-column (optionally
// 1/seconds-weighted) least-squares problem solved by Householder QR on unit-norm columns,
// which stays accurate where normal equations would square a condition number already
// inflated by features spanning 1..1e10.
// Files are JSON, one per (preset, machine), replaced atomically so a reader never sees half.
#include "runtime/core/cost_model.hpp"

#include "model/backend.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace shoal::runtime {

namespace {

constexpr int feature_count = 4;
constexpr std::array<const char*, feature_count> feature_names = {"1", "n", "n*p", "n^2"};
// A unit-norm column closer than this to the span of the earlier ones is treated as
// dependent: its coefficient would be decided by rounding, not by the samples.
constexpr double rank_tolerance = 1e-10;
constexpr int64_t file_version = 1;

std::array<double, feature_count> features(int64_t n, int64_t p) {
  const double nd = static_cast<double>(n);
  return {1.0, nd, nd * static_cast<double>(p), nd * nd};
}

std::expected<void, std::string> check_samples(std::span<const cost_sample> samples,
                                               bool relative) {
  if (samples.size() < feature_count)
    return std::unexpected("need at least 4 samples to fit 4 coefficients, got " +
                           std::to_string(samples.size()));
  for (size_t i = 0; i < samples.size(); ++i) {
    const cost_sample& s = samples[i];
    const std::string at = "sample " + std::to_string(i) + ": ";
    if (s.n < 1) return std::unexpected(at + "n = " + std::to_string(s.n) + " (must be >= 1)");
    if (s.p < 0) return std::unexpected(at + "p = " + std::to_string(s.p) + " (must be >= 0)");
    if (!std::isfinite(s.seconds) || s.seconds < 0.0)
      return std::unexpected(at + "seconds is negative or not finite");
    if (relative && s.seconds == 0.0)
      return std::unexpected(at + "seconds is 0, which relative weighting cannot use");
  }
  return {};
}

std::string singular_message(int column, std::span<const cost_sample> samples) {
  std::set<int64_t> ns, ps;
  for (const cost_sample& s : samples) {
    ns.insert(s.n);
    ps.insert(s.p);
  }
  std::string earlier;
  for (int j = 0; j < column; ++j) earlier += (j ? ", " : "") + std::string(feature_names[j]);
  return "singular system: feature " + std::string(feature_names[column]) +
         " is (nearly) zero or a linear combination of [" + earlier + "] over these samples (" +
         std::to_string(ns.size()) + " distinct n, " + std::to_string(ps.size()) +
         " distinct p); vary n over >= 3 values and p independently of n";
}

// Least squares min |X beta - y| for X (m, 4) row-major, by Householder QR after scaling each
// column to unit norm. Returns the failing column index on rank deficiency.
std::expected<std::array<double, feature_count>, int> solve_least_squares(
    std::vector<double> x, std::vector<double> y) {
  const size_t m = y.size();
  auto at = [&](size_t row, int col) -> double& { return x[row * feature_count + col]; };
  std::array<double, feature_count> scale{};
  for (int j = 0; j < feature_count; ++j) {
    double sum = 0.0;
    for (size_t i = 0; i < m; ++i) sum += at(i, j) * at(i, j);
    if (!(sum > 0.0)) return std::unexpected(j);
    scale[j] = 1.0 / std::sqrt(sum);
    for (size_t i = 0; i < m; ++i) at(i, j) *= scale[j];
  }
  std::array<double, feature_count> diag{};  // R's diagonal; R above it stays in x
  for (int k = 0; k < feature_count; ++k) {
    double norm = 0.0;
    for (size_t i = k; i < m; ++i) norm += at(i, k) * at(i, k);
    norm = std::sqrt(norm);
    if (norm < rank_tolerance) return std::unexpected(k);
    const double alpha = at(k, k) > 0.0 ? -norm : norm;
    at(k, k) -= alpha;  // x[k:, k] now holds the reflector v
    const double vtv = -2.0 * alpha * at(k, k);  // |v|^2 = 2 norm (norm + |x_kk|)
    for (int j = k + 1; j < feature_count; ++j) {
      double dot = 0.0;
      for (size_t i = k; i < m; ++i) dot += at(i, k) * at(i, j);
      const double f = 2.0 * dot / vtv;
      for (size_t i = k; i < m; ++i) at(i, j) -= f * at(i, k);
    }
    double dot = 0.0;
    for (size_t i = k; i < m; ++i) dot += at(i, k) * y[i];
    const double f = 2.0 * dot / vtv;
    for (size_t i = k; i < m; ++i) y[i] -= f * at(i, k);
    diag[k] = alpha;
  }
  std::array<double, feature_count> beta{};
  for (int k = feature_count - 1; k >= 0; --k) {
    double sum = y[k];
    for (int j = k + 1; j < feature_count; ++j) sum -= at(k, j) * beta[j];
    beta[k] = sum / diag[k];
  }
  for (int j = 0; j < feature_count; ++j) beta[j] *= scale[j];
  return beta;
}

fit_quality measure_quality(const cost_model& model, std::span<const cost_sample> samples) {
  double mean = 0.0;
  for (const cost_sample& s : samples) mean += s.seconds;
  mean /= static_cast<double>(samples.size());
  double ss_res = 0.0, ss_tot = 0.0, rel_sq = 0.0;
  int64_t rel_count = 0;
  for (const cost_sample& s : samples) {
    const double err = model.predict(s.n, s.p) - s.seconds;
    ss_res += err * err;
    ss_tot += (s.seconds - mean) * (s.seconds - mean);
    if (s.seconds > 0.0) {
      rel_sq += (err / s.seconds) * (err / s.seconds);
      ++rel_count;
    }
  }
  fit_quality q;
  q.samples = static_cast<int64_t>(samples.size());
  // Constant targets: a perfect fit explains everything, anything else explains nothing.
  q.r2 = ss_tot > 0.0 ? 1.0 - ss_res / ss_tot : (ss_res == 0.0 ? 1.0 : 0.0);
  q.rms_rel_error = rel_count > 0 ? std::sqrt(rel_sq / static_cast<double>(rel_count)) : 0.0;
  return q;
}

// --- JSON field readers: every error names the file and the dotted field path. ---

std::string field_error(const std::string& file, const std::string& field,
                        const std::string& what) {
  return file + ": field \"" + field + "\" " + what;
}

std::expected<double, std::string> finite_number(const nlohmann::json& obj, const char* name,
                                                 const std::string& path,
                                                 const std::string& file) {
  const auto it = obj.find(name);
  if (it == obj.end()) return std::unexpected(field_error(file, path, "is missing"));
  if (!it->is_number()) return std::unexpected(field_error(file, path, "is not a number"));
  const double v = it->get<double>();
  if (!std::isfinite(v)) return std::unexpected(field_error(file, path, "is not finite"));
  return v;
}

std::expected<int64_t, std::string> integer(const nlohmann::json& obj, const char* name,
                                            const std::string& file) {
  const auto it = obj.find(name);
  if (it == obj.end()) return std::unexpected(field_error(file, name, "is missing"));
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    return std::unexpected(field_error(file, name, "is out of range"));
  if (!it->is_number_integer())
    return std::unexpected(field_error(file, name, "is not an integer"));
  return it->get<int64_t>();
}

std::expected<std::string, std::string> string_field(const nlohmann::json& obj, const char* name,
                                                     const std::string& file) {
  const auto it = obj.find(name);
  if (it == obj.end()) return std::unexpected(field_error(file, name, "is missing"));
  if (!it->is_string()) return std::unexpected(field_error(file, name, "is not a string"));
  return it->get<std::string>();
}

std::expected<std::array<double, feature_count>, std::string> coefficients(
    const nlohmann::json& root, const std::string& file) {
  const auto it = root.find("coefficients");
  if (it == root.end()) return std::unexpected(field_error(file, "coefficients", "is missing"));
  if (!it->is_object())
    return std::unexpected(field_error(file, "coefficients", "is not an object"));
  std::array<double, feature_count> out{};
  constexpr std::array<const char*, feature_count> names = {"a", "b", "c", "d"};
  for (int j = 0; j < feature_count; ++j) {
    auto v = finite_number(*it, names[j], std::string("coefficients.") + names[j], file);
    if (!v) return std::unexpected(v.error());
    out[j] = *v;
  }
  return out;
}

std::string errno_text() { return std::strerror(errno); }

// Writes `text` to `path` via a temporary sibling, fsync and rename, so `path` is always
// either the old file or the complete new one.
std::expected<void, std::string> write_atomically(const std::string& path,
                                                  const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return std::unexpected(tmp + ": cannot create: " + errno_text());
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const std::string err = tmp + ": write failed: " + errno_text();
      ::close(fd);
      ::unlink(tmp.c_str());
      return std::unexpected(err);
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string err = tmp + ": fsync/close failed: " + errno_text();
    ::unlink(tmp.c_str());
    return std::unexpected(err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = path + ": rename failed: " + errno_text();
    ::unlink(tmp.c_str());
    return std::unexpected(err);
  }
  // Make the rename itself durable; failure here leaves a valid file, so it is not an error.
  const std::string dir = std::filesystem::path(path).parent_path().string();
  if (const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return {};
}

}  // namespace

std::expected<cost_model, std::string> cost_model::fit(std::span<const cost_sample> samples,
                                                       weighting w) {
  const bool relative = w == weighting::relative;
  if (auto ok = check_samples(samples, relative); !ok)
    return std::unexpected("cost fit: " + ok.error());
  std::vector<double> x;
  std::vector<double> y;
  x.reserve(samples.size() * feature_count);
  y.reserve(samples.size());
  for (const cost_sample& s : samples) {
    const double weight = relative ? 1.0 / s.seconds : 1.0;  // row residual / seconds
    for (const double f : features(s.n, s.p)) x.push_back(f * weight);
    y.push_back(s.seconds * weight);
  }
  const auto beta = solve_least_squares(std::move(x), std::move(y));
  if (!beta) return std::unexpected("cost fit: " + singular_message(beta.error(), samples));
  cost_model model((*beta)[0], (*beta)[1], (*beta)[2], (*beta)[3]);
  model.quality_ = measure_quality(model, samples);
  return model;
}

double cost_model::predict(int64_t n, int64_t p) const {
  const auto f = features(n, p);
  const double t = a_ * f[0] + b_ * f[1] + c_ * f[2] + d_ * f[3];
  return t > 0.0 ? t : 0.0;  // also maps NaN to 0
}

// The integer n in [1, hi] where the unclamped quadratic q(n) = a + (b + c p) n + d n^2 is
// lowest: the vertex rounded either way when d > 0, else an end (q is concave or linear).
int64_t cost_model::lowest_point(int64_t p, int64_t hi) const {
  const auto q = [&](int64_t n) {
    const auto f = features(n, p);
    return a_ * f[0] + b_ * f[1] + c_ * f[2] + d_ * f[3];
  };
  if (!(d_ > 0.0)) return q(1) <= q(hi) ? 1 : hi;
  const double slope = b_ + c_ * static_cast<double>(p);
  const double vertex = std::clamp(-slope / (2.0 * d_), 1.0, static_cast<double>(hi));
  if (!std::isfinite(vertex)) return 1;
  const int64_t below = static_cast<int64_t>(std::floor(vertex));
  const int64_t above = std::min(below + 1, hi);
  return q(below) <= q(above) ? below : above;
}

// Why the search is exact for any coefficients: for fixed p, predict(n) = max(0, q(n)) with
// q quadratic in n; for a budget T >= 0 "fits" means q(n) <= T (a negative or NaN T fits
// nothing). If hi fits it is the answer. Otherwise take m = the lowest point of q on [1, hi]:
// if m does not fit, nothing does. If it does: for d > 0, q is nondecreasing on [m, hi] and
// {q <= T} is one interval around m; for d <= 0, m = 1 (hi does not fit) and {q > T} is one
// interval holding hi. Either way "fits" on [m, hi] is true then false, the answer lies there,
// and bisection finds the switch. Its invariant (lo fits, hi does not) also guarantees that,
// rounding or not, the answer never exceeds the time budget.
int64_t cost_model::largest_chunk(int64_t p, double time_budget_s, int64_t token_budget,
                                  int64_t remaining_tokens) const {
  if (remaining_tokens <= 0) return 0;
  int64_t hi = std::min(token_budget, remaining_tokens);
  if (hi <= 1) return 1;  // progress: one token even with no token budget left
  const auto fits = [&](int64_t n) { return predict(n, p) <= time_budget_s; };
  if (fits(hi)) return hi;
  int64_t lo = lowest_point(p, hi);
  if (lo == hi || !fits(lo)) return 1;  // progress: one token even when it overruns the time
  while (hi - lo > 1) {                 // at most 63 rounds
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

std::string cost_model::to_json() const {
  nlohmann::ordered_json root;
  root["version"] = file_version;
  root["preset"] = preset_;
  root["machine"] = machine_;
  root["coefficients"] = {{"a", a_}, {"b", b_}, {"c", c_}, {"d", d_}};
  root["samples"] = quality_.samples;
  root["r2"] = quality_.r2;
  root["rms_rel_error"] = quality_.rms_rel_error;
  return root.dump(2) + "\n";
}

std::expected<cost_model, std::string> cost_model::from_json(std::string_view text,
                                                             const std::string& file) {
  const nlohmann::json root = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return std::unexpected(file + ": invalid JSON");
  if (!root.is_object()) return std::unexpected(file + ": top level is not a JSON object");
  const auto version = integer(root, "version", file);
  if (!version) return std::unexpected(version.error());
  if (*version != file_version)
    return std::unexpected(file + ": field \"version\" is " + std::to_string(*version) +
                           ", this build reads version " + std::to_string(file_version));
  auto preset = string_field(root, "preset", file);
  if (!preset) return std::unexpected(preset.error());
  auto machine = string_field(root, "machine", file);
  if (!machine) return std::unexpected(machine.error());
  const auto coef = coefficients(root, file);
  if (!coef) return std::unexpected(coef.error());
  const auto samples = integer(root, "samples", file);
  if (!samples) return std::unexpected(samples.error());
  if (*samples < 0) return std::unexpected(field_error(file, "samples", "is negative"));
  const auto r2 = finite_number(root, "r2", "r2", file);
  if (!r2) return std::unexpected(r2.error());
  double rms = 0.0;
  if (root.contains("rms_rel_error")) {
    const auto v = finite_number(root, "rms_rel_error", "rms_rel_error", file);
    if (!v) return std::unexpected(v.error());
    if (*v < 0.0) return std::unexpected(field_error(file, "rms_rel_error", "is negative"));
    rms = *v;
  }
  cost_model model((*coef)[0], (*coef)[1], (*coef)[2], (*coef)[3]);
  model.preset_ = std::move(*preset);
  model.machine_ = std::move(*machine);
  model.quality_ = fit_quality{*samples, *r2, rms};
  return model;
}

std::string sanitize_name(std::string_view name) {
  std::string out;
  out.reserve(name.size());
  for (const char ch : name) {
    const bool ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
                    (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
    if (ok) {
      out.push_back(ch);
    } else if (out.empty() || out.back() != '_') {
      out.push_back('_');
    }
  }
  const size_t first = out.find_first_not_of('_');
  if (first == std::string::npos) return "unknown";
  const size_t last = out.find_last_not_of('_');
  return out.substr(first, last - first + 1);
}

std::string machine_id() {
  std::string cpu = "unknown";
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) cpu = sanitize_name(line.substr(colon + 1));
    break;
  }
  return cpu + "-" + std::to_string(model::cpu_threads()) + "c";
}

std::string cost_model_path(const std::string& dir, const std::string& preset,
                            const std::string& machine) {
  const std::string name = "cost-" + sanitize_name(preset) + "-" + sanitize_name(machine) + ".json";
  return (std::filesystem::path(dir) / name).string();
}

std::expected<cost_model, std::string> read_cost_model_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::unexpected(path + ": cannot open: " + errno_text());
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return std::unexpected(path + ": read failed");
  return cost_model::from_json(text.str(), path);
}

std::expected<cost_model, std::string> load_cost_model(const std::string& dir,
                                                       const std::string& preset,
                                                       const std::string& machine) {
  const std::string path = cost_model_path(dir, preset, machine);
  auto model = read_cost_model_file(path);
  if (!model) return model;
  if (model->preset() != preset)
    return std::unexpected(path + ": field \"preset\" is \"" + model->preset() + "\", expected \"" +
                           preset + "\"");
  if (model->machine() != machine)
    return std::unexpected(path + ": field \"machine\" is \"" + model->machine() +
                           "\", expected \"" + machine + "\"");
  return model;
}

std::expected<std::string, std::string> save_cost_model(const std::string& dir,
                                                        const cost_model& model) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return std::unexpected(dir + ": cannot create directory: " + ec.message());
  const std::string path = cost_model_path(dir, model.preset(), model.machine());
  if (auto ok = write_atomically(path, model.to_json()); !ok) return std::unexpected(ok.error());
  return path;
}

cost_fitter::cost_fitter(int64_t min_samples, int64_t capacity)
    : min_samples_(std::max<int64_t>(min_samples, 4)), capacity_(std::max(capacity, min_samples_)) {}

void cost_fitter::add(int64_t n, int64_t p, double seconds) {
  if (n < 1 || p < 0 || !(seconds > 0) || !std::isfinite(seconds)) return;
  std::erase_if(samples_, [&](const cost_sample& s) { return s.n == n && s.p == p; });
  if (static_cast<int64_t>(samples_.size()) >= capacity_) samples_.erase(samples_.begin());
  samples_.push_back({n, p, seconds});
}

std::optional<cost_model> cost_fitter::fit() const {
  if (static_cast<int64_t>(samples_.size()) < min_samples_) return std::nullopt;
  std::vector<int64_t> ns;
  for (const cost_sample& s : samples_) ns.push_back(s.n);
  std::sort(ns.begin(), ns.end());
  if (std::unique(ns.begin(), ns.end()) - ns.begin() < 4) return std::nullopt;
  auto m = cost_model::fit(samples_);
  if (!m) return std::nullopt;
  return *m;
}

}  // namespace shoal::runtime
