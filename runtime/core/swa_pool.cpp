// Live-slot accounting and the snapshot LRU of the SWA cache, with MXFP8 or fp32 storage.
#include "runtime/core/swa_pool.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/assert.hpp"
#include "model/kv_format.hpp"

namespace shoal::runtime {

swa_pool::swa_pool(int64_t max_slots, int64_t max_snapshots, int64_t streams, int64_t entry_dim,
                   int64_t window, swa_storage storage, std::shared_ptr<swa_store> store)
    : max_slots_(max_slots), streams_(streams), entry_dim_(entry_dim), window_(window), storage_(storage),
      store_(store ? std::move(store) : std::make_shared<swa_store>(max_snapshots, snapshot_bytes())) {
  SHOAL_ASSERT(store_->slot_bytes() >= snapshot_bytes() || store_->capacity() == 0);
}

void swa_pool::acquire() {
  SHOAL_ASSERT(can_acquire());
  ++live_;
}

void swa_pool::release() {
  SHOAL_ASSERT(live_ > 0);
  --live_;
}

size_t swa_pool::entry_bytes() const {
  return storage_ == swa_storage::fp32 ? sizeof(float) * entry_dim_ : model::mxfp8_bytes(entry_dim_);
}

size_t swa_snapshot_bytes(const model::model_config& c, swa_storage storage) {
  const size_t entry = storage == swa_storage::fp32 ? sizeof(float) * static_cast<size_t>(c.entry_dim())
                                                    : model::mxfp8_bytes(c.entry_dim());
  return swa_header_bytes + static_cast<size_t>(c.encoder_layers() * c.window()) * entry;
}

size_t swa_pool::snapshot_bytes() const { return snapshot_bytes(window_); }

size_t swa_pool::snapshot_bytes(int64_t p) const {
  return swa_header_bytes + static_cast<size_t>(streams_ * std::min(p, window_)) * entry_bytes();
}

// A snapshot's header: "SWA1", the storage, then streams, entry_dim and positions (uint32
// each): a reader of another shape or storage sees a miss, never misreads the entries.
void swa_pool::write_header(int64_t positions, uint8_t* out) const {
  const uint32_t v[3] = {static_cast<uint32_t>(streams_), static_cast<uint32_t>(entry_dim_),
                         static_cast<uint32_t>(positions)};
  std::memcpy(out, "SWA1", 4);
  out[4] = static_cast<uint8_t>(storage_);
  std::memset(out + 5, 0, 3);
  std::memcpy(out + 8, v, sizeof v);
}

bool swa_pool::header_fits(std::span<const uint8_t> bytes, int64_t p) const {
  uint8_t want[swa_header_bytes];
  write_header(std::min(p, window_), want);
  return bytes.size() == snapshot_bytes(p) && std::memcmp(bytes.data(), want, swa_header_bytes) == 0;
}

swa_stats swa_pool::stats() const {
  swa_stats s = stats_;
  s.evictions = store_->stats().evictions;
  return s;
}

void swa_pool::save(const block_key& key, const model::sequence_cache& cache, int64_t p) {
  if (store_->capacity() == 0) return;
  if (store_->contains(key)) {  // already there: refresh
    store_->read(key, p, [](std::span<const uint8_t>) {});
    return;
  }
  int64_t lo = std::max<int64_t>(0, p - window_);
  SHOAL_ASSERT(cache.ring_tokens >= p - lo && cache.computed >= p);
  SHOAL_ASSERT(cache.computed - cache.ring_tokens <= lo);  // the ring still holds [lo, p)
  scratch_.resize(snapshot_bytes(p));
  write_header(p - lo, scratch_.data());
  uint8_t* out = scratch_.data() + swa_header_bytes;
  std::vector<float> e(static_cast<size_t>(entry_dim_ + 1));
  for (int64_t st = 0; st < streams_; ++st)
    for (int64_t pos = lo; pos < p; ++pos, out += entry_bytes()) {
      cache.ring_read(st, pos, e.data());
      if (storage_ == swa_storage::fp32) std::memcpy(out, e.data(), entry_bytes());
      else model::mxfp8_encode(e.data(), entry_dim_, out);
    }
  store_->put(key, p, scratch_);
  ++stats_.saves;
}

bool swa_pool::put_encoded(const block_key& key, int64_t p, std::span<const uint8_t> bytes) {
  if (p <= 0 || store_->capacity() == 0) return false;
  if (!header_fits(bytes, p)) {
    ++stats_.shape_misses;
    return false;
  }
  store_->put(key, p, bytes);
  return true;
}

bool swa_pool::restore(const block_key& key, model::sequence_cache& cache, int64_t p) {
  int64_t lo = std::max<int64_t>(0, p - window_);
  SHOAL_ASSERT(cache.ring_tokens >= p - lo);
  bool sized = true;
  bool found = store_->read(key, p, [&](std::span<const uint8_t> bytes) {
    if (!header_fits(bytes, p)) return void(sized = false);
    const uint8_t* in = bytes.data() + swa_header_bytes;
    std::vector<float> e(static_cast<size_t>(entry_dim_ + 1));
    for (int64_t st = 0; st < streams_; ++st)
      for (int64_t pos = lo; pos < p; ++pos, in += entry_bytes()) {
        if (storage_ == swa_storage::fp32) std::memcpy(e.data(), in, entry_bytes());
        else model::mxfp8_decode(in, entry_dim_, e.data());
        e[static_cast<size_t>(entry_dim_)] = 0.0f;  // compress logit: P is run-aligned, so no partial run needs it
        cache.ring_write(st, pos, e.data());  // in the ring's own form
      }
  });
  if (!found || !sized) {
    ++stats_.misses;
    if (!sized) ++stats_.shape_misses;
    return false;
  }
  ++stats_.hits;
  return true;
}

}  // namespace shoal::runtime
