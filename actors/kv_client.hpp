// The engines' client of the KV-cache storage cluster. A block (bytes of one KV-cache block,
// keyed by its 128-bit prefix-hash-chain key) is erasure coded k + m (10 + 2) and its chunks
// placed on the block's placement group: the first k + m storage nodes when all nodes are
// ranked by XXH3(node name, key) (rendezvous hashing: adding or losing a node moves only the
// blocks it held or would now hold). Chunk bytes go over the nodes' bulk TCP servers
// (storage/bulk.hpp); existence queries are CAF messages. put sends chunk i to the group's node i and succeeds once
// `put_acks` are durable; get asks the first k + 1 nodes, decodes from the first k valid
// chunks (checksums checked; a bad one is an erasure) and asks the rest only when k valid
// chunks are not in within a short hedge delay (a killed node may only show as a timeout);
// lookup finds the longest run of present blocks from the start of a chain with one
// existence query per node. A missing or unreadable block is a miss, never wrong data.
// put_many / get_many have every block of a batch in flight at once (the storage nodes work
// on them in parallel); the client is safe to use from several threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <expected>
#include <memory>
#include <span>
#include <optional>
#include <string>
#include <vector>

#include "actors/interfaces.hpp"
#include "runtime/base/block_key.hpp"

namespace shoal::actors {

using runtime::block_key;  // one key type from the engine to the chunk files

struct kv_client_config {
  int k = 10, m = 2;
  int put_acks = 11;                                // durable chunks before a put succeeds (k + 1)
  std::chrono::milliseconds timeout{5000};          // per storage request
  std::chrono::milliseconds hedge{50};              // get: ask the rest of the group after this
};

struct storage_endpoint {
  std::string name;  // "<node>/storage<i>", the rendezvous hash input
  storage_node_actor actor;
  std::string host;        // its bulk server: chunk bytes travel there, not as CAF messages
  uint16_t bulk_port = 0;  // 0: none (its chunks cannot be read or written)
};

class kv_client {
 public:
  static std::expected<std::unique_ptr<kv_client>, std::string> create(caf::actor_system& sys, kv_client_config cfg);
  ~kv_client();

  // The storage nodes that are up (e.g. every storage actor of the membership). Placement
  // ranks every name ever given, so a node that is down keeps its chunks' places (its
  // requests fail at once) and serves them again when it is back under the same name.
  void set_nodes(std::vector<storage_endpoint> nodes);
  static std::vector<storage_endpoint> nodes_of(const membership& m);
  // Indices into the nodes of `key`'s placement group, chunk order (k + m of them).
  std::vector<size_t> placement(const block_key& key) const;

  std::expected<void, std::string> put(const block_key& key, std::span<const uint8_t> block,
                                       runtime::traffic_class cls);
  std::expected<std::vector<uint8_t>, std::string> get(const block_key& key);

  struct put_item {
    block_key key;
    std::span<const uint8_t> block;
    runtime::traffic_class cls = runtime::traffic_class::agent;
  };
  // One result per item, in order; every block's chunks are sent before any ack is awaited.
  std::vector<std::expected<void, std::string>> put_many(std::span<const put_item> items);
  // One result per key, in order; every block's first wave is asked before any is awaited.
  std::vector<std::expected<std::vector<uint8_t>, std::string>> get_many(std::span<const block_key> keys);
  // get_many decoding straight into the caller's buffers: keys[i] into dsts[i], which must be
  // exactly the block's length (else that block is a miss). A failed block's buffer may be
  // partly written.
  std::vector<std::expected<void, std::string>> get_many_into(std::span<const block_key> keys,
                                                              std::span<const std::span<uint8_t>> dsts);
  // Number of leading blocks of `chain` with at least k chunks held.
  size_t lookup(const std::vector<block_key>& chain);
  // Why no block can be placed now ("kv client: 11 storage node(s), a placement group needs
  // 12"), or nullopt when the known nodes can hold a placement group.
  std::optional<std::string> placement_problem() const;

  struct impl;

 private:
  explicit kv_client(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace shoal::actors
