// The engine's second cache tier (the KV-cache storage cluster) as the cache manager sees
// it: keyed by the same prefix hash chain as the local pool. Reads never run on the step
// loop: start_fetch hands the tier the keys that would extend a request's local hit and the
// pool blocks reserved for them, and returns at once; the tier looks the keys up and writes
// the leading run it holds straight into those blocks from its own threads, then marks the
// remote_fetch done. The request waits meanwhile (request_status::waiting_for_remote_kv) and
// the engine keeps stepping the others. Any failure is a miss: the engine recomputes, it
// never reads data the tier could not verify. Writes are queued (store_async) and never
// block either. actors/ implements it over the storage nodes (kv_block_store).
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "model/kv_format.hpp"
#include "runtime/core/block_pool.hpp"
#include "runtime/base/one_shot.hpp"
#include "runtime/base/traffic_class.hpp"

namespace shoal::runtime {

// One remote read in flight, shared by the cache manager (polls it between steps, may
// abandon it) and the tier (fills it from its own thread). The tier writes into the
// destinations only until it calls complete(); the cache manager keeps them reserved until
// done() is true, also after it gave up waiting.
struct fetched_blocks {
  size_t listed = 0;  // leading blocks the tier listed at lookup
  size_t blocks = 0;  // of those, written and verified
  bool other_format = false;  // it stopped at a block stored in another KV format
};

class remote_fetch : public one_shot<fetched_blocks> {
 public:
  // Valid once done(): leading blocks the tier listed at lookup / wrote and verified; why it
  // stopped short of `listed` (error(), "" when it did not).
  size_t listed() const { return value().listed; }
  size_t blocks() const { return value().blocks; }
  bool other_format() const { return value().other_format; }
  // The tier, exactly once.
  void complete(size_t listed, size_t blocks, std::string error = {}, bool other_format = false) {
    set({listed, blocks, other_format}, std::move(error));
  }
};

class remote_blocks {
 public:
  virtual ~remote_blocks() = default;
  // Starts reading the longest leading run of `keys` the tier holds, keys[i] into dsts[i]
  // (exactly dsts[i].size() bytes of KV format `f`; a block stored in another format or of
  // another size is a miss, said in the fetch). Never blocks.
  virtual std::shared_ptr<remote_fetch> start_fetch(std::vector<block_key> keys, std::vector<std::span<std::byte>> dsts,
                                                    const model::kv_format& f) = 0;
  // Offers a computed block (its bytes in KV format `f`, which the stored copy names) for
  // writing under a traffic class (the storage side's TTL); never blocks the step loop: false
  // when dropped (queue full). `src` is copied before the call returns.
  virtual bool store_async(const block_key& key, std::span<const std::byte> src, const model::kv_format& f,
                           traffic_class cls) = 0;
};

}  // namespace shoal::runtime
