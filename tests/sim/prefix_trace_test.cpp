// Tests for Mooncake trace replay: the plain-LRU hit ratios must reproduce the reference table
// of shared/traces/README.md (section 1) to 4 digits, the block_pool policy must do at least
// as well, and malformed trace lines must give errors that name the file and line.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <unistd.h>

#include "sim/prefix_trace.hpp"

using namespace shoal::sim;

namespace {

const std::string trace_dir = std::string(SHOAL_SHARED_DIR) + "/traces/mooncake/";

// Each trace is parsed once per test run.
const std::vector<trace_request>& trace(const std::string& name) {
  static std::map<std::string, std::vector<trace_request>> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    auto loaded = load_mooncake_trace(trace_dir + name + "_trace.jsonl");
    INFO((loaded.has_value() ? std::string() : loaded.error()));
    REQUIRE(loaded.has_value());
    it = cache.emplace(name, std::move(*loaded)).first;
  }
  return it->second;
}

// README figures are rounded to 4 digits.
bool matches4(double got, double want) { return std::fabs(got - want) < 5e-5; }

// Writes `text` to a fresh temporary file and returns its path.
std::string temp_trace(const std::string& tag, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("shoal_prefix_trace_" + tag + "_" + std::to_string(::getpid()) + ".jsonl");
  std::ofstream(path) << text;
  return path.string();
}

}  // namespace

TEST_CASE("prefix_trace: loads the Mooncake traces with the README statistics") {
  const auto& conv = trace("conversation");
  CHECK(conv.size() == 12031);
  const auto& syn = trace("synthetic");
  CHECK(syn.size() == 3993);
  // First row: {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0..13]}
  REQUIRE(!conv.empty());
  CHECK(conv[0].timestamp_ms == 0);
  CHECK(conv[0].input_length == 6758);
  CHECK(conv[0].output_length == 500);
  REQUIRE(conv[0].hash_ids.size() == 14);
  CHECK(conv[0].hash_ids.front() == 0);
  CHECK(conv[0].hash_ids.back() == 13);
  int64_t blocks = 0;
  bool block_count_ok = true;
  for (const auto& r : conv) {
    blocks += static_cast<int64_t>(r.hash_ids.size());
    block_count_ok &= static_cast<int64_t>(r.hash_ids.size()) == (r.input_length + 511) / 512;
  }
  CHECK(blocks == 288500);
  CHECK(block_count_ok);
}

TEST_CASE("prefix_trace: plain LRU reproduces the conversation figures at 10k and 100k") {
  const auto& conv = trace("conversation");
  const replay_stats s10k = replay_trace(conv, 10000, cache_policy::lru);
  CHECK(s10k.requests == 12031);
  CHECK(s10k.blocks == 288500);
  INFO("10k hit ratio ", s10k.hit_ratio());
  CHECK(matches4(s10k.hit_ratio(), 0.2112));
  const replay_stats s100k = replay_trace(conv, 100000, cache_policy::lru);
  INFO("100k hit ratio ", s100k.hit_ratio());
  CHECK(matches4(s100k.hit_ratio(), 0.3637));
}

TEST_CASE("prefix_trace: plain LRU reproduces the whole README table") {
  struct row {
    const char* trace;
    int32_t capacity;
    double want;
  };
  const row table[] = {
      {"conversation", 1000, 0.0445},  {"conversation", 4000, 0.0858},
      {"conversation", 30000, 0.3257}, {"synthetic", 1000, 0.0825},
      {"synthetic", 4000, 0.2302},     {"synthetic", 10000, 0.4235},
      {"synthetic", 30000, 0.6242},    {"synthetic", 100000, 0.6396},
      // Infinite cache: the ideal prefix hit ratio.
      {"conversation", 1 << 30, 0.3664}, {"synthetic", 1 << 30, 0.6396},
  };
  for (const row& r : table) {
    const double got = replay_trace(trace(r.trace), r.capacity, cache_policy::lru).hit_ratio();
    INFO(r.trace, " @ ", r.capacity, ": ", got, " vs ", r.want);
    CHECK(matches4(got, r.want));
  }
}

TEST_CASE("prefix_trace: the block_pool policy hits at least as often as plain LRU") {
  for (const char* name : {"conversation", "synthetic"}) {
    for (const int32_t cap : {1000, 10000, 100000}) {
      const auto& t = trace(name);
      const replay_stats lru = replay_trace(t, cap, cache_policy::lru);
      const replay_stats pool = replay_trace(t, cap, cache_policy::pool);
      INFO(name, " @ ", cap, ": pool ", pool.hit_ratio(), " lru ", lru.hit_ratio());
      CHECK(pool.requests == lru.requests);
      CHECK(pool.blocks == lru.blocks);
      CHECK(pool.hit_ratio() >= lru.hit_ratio());
      // The pool never evicts more often than it allocates fresh blocks.
      CHECK(static_cast<int64_t>(pool.evictions) <= pool.blocks - pool.hit_blocks);
    }
  }
}

TEST_CASE("prefix_trace: small hand-made replay") {
  // Capacity 3. r0 caches {1,2,3}; r1 shares the head {1,2}; r2 is unrelated and evicts.
  const std::vector<trace_request> t{
      {0, 3 * 512, 1, {1, 2, 3}},
      {1, 3 * 512, 1, {1, 2, 4}},
      {2, 1 * 512, 1, {9}},
      {3, 2 * 512, 1, {1, 2}},
  };
  // LRU: r0 0 hits; r1 2 hits (3 evicted: order MRU 4,2,1); r2 0 hits (evicts 1);
  // r3: 1 missing -> 0 hits.
  const replay_stats lru = replay_trace(t, 3, cache_policy::lru);
  CHECK(lru.blocks == 9);
  CHECK(lru.hit_blocks == 2);
  // Pool: r0 free list after release 3,2,1 ; r1 hits 1,2, allocates 1 block (evicts 3), free:
  // 4,2,1 ; r2 allocates 4's block ; r3 hits 1,2.
  const replay_stats pool = replay_trace(t, 3, cache_policy::pool);
  CHECK(pool.blocks == 9);
  CHECK(pool.hit_blocks == 4);
  CHECK(pool.evictions == 2);
  // Capacity 0 never hits; a request longer than the pool is partly cached.
  CHECK(replay_trace(t, 0, cache_policy::lru).hit_blocks == 0);
  CHECK(replay_trace(t, 0, cache_policy::pool).hit_blocks == 0);
  const std::vector<trace_request> big{{0, 5 * 512, 1, {1, 2, 3, 4, 5}}, {1, 512, 1, {1}}};
  CHECK(replay_trace(big, 2, cache_policy::pool).hit_blocks == 1);
}

TEST_CASE("prefix_trace: malformed lines give errors naming the file and line") {
  const std::string good = R"({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]})";
  SUBCASE("bad JSON") {
    const auto path = temp_trace("badjson", good + "\n" + good + "\n{\"timestamp\": 3,\n");
    const auto r = load_mooncake_trace(path);
    std::filesystem::remove(path);
    REQUIRE_FALSE(r.has_value());
    INFO(r.error());
    CHECK(r.error().find(path + ":3:") != std::string::npos);
    CHECK(r.error().find("JSON") != std::string::npos);
  }
  SUBCASE("missing hash_ids") {
    const auto path = temp_trace(
        "nohash", good + "\n\n" + R"({"timestamp": 1, "input_length": 10, "output_length": 1})" + "\n");
    const auto r = load_mooncake_trace(path);
    std::filesystem::remove(path);
    REQUIRE_FALSE(r.has_value());
    INFO(r.error());
    CHECK(r.error().find(path + ":3:") != std::string::npos);  // blank line 2 is skipped
    CHECK(r.error().find("hash_ids") != std::string::npos);
  }
  SUBCASE("mistyped fields") {
    const auto path = temp_trace(
        "types", R"({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": ["x"]})" "\n");
    const auto r = load_mooncake_trace(path);
    std::filesystem::remove(path);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().find(path + ":1:") != std::string::npos);
    const auto path2 = temp_trace("types2", "[1, 2]\n");
    const auto r2 = load_mooncake_trace(path2);
    std::filesystem::remove(path2);
    REQUIRE_FALSE(r2.has_value());
    CHECK(r2.error().find(path2 + ":1:") != std::string::npos);
    const auto path3 = temp_trace("types3", R"({"input_length": 1, "output_length": 1, "hash_ids": []})" "\n");
    const auto r3 = load_mooncake_trace(path3);
    std::filesystem::remove(path3);
    REQUIRE_FALSE(r3.has_value());
    CHECK(r3.error().find("timestamp") != std::string::npos);
  }
  SUBCASE("missing file") {
    const std::string path = "/nonexistent/shoal_no_such_trace.jsonl";
    const auto r = load_mooncake_trace(path);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().find(path) != std::string::npos);
  }
  SUBCASE("good file with a trailing blank line") {
    const auto path = temp_trace("good", good + "\n" + good + "\n\n");
    const auto r = load_mooncake_trace(path);
    std::filesystem::remove(path);
    REQUIRE(r.has_value());
    CHECK(r->size() == 2);
    CHECK((*r)[1].hash_ids == std::vector<int64_t>{0, 1});
  }
}
