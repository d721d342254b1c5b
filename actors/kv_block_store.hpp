// runtime::remote_blocks over the storage cluster: the engine's second cache tier. Lookups
// and fetches are synchronous kv_client calls (bounded by its timeout; a fetch_many has all
// its blocks in flight at once); writes go through a bounded queue drained by one thread in
// batches of up to `write_batch` blocks in flight, so a step never waits on storage (a full
// queue drops the write and counts it). The node list follows the membership (subscribe an
// updater).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "actors/kv_client.hpp"
#include "runtime/remote_blocks.hpp"

namespace shoal::actors {

class kv_block_store final : public runtime::remote_blocks {
 public:
  // queue_blocks: writes waiting at most.
  explicit kv_block_store(std::unique_ptr<kv_client> client, size_t queue_blocks = 256, size_t write_batch = 8);
  ~kv_block_store() override;

  size_t lookup(std::span<const runtime::block_key> keys) override;
  bool fetch(const runtime::block_key& key, std::span<float> dst) override;
  size_t fetch_many(std::span<const runtime::block_key> keys, std::span<const std::span<float>> dsts) override;
  bool store_async(const runtime::block_key& key, std::span<const float> src, int traffic_class) override;

  void set_nodes(std::vector<storage_endpoint> nodes);
  // Blocks written, failed, dropped so far; waits (bounded) until the queue is empty first
  // when `drain` (tests, benches).
  struct counters {
    uint64_t written = 0, failed = 0, dropped = 0;
  };
  counters stats(bool drain = false, std::chrono::milliseconds timeout = std::chrono::seconds(30));

 private:
  void run();

  std::unique_ptr<kv_client> client_;  // thread-safe: the engines' threads and the writer share it
  struct pending {
    runtime::block_key key;
    std::vector<uint8_t> bytes;
    int traffic_class;
  };
  size_t capacity_, write_batch_;
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<pending> queue_;
  bool busy_ = false, stopping_ = false;
  counters counters_;
  std::thread writer_;
};

// Spawns an actor that hands every membership it receives (subscribe it to the node agent)
// to `store` as its storage node list.
caf::actor spawn_storage_watcher(caf::actor_system& sys, std::shared_ptr<kv_block_store> store);

}  // namespace shoal::actors
