// The storage node actor: one storage::chunk_store (a local directory) behind the
// storage_node_actor interface. Handlers translate messages into store calls and store errors
// into error replies; a timer runs GC over the high watermark and the TTL sweeper. The actor
// owns the node's bulk server (storage/bulk.hpp: chunk puts and gets over TCP on the same
// store): it serves while the actor lives and stops when the actor goes down.
#pragma once

#include <chrono>
#include <expected>
#include <string>

#include "actors/interfaces.hpp"
#include "storage/chunk_store.hpp"

namespace shoal::actors {

struct storage_node_config {
  storage::store_options store;                         // root, capacity, watermarks, fsync, TTLs
  std::chrono::milliseconds maintenance_interval{1000};  // GC + TTL sweep period
  std::string bulk_host = "127.0.0.1";                   // the bulk server's address …
  uint16_t bulk_port = 0;                                // … and port (0: any free one)
};

struct storage_node {
  storage_node_actor actor;
  uint16_t bulk_port = 0;  // where its bulk server listens (on config.bulk_host)
};

// Opens the store and starts its bulk server (an error names the directory or address and the
// cause), then spawns the actor.
std::expected<storage_node, std::string> spawn_storage_node(caf::actor_system& sys, storage_node_config config);

}  // namespace shoal::actors
