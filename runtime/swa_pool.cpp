// Live-slot accounting and the snapshot LRU of the SWA cache, with MXFP8 or fp32 storage.
#include "runtime/swa_pool.hpp"

#include <cstring>

#include "kernels/assert.hpp"
#include "kernels/cpu/mxfp8.hpp"

namespace shoal::runtime {

swa_pool::swa_pool(int64_t max_slots, int64_t max_snapshots, int64_t streams, int64_t entry_dim,
                   int64_t window, swa_storage storage)
    : max_slots_(max_slots), max_snapshots_(max_snapshots), streams_(streams),
      entry_dim_(entry_dim), window_(window), storage_(storage) {}

void swa_pool::acquire() {
  SHOAL_ASSERT(can_acquire());
  ++live_;
}

void swa_pool::release() {
  SHOAL_ASSERT(live_ > 0);
  --live_;
}

size_t swa_pool::entry_bytes() const {
  return storage_ == swa_storage::fp32 ? sizeof(float) * entry_dim_ : kernels::mxfp8_bytes(entry_dim_);
}

size_t swa_pool::snapshot_bytes() const {
  return static_cast<size_t>(streams_ * window_) * entry_bytes();
}

void swa_pool::save(const block_key& key, const model::sequence_cache& cache, int64_t p) {
  if (max_snapshots_ == 0) return;
  if (auto it = index_.find(key); it != index_.end()) {  // already there: refresh
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  int64_t lo = std::max<int64_t>(0, p - window_);
  SHOAL_ASSERT(cache.ring_tokens >= p - lo && cache.computed >= p);
  SHOAL_ASSERT(cache.computed - cache.ring_tokens <= lo);  // the ring still holds [lo, p)
  snapshot s{key, p, std::vector<uint8_t>(static_cast<size_t>(streams_ * (p - lo)) * entry_bytes())};
  uint8_t* out = s.bytes.data();
  for (int64_t st = 0; st < streams_; ++st)
    for (int64_t pos = lo; pos < p; ++pos, out += entry_bytes()) {
      const float* e = cache.ring_entry(st, pos);
      if (storage_ == swa_storage::fp32) std::memcpy(out, e, entry_bytes());
      else kernels::mxfp8_encode(e, entry_dim_, out);
    }
  lru_.push_front(std::move(s));
  index_[key] = lru_.begin();
  ++stats_.saves;
  while (static_cast<int64_t>(lru_.size()) > max_snapshots_) {
    index_.erase(lru_.back().key);
    lru_.pop_back();
    ++stats_.evictions;
  }
}

bool swa_pool::restore(const block_key& key, model::sequence_cache& cache, int64_t p) {
  auto it = index_.find(key);
  if (it == index_.end() || it->second->p != p) {
    ++stats_.misses;
    return false;
  }
  lru_.splice(lru_.begin(), lru_, it->second);
  const snapshot& s = *it->second;
  int64_t lo = std::max<int64_t>(0, p - window_);
  SHOAL_ASSERT(cache.ring_tokens >= p - lo);
  const uint8_t* in = s.bytes.data();
  for (int64_t st = 0; st < streams_; ++st)
    for (int64_t pos = lo; pos < p; ++pos, in += entry_bytes()) {
      float* e = cache.ring_entry(st, pos);
      if (storage_ == swa_storage::fp32) std::memcpy(e, in, entry_bytes());
      else kernels::mxfp8_decode(in, entry_dim_, e);
      e[entry_dim_] = 0.0f;  // compress logit: P is run-aligned, so no partial run needs it
    }
  ++stats_.hits;
  return true;
}

}  // namespace shoal::runtime
