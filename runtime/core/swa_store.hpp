// The SWA-cache tier of one machine (MISSION.md "SWA cache"): a host-memory pool of
// fixed-size slots, one encoder window snapshot each (the entries of positions [P − W, P) of
// every encoder layer, MXFP8 or fp32 as the engine stores them), keyed by the prefix block
// key at P, LRU when full. The engines of the machine save into it and restore from it on
// their step loops; its swa_store_actor describes slots to other machines, which read them
// with the transport (one registration covers the whole pool), and reports what it added or
// evicted to the cluster's directory. Thread-safe: one mutex, held for a slot copy at most.
//
// remote_swa is the engine's view of the other machines' stores: start a lookup + read of
// the deepest of a list of keys some other machine holds; never blocks the step loop.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/core/block_pool.hpp"
#include "runtime/base/transport.hpp"

namespace shoal::runtime {

// What a store added and evicted since the directory last heard from it.
struct swa_changes {
  std::vector<block_key> added, evicted;
  bool empty() const { return added.empty() && evicted.empty(); }
};

struct swa_store_stats {
  int64_t slots = 0, capacity = 0;
  uint64_t puts = 0, evictions = 0, described = 0;
};

class swa_store {
 public:
  // capacity: slots (≥ 0; 0 keeps nothing); slot_bytes: the largest snapshot.
  swa_store(int64_t capacity, size_t slot_bytes);
  swa_store(const swa_store&) = delete;
  swa_store& operator=(const swa_store&) = delete;

  int64_t capacity() const { return capacity_; }
  size_t slot_bytes() const { return slot_bytes_; }
  // The whole pool, for one transport registration (its bytes change under the lock only).
  std::span<const std::byte> memory() const { return {arena_.get(), arena_bytes()}; }

  bool contains(const block_key& key) const;
  // Stores `bytes` (≤ slot_bytes) as the snapshot at position p for `key`, evicting the least
  // recently used slot when full; a key already held is only refreshed.
  void put(const block_key& key, int64_t p, std::span<const uint8_t> bytes);
  // Calls `f` with the slot's bytes (under the lock) when `key` is held at position p (any
  // position when p < 0).
  bool read(const block_key& key, int64_t p, const std::function<void(std::span<const uint8_t>)>& f);
  // The slot's range in `reg` (a registration of memory()), checksummed under the lock so a
  // reader sees either these bytes or a checksum error; nullopt when not held.
  std::optional<remote_memory> describe(const block_key& key, const registered_memory& reg);
  // Changes since the last call (the directory's deltas).
  swa_changes take_changes();
  // Every key held (a full report for a directory that restarted).
  std::vector<block_key> keys() const;
  swa_store_stats stats() const;

 private:
  size_t arena_bytes() const { return static_cast<size_t>(capacity_) * slot_bytes_; }
  struct slot {
    block_key key;
    int64_t p = 0;
    size_t length = 0;
  };
  int64_t capacity_;
  size_t slot_bytes_;
  std::unique_ptr<std::byte[]> arena_;  // (capacity, slot_bytes), pages touched when written
  mutable std::mutex mu_;
  std::vector<slot> slots_;
  std::list<int64_t> lru_;  // slot indices, front = most recently used
  std::unordered_map<block_key, std::list<int64_t>::iterator, block_key_hash> index_;
  std::vector<int64_t> free_;
  swa_changes changes_;
  swa_store_stats stats_;
};

// One lookup + read of a slot from another machine, shared by the cache manager (polls it,
// may drop it) and the tier (fills it from its own thread).
struct fetched_slot {
  int64_t index = -1;  // of the key whose slot arrived (−1: none held elsewhere, or failed)
  std::vector<uint8_t> bytes;
};

class slot_fetch : public one_shot<fetched_slot> {
 public:
  // Valid once done(): the index of the key whose slot arrived (−1: no other machine holds
  // one, or it failed: see error()), its bytes, and the time from start to completion.
  int64_t index() const { return value().index; }
  const std::vector<uint8_t>& bytes() const { return value().bytes; }
  // The tier, exactly once.
  void complete(int64_t index, std::vector<uint8_t> bytes, std::string error = {}) {
    const int64_t at = error.empty() ? index : -1;
    set({at, std::move(bytes)}, std::move(error));
  }
};

class remote_swa {
 public:
  virtual ~remote_swa() = default;
  // Starts finding the deepest of `keys` (prefix order) whose slot another machine holds and
  // reading that slot (at most `max_bytes`). Never blocks.
  virtual std::shared_ptr<slot_fetch> start_fetch(std::vector<block_key> keys, size_t max_bytes) = 0;
};

}  // namespace shoal::runtime
