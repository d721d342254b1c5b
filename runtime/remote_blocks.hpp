// The KV-cache storage cluster as the engine's cache manager sees it: a second tier behind
// the local block pool, keyed by the same prefix hash chain. On admission the cache manager
// extends a local prefix hit with the blocks the remote tier holds (fetched into free blocks
// of the pool, then registered as if computed); committed full blocks are offered to it for
// an asynchronous write. Any failure is a miss: the engine recomputes, it never reads data it
// could not verify. actors/ implements it over the storage nodes (kv_block_store).
#pragma once

#include <cstddef>
#include <span>

#include "runtime/block_pool.hpp"

namespace shoal::runtime {

class remote_blocks {
 public:
  virtual ~remote_blocks() = default;
  // How many leading keys of `keys` the remote tier holds (a prefix; 0 on any failure).
  virtual size_t lookup(std::span<const block_key> keys) = 0;
  // Reads block `key` into `dst` (exactly dst.size() floats); false on a miss or any failure.
  virtual bool fetch(const block_key& key, std::span<float> dst) = 0;
  // Reads keys[i] into dsts[i] for a leading run of keys; returns its length (the first miss
  // or failure ends it). The default fetches one by one; a tier may have them all in flight.
  virtual size_t fetch_many(std::span<const block_key> keys, std::span<const std::span<float>> dsts) {
    size_t n = 0;
    while (n < keys.size() && n < dsts.size() && fetch(keys[n], dsts[n])) ++n;
    return n;
  }
  // Offers a computed block for writing under a traffic class (0 agent, 1 chat: the storage
  // side's TTL); never blocks the step loop: false when dropped (queue full). `src` is copied
  // before the call returns.
  virtual bool store_async(const block_key& key, std::span<const float> src, int traffic_class) = 0;
};

}  // namespace shoal::runtime
