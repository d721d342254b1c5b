// The image-embedding cache: encoder rows keyed by the image's content hash, bounded in
// bytes, least recently used out first. A repeated image skips the encoder; the prefix cache
// (keys carry the same hash) usually skips even this, until its blocks are evicted.
#pragma once

#include <array>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <vector>

namespace shoal::runtime {

struct embedding_cache_stats {
  uint64_t hits = 0, misses = 0, evictions = 0;
  int64_t entries = 0, bytes = 0, capacity_bytes = 0;
  bool operator==(const embedding_cache_stats&) const = default;
};

class embedding_cache {
 public:
  using key = std::array<uint64_t, 2>;
  using rows = std::shared_ptr<const std::vector<float>>;

  explicit embedding_cache(int64_t capacity_bytes) : capacity_(capacity_bytes) {}

  // The rows of `k` (now the most recently used), or null (a miss, counted).
  rows get(const key& k);
  // Whether `k` is held (not counted, not made more recent).
  bool contains(const key& k) const { return index_.contains(k); }
  // Stores rows for `k` and evicts the least recently used entries beyond the capacity; an
  // entry larger than the whole capacity is not kept. Rows already held by callers stay valid.
  void put(const key& k, rows r);
  embedding_cache_stats stats() const;

 private:
  struct entry {
    key k;
    rows r;
    int64_t bytes = 0;
  };
  int64_t capacity_;
  int64_t bytes_ = 0;
  std::list<entry> lru_;  // front: most recent
  std::map<key, std::list<entry>::iterator> index_;
  embedding_cache_stats stats_;
};

}  // namespace shoal::runtime
