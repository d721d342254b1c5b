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

// The gateway's metrics (names below); label `model` unless noted.
struct gateway_metrics {
  counter requests;           // shoal_requests_total{status}: finished HTTP requests by status code
  counter prompt_tokens;      // shoal_prompt_tokens_total
  counter generated_tokens;   // shoal_generation_tokens_total
  counter cached_tokens;      // shoal_prefix_cache_hit_tokens_total: prompt tokens from the cache
  histogram ttft;             // shoal_time_to_first_token_seconds
  histogram tpot;             // shoal_time_per_output_token_seconds
  gauge queue_depth;          // shoal_queue_depth (no label): requests in flight at the gateway
};
gateway_metrics add_gateway_metrics(metrics_registry& r);

// Every node's own metrics (node.metrics_listen), label `actor`: "rank<i>" for engine ranks,
// "storage<i>" for storage nodes. Step time and tokens per step are ratios of the counters
// (rate(step_seconds) / rate(steps), rate(prefill + decode tokens) / rate(steps)).
struct node_metrics {
  gauge running, waiting, waiting_for_remote;  // shoal_engine_requests_{running,waiting,waiting_for_remote}
  gauge blocks_used, blocks_free;              // shoal_engine_kv_blocks_{used,free}
  counter prefix_queries;                      // shoal_engine_prefix_queries_total: admissions that looked up the cache
  counter hit_tokens, storage_hit_tokens;      // shoal_engine_prefix_hit_tokens_total, …_storage_hit_tokens_total
  counter steps, step_seconds;                 // shoal_engine_steps_total, shoal_engine_step_seconds_total
  counter prefill_tokens, decode_tokens;       // shoal_engine_{prefill,decode}_tokens_total
  counter images_encoded, image_cache_hits;    // shoal_engine_images_encoded_total, …_image_cache_hits_total
  gauge storage_usage, storage_capacity, storage_chunks;  // shoal_storage_{usage,capacity}_bytes, shoal_storage_chunks
  counter storage_puts, storage_gets, storage_gc_evicted, storage_ttl_expired;
  counter storage_put_seconds, storage_get_seconds, storage_get_hits;  // latency: rate(seconds) / rate(count)
  // Gateway nodes: shoal_prefill_balancer_placements_total{engine}, …_tier_placements_total{tier},
  // shoal_decode_balancer_placements_total{engine}, shoal_decode_balancer_balance_ratio{window}.
  counter prefill_placements, prefill_tier_placements, decode_placements;
  gauge decode_balance;
  // Expert-parallel engine nodes with partitioned weights (runtime/expert_residency.hpp):
  // shoal_engine_experts_resident{actor="node"} (MoE layer, routed expert) weights in memory,
  // shoal_engine_experts_resident_bytes their bytes.
  gauge experts_resident, experts_resident_bytes;
  // shoal_ep_frames_sent_total{path="bulk"|"inline"}: expert-parallel frames this process's
  // ranks sent over the bulk transport / inside CAF messages.
  counter ep_frames_sent;
  // shoal_ep_expert_bytes_read_total{source="holder"|"checkpoint"}: routed-expert weights this
  // process read from another process over the bulk transport / from its checkpoint (group
  // starts included); shoal_ep_expert_read_failures_total: reads from a holder that failed
  // (the checkpoint gave those experts).
  counter ep_expert_bytes_read, ep_expert_read_failures;
  // shoal_transport_reads_total{path="shm"|"network"}: ranges the engine ranks' bulk transport
  // read through shm (owner on this host) / through the network provider, with
  // engine.transport = "auto" or "shm+<provider>".
  counter transport_reads;
  // process_resident_memory_bytes: this process's resident set (every role).
  gauge process_resident;
};
node_metrics add_node_metrics(metrics_registry& r);

// This process's resident set size now (/proc/self/statm), in bytes; 0 where unknown.
int64_t process_resident_bytes();

}  // namespace shoal::runtime
