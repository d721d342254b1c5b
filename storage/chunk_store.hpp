// The storage node's chunk store: opaque chunks keyed by (block key, chunk index) on a local
// directory, one file per chunk (layout and format in chunk_file.hpp). Writes are atomic (temp file,
// fsync, rename, directory fsync) and durable before put returns under sync_policy::always; open
// rebuilds the index by scanning and verifying every file. The store also holds the GC (LRU over a
// watermark, gc.cpp) and TTL (ttl.hpp) state, and leases that keep GC away from chunks in use.
// Thread-safe: one mutex guards the index; payload bytes are read and written outside it.
#pragma once

#include <cstdint>
#include <expected>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "storage/chunk_file.hpp"
#include "storage/ttl.hpp"

namespace shoal::storage {

enum class store_errc : uint8_t {
  not_found,        // no such chunk (or it has expired: expired chunks are never served)
  corrupt,          // the file failed its header/payload crc; removed, the bytes never served
  full,             // the configured capacity cannot take the chunk even after GC
  disk_full,        // the file system (or the simulated disk) returned ENOSPC; nothing was kept
  io,               // any other system call failure (detail names the call, path and errno)
  empty_chunk,      // put of zero bytes
  chunk_too_large,  // put over options.max_chunk_bytes
  bad_config,       // invalid options at open
};
const char* to_string(store_errc e);

struct store_error {
  store_errc code = store_errc::io;
  std::string detail;  // e.g. "write /x/chunks/ab/…: No space left on device"
};
std::string to_string(const store_error& e);

template <class T>
using store_result = std::expected<T, store_error>;

enum class sync_policy : uint8_t { always, never };

struct store_options {
  std::string root;                        // directory, created if absent
  uint64_t capacity_bytes = 0;             // payload bytes the store may hold (> 0)
  uint64_t max_chunk_bytes = 16ull << 20;  // largest payload put accepts
  sync_policy sync = sync_policy::always;
  double gc_high_watermark = 0.9;  // run_gc evicts once usage > high × capacity …
  double gc_low_watermark = 0.7;   // … until usage ≤ low × capacity
  ttl_policy ttl;
  std::function<int64_t()> now_ms;  // the only clock the store reads; required
  // Test fault: pretend the file system holds this many bytes in total (chunk files with headers,
  // temp files included); a write past it fails with ENOSPC after a partial write. 0 = off.
  uint64_t simulated_disk_bytes = 0;
};

// Counters since open (except chunks/usage/capacity, which are the current state).
struct store_stats {
  uint64_t chunks = 0, usage_bytes = 0, capacity_bytes = 0;
  uint64_t puts = 0, put_failures = 0, gets = 0, get_hits = 0, removes = 0;
  uint64_t gc_runs = 0, evicted_chunks = 0, evicted_bytes = 0;
  uint64_t sweeps = 0, expired_chunks = 0, expired_bytes = 0;
  uint64_t corrupt_removed = 0;  // files that failed verification (at open or on get)
  uint64_t temp_removed = 0;     // leftover temp files removed at open
  double put_seconds = 0;        // summed over the successful puts (fsync included): latency = / puts
  double get_seconds = 0;        // summed over the gets that found their chunk: latency = / get_hits
};

class chunk_store;

// While a lease on a key lives, GC and the TTL sweeper leave that chunk alone (get and put hold
// one internally). Movable, not copyable; must not outlive its store.
class lease {
 public:
  lease() = default;
  lease(lease&& o) noexcept : store_(o.store_), key_(o.key_) { o.store_ = nullptr; }
  lease& operator=(lease&& o) noexcept;
  lease(const lease&) = delete;
  lease& operator=(const lease&) = delete;
  ~lease() { release(); }
  void release();
  bool held() const { return store_ != nullptr; }
  const chunk_key& key() const { return key_; }

 private:
  friend class chunk_store;
  lease(chunk_store* s, chunk_key k) : store_(s), key_(k) {}
  chunk_store* store_ = nullptr;
  chunk_key key_;
};

// Per-chunk metadata the store keeps in memory.
struct chunk_meta {
  uint64_t payload_bytes = 0;
  traffic_class cls = traffic_class::agent;
  int64_t put_ms = 0;
  int64_t last_read_ms = 0;  // = put_ms until the first read; reset to put_ms on restart
  uint64_t generation = 0;   // bumped by every put of the key: tells a stale reader apart
};

class chunk_store {
 public:
  // Creates the directory layout, removes leftover temp files, verifies every chunk file (corrupt
  // ones are deleted and counted) and rebuilds the index.
  static store_result<std::unique_ptr<chunk_store>> open(store_options opts);
  ~chunk_store();
  chunk_store(const chunk_store&) = delete;
  chunk_store& operator=(const chunk_store&) = delete;

  // Stores (or replaces) a chunk; on success it is on disk under its final name (and durable under
  // sync_policy::always). On failure nothing new is visible and no temp file remains.
  store_result<void> put(const chunk_key& key, std::span<const std::byte> bytes, traffic_class cls);
  // The payload, after verifying both crcs; updates last-read time. An expired chunk is not_found.
  store_result<std::vector<std::byte>> get(const chunk_key& key);
  // One flag per key: stored and not expired. No disk access, does not count as a read.
  std::vector<bool> exists(std::span<const chunk_key> keys) const;
  store_result<void> remove(const chunk_key& key);
  std::optional<chunk_meta> meta(const chunk_key& key) const;

  lease acquire(const chunk_key& key);

  // GC (gc.cpp): if usage > high watermark, evicts unleased chunks in eviction order until usage ≤
  // low watermark. Returns the number evicted. Counts a run only when it starts evicting.
  uint64_t run_gc();
  // TTL (gc.cpp): removes every expired, unleased chunk. Returns the number removed.
  uint64_t sweep();
  // The chunks in eviction order (first = next victim), leased ones included.
  std::vector<chunk_key> eviction_order() const;

  uint64_t usage_bytes() const;
  uint64_t capacity_bytes() const { return opts_.capacity_bytes; }
  bool over_high_watermark() const;
  store_stats stats() const;
  const store_options& options() const { return opts_; }
  void check_invariants() const;  // asserts index ↔ LRU order ↔ usage consistency
  // Test fault control: change the simulated disk size at run time (0 = off).
  void set_simulated_disk_bytes(uint64_t bytes);

 private:
  friend class lease;
  using lru_key = std::tuple<int64_t, int64_t, chunk_key>;  // (last_read_ms, put_ms, key)
  static lru_key lru_of(const chunk_key& k, const chunk_meta& m) {
    return {m.last_read_ms, m.put_ms, k};
  }

  explicit chunk_store(store_options opts);
  store_result<void> scan();
  void release_lease(const chunk_key& key);
  void unlease_locked(const chunk_key& key);
  int64_t now() const { return opts_.now_ms(); }
  bool expired_locked(const chunk_meta& m, int64_t now_ms) const;
  bool leased_locked(const chunk_key& k) const { return leases_.contains(k); }
  // Removes the entry and its file; the caller holds mu_.
  void drop_locked(const chunk_key& k);
  void insert_locked(const chunk_key& k, const chunk_meta& m);
  // Evicts unleased chunks in LRU order until usage ≤ target_bytes (or nothing evictable is left).
  uint64_t evict_locked(uint64_t target_bytes);
  uint64_t sweep_locked(int64_t now_ms);
  store_result<void> write_temp(const std::string& tmp, std::span<const std::byte> header,
                                std::span<const std::byte> payload);
  store_result<void> reserve_locked(uint64_t bytes, std::unique_lock<std::mutex>& lk);

  store_options opts_;
  mutable std::mutex mu_;
  std::map<chunk_key, chunk_meta> index_;
  std::set<lru_key> lru_;                   // eviction order
  std::map<chunk_key, uint32_t> leases_;    // key → live lease count
  uint64_t usage_bytes_ = 0;                // payload bytes of indexed chunks
  uint64_t reserved_bytes_ = 0;             // payload bytes of puts in flight
  uint64_t disk_bytes_ = 0;                 // file bytes incl. headers and temps (simulated disk)
  uint64_t next_generation_ = 1;
  uint64_t temp_seq_ = 0;
  store_stats stats_;
};

}  // namespace shoal::storage
