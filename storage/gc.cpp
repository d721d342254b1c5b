// LRU-over-watermark GC and the TTL sweep of the chunk store (rule in gc.hpp), and the background
// worker that runs them. Eviction walks the store's ordered LRU set, so the victim order is exactly
// the set order; no clock is read here except the store's injectable one.
#include "storage/gc.hpp"

#include "kernels/assert.hpp"

namespace shoal::storage {

uint64_t chunk_store::evict_locked(uint64_t target_bytes) {
  uint64_t evicted = 0;
  for (auto it = lru_.begin(); it != lru_.end() && usage_bytes_ > target_bytes;) {
    const chunk_key k = std::get<2>(*it);
    ++it;  // drop_locked erases the current element
    if (leased_locked(k)) continue;
    const uint64_t bytes = index_.at(k).payload_bytes;
    drop_locked(k);
    ++stats_.evicted_chunks;
    stats_.evicted_bytes += bytes;
    ++evicted;
  }
  return evicted;
}

uint64_t chunk_store::run_gc() {
  std::lock_guard lk(mu_);
  const auto cap = double(opts_.capacity_bytes);
  if (usage_bytes_ <= uint64_t(opts_.gc_high_watermark * cap)) return 0;
  ++stats_.gc_runs;
  return evict_locked(uint64_t(opts_.gc_low_watermark * cap));
}

bool chunk_store::over_high_watermark() const {
  std::lock_guard lk(mu_);
  return usage_bytes_ > uint64_t(opts_.gc_high_watermark * double(opts_.capacity_bytes));
}

std::vector<chunk_key> chunk_store::eviction_order() const {
  std::lock_guard lk(mu_);
  std::vector<chunk_key> out;
  out.reserve(lru_.size());
  for (const auto& e : lru_) out.push_back(std::get<2>(e));
  return out;
}

uint64_t chunk_store::sweep_locked(int64_t now_ms) {
  ++stats_.sweeps;
  std::vector<chunk_key> victims;
  for (const auto& [k, m] : index_)
    if (expired_locked(m, now_ms) && !leased_locked(k)) victims.push_back(k);
  for (const chunk_key& k : victims) {
    stats_.expired_bytes += index_.at(k).payload_bytes;
    ++stats_.expired_chunks;
    drop_locked(k);
  }
  return victims.size();
}

uint64_t chunk_store::sweep() {
  std::lock_guard lk(mu_);
  return sweep_locked(now());
}

gc_worker::gc_worker(chunk_store& store, std::chrono::milliseconds interval)
    : store_(store), interval_(interval) {
  SHOAL_ASSERT(interval.count() > 0);
}

void gc_worker::start() {
  std::lock_guard lk(mu_);
  SHOAL_ASSERT(!thread_.joinable());
  stop_ = false;
  thread_ = std::thread([this] { loop(); });
}

void gc_worker::stop() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void gc_worker::wake() {
  {
    std::lock_guard lk(mu_);
    wake_ = true;
  }
  cv_.notify_all();
}

uint64_t gc_worker::passes() const {
  std::lock_guard lk(mu_);
  return passes_;
}

void gc_worker::loop() {
  std::unique_lock lk(mu_);
  while (!stop_) {
    cv_.wait_for(lk, interval_, [this] { return stop_ || wake_; });
    if (stop_) break;
    wake_ = false;
    lk.unlock();
    store_.sweep();
    store_.run_gc();
    lk.lock();
    ++passes_;
  }
}

store_result<void> put_collecting(chunk_store& store, const chunk_key& key, std::span<const std::byte> bytes,
                                  traffic_class cls) {
  if (store.over_high_watermark()) store.run_gc();
  auto r = store.put(key, bytes, cls);
  if (r && store.over_high_watermark()) store.run_gc();
  return r;
}

}  // namespace shoal::storage
