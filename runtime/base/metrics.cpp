// Prometheus registry (metrics.hpp): one mutex guards all series, since updates are a few per
// request and scrapes are rare; histograms keep per-bucket counts and are made cumulative when
// rendered. Numbers print as the shortest round-trip decimal ("3", "0.005", "+Inf").
#include "runtime/base/metrics.hpp"

#include "kernels/assert.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <map>

#include <unistd.h>

namespace shoal::runtime {

enum class metric_kind : uint8_t { counter, gauge, histogram };

struct series {
  double value = 0;                     // counter, gauge
  std::vector<uint64_t> bucket_counts;  // histogram: one per bound, then +Inf (not cumulative)
  double sum = 0;
  uint64_t count = 0;
};

struct metric_family {
  metric_kind kind = metric_kind::counter;
  std::string name;
  std::string help;
  std::string label_name;
  std::vector<double> bounds;
  std::map<std::string, series, std::less<>> by_label;

  series& at(std::string_view label) {
    SHOAL_ASSERT(label.empty() == label_name.empty());  // a label value iff the family has a label
    auto it = by_label.find(label);
    if (it == by_label.end()) {
      it = by_label.emplace(std::string(label), series{}).first;
      if (kind == metric_kind::histogram) it->second.bucket_counts.assign(bounds.size() + 1, 0);
    }
    return it->second;
  }
};

namespace {

bool valid_name(std::string_view n) {
  const auto ok = [](char c, bool first) {
    return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':' ||
           (!first && std::isdigit(static_cast<unsigned char>(c)));
  };
  if (n.empty() || !ok(n[0], true)) return false;
  return std::all_of(n.begin() + 1, n.end(), [&](char c) { return ok(c, false); });
}

std::string format_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, end);
}

// Label values escape \, " and newline; HELP text escapes \ and newline.
std::string escape(std::string_view s, bool quote) {
  std::string out;
  for (char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '"' && quote) out += "\\\"";
    else out += c;
  }
  return out;
}

// `{label="value",le="0.5"}`, or "" when there is nothing to put in braces.
std::string labels(const metric_family& f, const std::string& value, const std::string& le = "") {
  std::string out;
  if (!f.label_name.empty()) out += f.label_name + "=\"" + escape(value, true) + "\"";
  if (!le.empty()) out += (out.empty() ? "" : ",") + std::string("le=\"") + le + "\"";
  return out.empty() ? out : "{" + out + "}";
}

void render_family(const metric_family& f, std::string& out) {
  static constexpr const char* kinds[] = {"counter", "gauge", "histogram"};
  out += "# HELP " + f.name + " " + escape(f.help, false) + "\n";
  out += "# TYPE " + f.name + " " + kinds[static_cast<int>(f.kind)] + "\n";
  for (const auto& [label, s] : f.by_label) {
    if (f.kind != metric_kind::histogram) {
      out += f.name + labels(f, label) + " " + format_number(s.value) + "\n";
      continue;
    }
    uint64_t cumulative = 0;
    for (size_t i = 0; i <= f.bounds.size(); ++i) {
      cumulative += s.bucket_counts[i];
      const std::string le = i < f.bounds.size() ? format_number(f.bounds[i]) : "+Inf";
      out += f.name + "_bucket" + labels(f, label, le) + " " + std::to_string(cumulative) + "\n";
    }
    out += f.name + "_sum" + labels(f, label) + " " + format_number(s.sum) + "\n";
    out += f.name + "_count" + labels(f, label) + " " + std::to_string(s.count) + "\n";
  }
}

}  // namespace

void counter::inc(double by, std::string_view label) const {
  SHOAL_ASSERT(r_ != nullptr && by >= 0);
  std::lock_guard lock(r_->mutex_);
  f_->at(label).value += by;
}

void counter::advance_to(double total, std::string_view label) const {
  SHOAL_ASSERT(r_ != nullptr);
  std::lock_guard lock(r_->mutex_);
  auto& v = f_->at(label).value;
  v = std::max(v, total);
}

void gauge::set(double v, std::string_view label) const {
  SHOAL_ASSERT(r_ != nullptr);
  std::lock_guard lock(r_->mutex_);
  f_->at(label).value = v;
}

void gauge::add(double by, std::string_view label) const {
  SHOAL_ASSERT(r_ != nullptr);
  std::lock_guard lock(r_->mutex_);
  f_->at(label).value += by;
}

void histogram::observe(double v, std::string_view label) const {
  SHOAL_ASSERT(r_ != nullptr && !std::isnan(v));
  std::lock_guard lock(r_->mutex_);
  series& s = f_->at(label);
  const size_t bucket = std::lower_bound(f_->bounds.begin(), f_->bounds.end(), v) - f_->bounds.begin();
  ++s.bucket_counts[bucket];
  s.sum += v;
  ++s.count;
}

metrics_registry::metrics_registry() = default;
metrics_registry::~metrics_registry() = default;

metric_family* metrics_registry::add_family(metric_family f) {
  SHOAL_ASSERT(valid_name(f.name));
  SHOAL_ASSERT(f.label_name.empty() || (valid_name(f.label_name) && f.label_name != "le"));
  std::lock_guard lock(mutex_);
  for (const auto& g : families_) SHOAL_ASSERT(g->name != f.name);
  families_.push_back(std::make_unique<metric_family>(std::move(f)));
  metric_family* p = families_.back().get();
  if (p->label_name.empty()) p->at("");  // the single series exists from the start
  return p;
}

counter metrics_registry::add_counter(std::string name, std::string help, std::string label_name) {
  SHOAL_ASSERT(name.ends_with("_total"));
  counter c;
  c.r_ = this;
  c.f_ = add_family({metric_kind::counter, std::move(name), std::move(help), std::move(label_name), {}, {}});
  return c;
}

gauge metrics_registry::add_gauge(std::string name, std::string help, std::string label_name) {
  gauge g;
  g.r_ = this;
  g.f_ = add_family({metric_kind::gauge, std::move(name), std::move(help), std::move(label_name), {}, {}});
  return g;
}

histogram metrics_registry::add_histogram(std::string name, std::string help, std::vector<double> upper_bounds,
                                          std::string label_name) {
  SHOAL_ASSERT(!upper_bounds.empty());
  for (size_t i = 0; i < upper_bounds.size(); ++i)
    SHOAL_ASSERT(std::isfinite(upper_bounds[i]) && (i == 0 || upper_bounds[i - 1] < upper_bounds[i]));
  histogram h;
  h.r_ = this;
  h.f_ = add_family({metric_kind::histogram, std::move(name), std::move(help), std::move(label_name),
                     std::move(upper_bounds), {}});
  return h;
}

std::string metrics_registry::render() const {
  std::string out;
  std::lock_guard lock(mutex_);
  for (const auto& f : families_) render_family(*f, out);
  return out;
}

std::vector<double> latency_buckets_seconds() {
  return {0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 60.0};
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5))];
}

int64_t process_resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0;
  return resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace shoal::runtime
