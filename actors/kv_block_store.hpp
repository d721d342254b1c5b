// runtime::remote_blocks over the storage cluster: the engine's second cache tier. Nothing
// here runs on an engine's step loop. A fetch is queued to `readers` reader threads, each of
// which runs one at a time: a lookup (existence queries), then every listed block in flight
// at once, each checked against the KV format its header names before it is copied into the
// engine's reserved pool blocks (another format is a counted miss), both bounded by the client's timeout; a slow storage node holds up only the fetches a
// reader is on. Writes go through a bounded queue drained by one thread in batches of up to
// `write_batch` blocks in flight (a full queue drops the write and counts it). The node list
// follows the membership (subscribe an updater).
#pragma once

#include <memory>
#include <mutex>

#include "actors/kv_client.hpp"
#include "runtime/base/work_queue.hpp"
#include "runtime/core/remote_blocks.hpp"

namespace shoal::actors {

class kv_block_store final : public runtime::remote_blocks {
 public:
  // queue_blocks: writes waiting at most.
  explicit kv_block_store(std::unique_ptr<kv_client> client, size_t queue_blocks = 256, size_t write_batch = 8,
                          size_t readers = 2);
  // Finishes the fetches already queued (each bounded by the client's timeout).
  ~kv_block_store() override;

  std::shared_ptr<runtime::remote_fetch> start_fetch(std::vector<runtime::block_key> keys,
                                                     std::vector<std::span<std::byte>> dsts,
                                                     const model::kv_format& f) override;
  bool store_async(const runtime::block_key& key, std::span<const std::byte> src, const model::kv_format& f,
                   runtime::traffic_class cls) override;

  void set_nodes(std::vector<storage_endpoint> nodes);
  // Blocks written, failed, dropped so far; waits (bounded) until the queue is empty first
  // when `drain` (tests, benches).
  struct counters {
    uint64_t written = 0, failed = 0, dropped = 0;
  };
  counters stats(bool drain = false, std::chrono::milliseconds timeout = std::chrono::seconds(30));

 private:
  struct fetch_job {
    std::vector<runtime::block_key> keys;
    std::vector<std::span<std::byte>> dsts;
    model::kv_format format;
    std::shared_ptr<runtime::remote_fetch> fetch;
  };
  struct pending {
    runtime::block_key key;
    std::vector<uint8_t> bytes;
    runtime::traffic_class cls;
  };
  void write(std::span<pending> batch);
  void serve(fetch_job& job);

  std::unique_ptr<kv_client> client_;  // thread-safe: the engines' threads and the workers share it
  std::mutex mu_;
  counters counters_;  // under mu_
  // Last: their workers use what is above, and stop (writes queued then are dropped, fetches
  // queued are served) before it goes.
  runtime::work_queue<pending> writes_;
  runtime::work_queue<fetch_job> fetches_;
};

// Spawns an actor that hands every membership it receives (subscribe it to the node agent)
// to `store` as its storage node list.
caf::actor spawn_storage_watcher(caf::actor_system& sys, std::shared_ptr<kv_block_store> store);

}  // namespace shoal::actors
