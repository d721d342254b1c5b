// The machine's SWA slot pool: a fixed arena, an LRU of slot indices and the change log.
#include "runtime/core/swa_store.hpp"

#include <cstring>
#include <utility>

#include "kernels/assert.hpp"

namespace shoal::runtime {

swa_store::swa_store(int64_t capacity, size_t slot_bytes)
    : capacity_(std::max<int64_t>(0, capacity)), slot_bytes_(slot_bytes),
      arena_(new std::byte[std::max<size_t>(1, static_cast<size_t>(std::max<int64_t>(0, capacity)) * slot_bytes)]),
      slots_(static_cast<size_t>(capacity_)) {
  for (int64_t i = capacity_ - 1; i >= 0; --i) free_.push_back(i);
}

bool swa_store::contains(const block_key& key) const {
  std::lock_guard lock(mu_);
  return index_.contains(key);
}

void swa_store::put(const block_key& key, int64_t p, std::span<const uint8_t> bytes) {
  SHOAL_ASSERT(bytes.size() <= slot_bytes_);
  std::lock_guard lock(mu_);
  if (capacity_ == 0) return;
  if (auto it = index_.find(key); it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  if (free_.empty()) {  // evict the least recently used
    const int64_t victim = lru_.back();
    lru_.pop_back();
    index_.erase(slots_[static_cast<size_t>(victim)].key);
    changes_.evicted.push_back(slots_[static_cast<size_t>(victim)].key);
    std::erase(changes_.added, slots_[static_cast<size_t>(victim)].key);
    free_.push_back(victim);
    ++stats_.evictions;
  }
  const int64_t s = free_.back();
  free_.pop_back();
  slots_[static_cast<size_t>(s)] = {key, p, bytes.size()};
  if (!bytes.empty()) std::memcpy(arena_.get() + static_cast<size_t>(s) * slot_bytes_, bytes.data(), bytes.size());
  lru_.push_front(s);
  index_[key] = lru_.begin();
  changes_.added.push_back(key);
  ++stats_.puts;
}

bool swa_store::read(const block_key& key, int64_t p, const std::function<void(std::span<const uint8_t>)>& f) {
  std::lock_guard lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  const slot& s = slots_[static_cast<size_t>(*it->second)];
  if (p >= 0 && s.p != p) return false;
  lru_.splice(lru_.begin(), lru_, it->second);
  const auto* base = reinterpret_cast<const uint8_t*>(arena_.get()) + static_cast<size_t>(*it->second) * slot_bytes_;
  f({base, s.length});
  return true;
}

std::optional<remote_memory> swa_store::describe(const block_key& key, const registered_memory& reg) {
  std::lock_guard lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second);
  ++stats_.described;
  return reg.describe(static_cast<uint64_t>(*it->second) * slot_bytes_, slots_[static_cast<size_t>(*it->second)].length);
}

swa_changes swa_store::take_changes() {
  std::lock_guard lock(mu_);
  return std::exchange(changes_, {});
}

std::vector<block_key> swa_store::keys() const {
  std::lock_guard lock(mu_);
  std::vector<block_key> out;
  out.reserve(index_.size());
  for (int64_t s : lru_) out.push_back(slots_[static_cast<size_t>(s)].key);
  return out;
}

swa_store_stats swa_store::stats() const {
  std::lock_guard lock(mu_);
  swa_store_stats s = stats_;
  s.slots = static_cast<int64_t>(index_.size());
  s.capacity = capacity_;
  return s;
}

}  // namespace shoal::runtime
