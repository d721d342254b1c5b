#include "runtime/vision/embedding_cache.hpp"

namespace shoal::runtime {

embedding_cache::rows embedding_cache::get(const key& k) {
  auto it = index_.find(k);
  if (it == index_.end()) {
    ++stats_.misses;
    return nullptr;
  }
  ++stats_.hits;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->r;
}

void embedding_cache::put(const key& k, rows r) {
  if (!r) return;
  const auto bytes = static_cast<int64_t>(r->size() * sizeof(float));
  if (auto it = index_.find(k); it != index_.end()) {
    bytes_ -= it->second->bytes;
    lru_.erase(it->second);
    index_.erase(it);
  }
  if (bytes > capacity_) return;
  lru_.push_front({k, std::move(r), bytes});
  index_[k] = lru_.begin();
  bytes_ += bytes;
  while (bytes_ > capacity_) {
    const entry& last = lru_.back();
    bytes_ -= last.bytes;
    index_.erase(last.k);
    lru_.pop_back();
    ++stats_.evictions;
  }
}

embedding_cache_stats embedding_cache::stats() const {
  embedding_cache_stats s = stats_;
  s.entries = static_cast<int64_t>(lru_.size());
  s.bytes = bytes_;
  s.capacity_bytes = capacity_;
  return s;
}

}  // namespace shoal::runtime
