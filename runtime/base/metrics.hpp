// A small thread-safe metrics registry rendered in the Prometheus text exposition format
// 0.0.4 (GET /metrics): counters, gauges and histograms, each family with at most one label
// (`{status="200"}`, `{model="x"}`). Families are declared once at start-up and updated through
// cheap handles; misuse (a counter going down, a second label) is a programmer error.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace shoal::runtime {

class metrics_registry;
struct metric_family;  // one named metric and its series (metrics.cpp)

// Handles into a registry; copyable, valid while the registry lives. `label` is the value of
// the family's label ("" when it has none).
class counter {
 public:
  void inc(double by = 1.0, std::string_view label = {}) const;  // by >= 0
  // Raises the series to `total` (a cumulative count read from elsewhere); never lowers it.
  void advance_to(double total, std::string_view label = {}) const;
 private:
  friend class metrics_registry;
  metrics_registry* r_ = nullptr;
  metric_family* f_ = nullptr;
};

class gauge {
 public:
  void set(double v, std::string_view label = {}) const;
  void add(double by, std::string_view label = {}) const;  // negative to decrease
 private:
  friend class metrics_registry;
  metrics_registry* r_ = nullptr;
  metric_family* f_ = nullptr;
};

class histogram {
 public:
  void observe(double v, std::string_view label = {}) const;  // counted in every bucket with v <= le
 private:
  friend class metrics_registry;
  metrics_registry* r_ = nullptr;
  metric_family* f_ = nullptr;
};

class metrics_registry {
 public:
  metrics_registry();
  ~metrics_registry();
  metrics_registry(const metrics_registry&) = delete;
  metrics_registry& operator=(const metrics_registry&) = delete;

  // Names match [a-zA-Z_:][a-zA-Z0-9_:]* and are unique; counter names end in "_total".
  // label_name empty: a single unlabelled series, rendered (as 0) even before any update.
  counter add_counter(std::string name, std::string help, std::string label_name = "");
  gauge add_gauge(std::string name, std::string help, std::string label_name = "");
  // upper_bounds: finite, strictly increasing; the +Inf bucket is implicit.
  histogram add_histogram(std::string name, std::string help, std::vector<double> upper_bounds,
                          std::string label_name = "");

  // The exposition text: families in declaration order, series by label value, then "\n".
  std::string render() const;

 private:
  friend class counter;
  friend class gauge;
  friend class histogram;
  metric_family* add_family(metric_family f);
  mutable std::mutex mutex_;  // guards every family's series
  std::vector<std::unique_ptr<metric_family>> families_;
};

// The p-quantile (p in [0, 1]) of `v` by nearest rank; 0 for no values.
double percentile(std::vector<double> v, double p);

// Latency buckets in seconds for TTFT and TPOT: 0.005 s to 60 s.
std::vector<double> latency_buckets_seconds();

// This process's resident set size now (/proc/self/statm), in bytes; 0 where unknown.
int64_t process_resident_bytes();

}  // namespace shoal::runtime
