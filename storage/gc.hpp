// Garbage collection of the chunk store: the eviction rule and an optional background worker.
// The store's own run_gc()/sweep() (defined in gc.cpp) do the work under the store's mutex; the
// worker only calls them periodically, so tests drive GC directly and deterministically.
//
// Eviction order (exact): ascending (last_read_ms, put_ms, key), key ordered (hi, lo, index).
// last_read_ms starts at put_ms (a put counts as a use) and is reset to put_ms on restart (reads
// are not persisted). Leased chunks are skipped, not reordered. run_gc() starts only when usage >
// floor(high × capacity) and stops as soon as usage ≤ floor(low × capacity).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "storage/chunk_store.hpp"

namespace shoal::storage {

// A storage node's put: GC first when usage is over the high watermark (room for the chunk),
// the put, then GC again when the put crossed it.
store_result<void> put_collecting(chunk_store& store, const chunk_key& key, std::span<const std::byte> bytes,
                                  traffic_class cls);

// Every interval: sweep() expired chunks, then run_gc(). wake() runs a pass now (e.g. after a put
// that crossed the high watermark). Not copyable; stop() (or the destructor) joins the thread.
class gc_worker {
 public:
  gc_worker(chunk_store& store, std::chrono::milliseconds interval);
  ~gc_worker() { stop(); }
  gc_worker(const gc_worker&) = delete;
  gc_worker& operator=(const gc_worker&) = delete;

  void start();
  void stop();
  void wake();
  uint64_t passes() const;

 private:
  void loop();

  chunk_store& store_;
  std::chrono::milliseconds interval_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, wake_ = false;
  uint64_t passes_ = 0;
  std::thread thread_;
};

}  // namespace shoal::storage
