// The storage node actor: one storage::chunk_store (a local directory) behind the
// storage_node_actor interface. Handlers translate messages into store calls and store errors
// into error replies; a timer runs GC over the high watermark and the TTL sweeper.
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
};

// Opens the store (an error names the directory and the cause) and spawns its actor.
std::expected<storage_node_actor, std::string> spawn_storage_node(caf::actor_system& sys,
                                                                  storage_node_config config);

}  // namespace shoal::actors
