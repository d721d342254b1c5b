// Mooncake trace loading and prefix-cache replay. The LRU policy is an O(1) list + hash map
// that follows the traces README definition exactly; the pool policy drives block_pool with
// hash ids as block keys, so the engine's eviction order (free list, tail-first release) is
// what gets measured.
#include "sim/prefix_trace.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <list>
#include <optional>
#include <unordered_map>

#include "kernels/assert.hpp"
#include "runtime/core/block_pool.hpp"

namespace shoal::sim {

using runtime::block_key;
using runtime::block_pool;

namespace {

std::string where(const std::string& path, int64_t line) {
  return path + ":" + std::to_string(line) + ": ";
}

// Reads an integer field; JSON floats with an integral value (e.g. 12.0) are accepted.
std::optional<int64_t> int_field(const nlohmann::json& row, const char* name, std::string& err) {
  const auto it = row.find(name);
  if (it == row.end()) {
    err = std::string("missing field \"") + name + "\"";
    return std::nullopt;
  }
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_number_float()) {
    const double d = it->get<double>();
    if (d == static_cast<double>(static_cast<int64_t>(d))) return static_cast<int64_t>(d);
  }
  err = std::string("field \"") + name + "\" is not an integer";
  return std::nullopt;
}

std::expected<trace_request, std::string> parse_row(const std::string& text) {
  nlohmann::json row = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (row.is_discarded()) return std::unexpected(std::string("invalid JSON"));
  if (!row.is_object()) return std::unexpected(std::string("row is not a JSON object"));
  trace_request req;
  std::string err;
  const auto ts = int_field(row, "timestamp", err);
  if (!ts) return std::unexpected(err);
  const auto in = int_field(row, "input_length", err);
  if (!in) return std::unexpected(err);
  const auto out = int_field(row, "output_length", err);
  if (!out) return std::unexpected(err);
  req.timestamp_ms = *ts;
  req.input_length = *in;
  req.output_length = *out;
  const auto ids = row.find("hash_ids");
  if (ids == row.end()) return std::unexpected(std::string("missing field \"hash_ids\""));
  if (!ids->is_array()) return std::unexpected(std::string("field \"hash_ids\" is not an array"));
  req.hash_ids.reserve(ids->size());
  for (const auto& h : *ids) {
    if (!h.is_number_integer())
      return std::unexpected(std::string("field \"hash_ids\" holds a non-integer"));
    req.hash_ids.push_back(h.get<int64_t>());
  }
  return req;
}

// Plain LRU over hash ids: front = most recently used.
class lru_cache {
 public:
  explicit lru_cache(int64_t capacity) : capacity_(capacity) {
    index_.reserve(static_cast<size_t>(std::min<int64_t>(capacity, 1 << 22)));
  }
  bool contains(int64_t id) const { return index_.contains(id); }
  // Inserts or touches `id` as most recently used, evicting the LRU entry when over capacity.
  void use(int64_t id) {
    if (const auto it = index_.find(id); it != index_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return;
    }
    order_.push_front(id);
    index_.emplace(id, order_.begin());
    if (static_cast<int64_t>(index_.size()) > capacity_) {
      index_.erase(order_.back());
      order_.pop_back();
      ++evictions_;
    }
  }
  uint64_t evictions() const { return evictions_; }

 private:
  int64_t capacity_;
  std::list<int64_t> order_;
  std::unordered_map<int64_t, std::list<int64_t>::iterator> index_;
  uint64_t evictions_ = 0;
};

replay_stats replay_lru(const std::vector<trace_request>& trace, int32_t capacity) {
  replay_stats st;
  lru_cache cache(capacity);
  for (const trace_request& req : trace) {
    size_t hits = 0;
    while (hits < req.hash_ids.size() && cache.contains(req.hash_ids[hits])) ++hits;
    for (const int64_t id : req.hash_ids) cache.use(id);
    ++st.requests;
    st.blocks += static_cast<int64_t>(req.hash_ids.size());
    st.hit_blocks += static_cast<int64_t>(hits);
  }
  st.evictions = cache.evictions();
  return st;
}

block_key trace_key(int64_t hash_id) { return block_key{static_cast<uint64_t>(hash_id), 0}; }

replay_stats replay_pool(const std::vector<trace_request>& trace, int32_t capacity) {
  replay_stats st;
  block_pool pool(capacity);
  std::vector<block_id> held;
  for (const trace_request& req : trace) {
    const auto& ids = req.hash_ids;
    held.clear();
    // Longest cached prefix.
    size_t hits = 0;
    for (; hits < ids.size(); ++hits) {
      const auto b = pool.lookup(trace_key(ids[hits]));
      if (!b) break;
      held.push_back(*b);
    }
    pool.touch(held);
    // The rest is recomputed into fresh blocks, as many as the pool can give.
    const auto missing = static_cast<int32_t>(ids.size() - hits);
    const auto fresh = pool.allocate(std::min(missing, pool.num_free()));
    for (size_t i = 0; i < fresh.size(); ++i) {
      pool.cache_block(fresh[i], trace_key(ids[hits + i]));
      held.push_back(fresh[i]);
    }
    // Request done: release tail first so the shared head blocks are evicted last.
    std::reverse(held.begin(), held.end());
    pool.release(held);
    ++st.requests;
    st.blocks += static_cast<int64_t>(ids.size());
    st.hit_blocks += static_cast<int64_t>(hits);
  }
  st.evictions = pool.evictions();
  return st;
}

}  // namespace

std::expected<std::vector<trace_request>, std::string> load_mooncake_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::unexpected(path + ": cannot open file");
  std::vector<trace_request> rows;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto row = parse_row(line);
    if (!row) return std::unexpected(where(path, line_no) + row.error());
    rows.push_back(std::move(*row));
  }
  if (in.bad()) return std::unexpected(where(path, line_no) + "read error");
  return rows;
}

replay_stats replay_trace(const std::vector<trace_request>& trace, int32_t capacity_blocks,
                          cache_policy policy) {
  SHOAL_ASSERT(capacity_blocks >= 0);
  switch (policy) {
    case cache_policy::lru: return replay_lru(trace, capacity_blocks);
    case cache_policy::pool: return replay_pool(trace, capacity_blocks);
  }
  SHOAL_ASSERT(false && "unknown cache_policy");
  return {};
}

}  // namespace shoal::sim
