// Tests of runtime/metrics: the exact Prometheus 0.0.4 text of a small registry (counters with
// and without a label, a gauge, a histogram with cumulative buckets and +Inf), label escaping,
// the gateway metric set, and concurrent updates from several threads summing exactly.
#include "runtime/serve/metric_families.hpp"

#include <doctest/doctest.h>

#include <string>
#include <thread>
#include <vector>

using namespace shoal::runtime;

TEST_CASE("metrics: a small registry renders exactly") {
  metrics_registry r;
  const counter requests = r.add_counter("shoal_requests_total", "Finished requests.", "status");
  const counter tokens = r.add_counter("shoal_tokens_total", "Generated tokens.");
  const gauge depth = r.add_gauge("shoal_queue_depth", "Waiting requests.");
  const histogram ttft = r.add_histogram("shoal_ttft_seconds", "Time to first token.", {0.005, 0.1, 1}, "model");
  const counter unused = r.add_counter("shoal_unused_total", "Never incremented.", "model");

  requests.inc(1, "200");
  requests.inc(2, "200");
  requests.inc(1, "400");
  tokens.inc(7);
  depth.set(5);
  depth.add(-2);
  ttft.observe(0.005, "small");  // le is inclusive
  ttft.observe(0.05, "small");
  ttft.observe(3, "small");
  ttft.observe(0.5, "big");

  CHECK(r.render() ==
        "# HELP shoal_requests_total Finished requests.\n"
        "# TYPE shoal_requests_total counter\n"
        "shoal_requests_total{status=\"200\"} 3\n"
        "shoal_requests_total{status=\"400\"} 1\n"
        "# HELP shoal_tokens_total Generated tokens.\n"
        "# TYPE shoal_tokens_total counter\n"
        "shoal_tokens_total 7\n"
        "# HELP shoal_queue_depth Waiting requests.\n"
        "# TYPE shoal_queue_depth gauge\n"
        "shoal_queue_depth 3\n"
        "# HELP shoal_ttft_seconds Time to first token.\n"
        "# TYPE shoal_ttft_seconds histogram\n"
        "shoal_ttft_seconds_bucket{model=\"big\",le=\"0.005\"} 0\n"
        "shoal_ttft_seconds_bucket{model=\"big\",le=\"0.1\"} 0\n"
        "shoal_ttft_seconds_bucket{model=\"big\",le=\"1\"} 1\n"
        "shoal_ttft_seconds_bucket{model=\"big\",le=\"+Inf\"} 1\n"
        "shoal_ttft_seconds_sum{model=\"big\"} 0.5\n"
        "shoal_ttft_seconds_count{model=\"big\"} 1\n"
        "shoal_ttft_seconds_bucket{model=\"small\",le=\"0.005\"} 1\n"
        "shoal_ttft_seconds_bucket{model=\"small\",le=\"0.1\"} 2\n"
        "shoal_ttft_seconds_bucket{model=\"small\",le=\"1\"} 2\n"
        "shoal_ttft_seconds_bucket{model=\"small\",le=\"+Inf\"} 3\n"
        "shoal_ttft_seconds_sum{model=\"small\"} 3.055\n"
        "shoal_ttft_seconds_count{model=\"small\"} 3\n"
        "# HELP shoal_unused_total Never incremented.\n"
        "# TYPE shoal_unused_total counter\n");
  (void)unused;
}

TEST_CASE("metrics: label values and help text are escaped") {
  metrics_registry r;
  const gauge g = r.add_gauge("g", "line1\nback\\slash \"quoted\"", "model");
  g.set(1.5, "a\"b\\c\nd");
  CHECK(r.render() ==
        "# HELP g line1\\nback\\\\slash \"quoted\"\n"
        "# TYPE g gauge\n"
        "g{model=\"a\\\"b\\\\c\\nd\"} 1.5\n");
}

TEST_CASE("metrics: the gateway set and an unlabelled histogram") {
  metrics_registry r;
  const gateway_metrics m = add_gateway_metrics(r);
  m.requests.inc(1, "200");
  m.prompt_tokens.inc(12, "small");
  m.generated_tokens.inc(30, "small");
  m.cached_tokens.inc(8, "small");
  m.ttft.observe(0.2, "small");
  m.tpot.observe(0.02, "small");
  m.queue_depth.set(4);
  const std::string text = r.render();
  for (const char* line :
       {"shoal_requests_total{status=\"200\"} 1\n", "shoal_prompt_tokens_total{model=\"small\"} 12\n",
        "shoal_generation_tokens_total{model=\"small\"} 30\n",
        "shoal_prefix_cache_hit_tokens_total{model=\"small\"} 8\n",
        "shoal_time_to_first_token_seconds_bucket{model=\"small\",le=\"0.25\"} 1\n",
        "shoal_time_to_first_token_seconds_bucket{model=\"small\",le=\"0.1\"} 0\n",
        "shoal_time_to_first_token_seconds_bucket{model=\"small\",le=\"60\"} 1\n",
        "shoal_time_per_output_token_seconds_bucket{model=\"small\",le=\"0.025\"} 1\n",
        "shoal_time_per_output_token_seconds_count{model=\"small\"} 1\n", "# TYPE shoal_queue_depth gauge\n",
        "shoal_queue_depth 4\n"}) {
    CAPTURE(line);
    CHECK(text.find(line) != std::string::npos);
  }
  CHECK(latency_buckets_seconds().front() == 0.005);
  CHECK(latency_buckets_seconds().back() == 60.0);

  metrics_registry r2;
  r2.add_histogram("h", "H.", {1}).observe(2);
  CHECK(r2.render() ==
        "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 0\nh_bucket{le=\"+Inf\"} 1\nh_sum 2\nh_count 1\n");
}

TEST_CASE("metrics: concurrent updates from 4 threads sum exactly") {
  metrics_registry r;
  const counter c = r.add_counter("c_total", "C.", "t");
  const histogram h = r.add_histogram("h", "H.", {0.5});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10000; ++i) {
        c.inc(1, t % 2 ? "odd" : "even");
        h.observe(i % 2 ? 1.0 : 0.25);
      }
    });
  for (auto& t : threads) t.join();
  CHECK(r.render() ==
        "# HELP c_total C.\n# TYPE c_total counter\nc_total{t=\"even\"} 20000\nc_total{t=\"odd\"} 20000\n"
        "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"0.5\"} 20000\nh_bucket{le=\"+Inf\"} 40000\n"
        "h_sum 25000\nh_count 40000\n");
}
