// storage_node_actor over storage::chunk_store: put/get/exists/stats, the corrupt fault for
// tests, and the maintenance timer (GC above the high watermark, then the TTL sweep).
#include "actors/storage_node_actor.hpp"

#include <fstream>

#include <caf/actor_system.hpp>
#include <caf/result.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "storage/bulk.hpp"
#include "storage/gc.hpp"

namespace shoal::actors {

namespace {

// The node's own timer message on top of its public interface.
using storage_node_impl = storage_node_actor::extend<caf::reacts_to<step_atom>>;

struct storage_state {
  static inline const char* name = "storage_node";
  std::shared_ptr<storage::chunk_store> store;  // shared with the bulk server's threads
  std::unique_ptr<storage::bulk_server> bulk;   // destroyed with the state when the actor exits (also
                                                // when killed): the node's data path goes quiet
  storage_node_config config;
};

using storage_pointer = storage_node_impl::stateful_pointer<storage_state>;

storage::chunk_key key_of(const runtime::block_key& key, int32_t index) {
  return {key, static_cast<uint8_t>(index)};
}

caf::error to_caf_error(const storage::store_error& e) {
  using storage::store_errc;
  errc code = errc::unknown;
  switch (e.code) {
    case store_errc::not_found: code = errc::not_found; break;
    case store_errc::corrupt: code = errc::corrupt; break;
    case store_errc::full:
    case store_errc::disk_full: code = errc::storage_full; break;
    case store_errc::empty_chunk:
    case store_errc::chunk_too_large: code = errc::invalid_request; break;
    default: break;
  }
  return make_error(code, storage::to_string(e));
}

std::optional<caf::error> check_index(int32_t index) {
  if (index < 0 || index > 254)
    return make_error(errc::invalid_request, "chunk index " + std::to_string(index) + " out of range [0, 254]");
  return std::nullopt;
}

caf::result<bool> put(storage_pointer self, chunk_put& c) {
  if (auto e = check_index(c.index)) return std::move(*e);
  auto cls = storage::traffic_class_from_byte(static_cast<uint8_t>(c.cls));
  if (!cls) return make_error(errc::invalid_request, "unknown traffic class " + std::to_string(static_cast<int>(c.cls)));
  auto r = storage::put_collecting(*self->state.store, key_of(c.key, c.index),
                                   std::as_bytes(std::span(c.bytes)), *cls);
  if (!r) return to_caf_error(r.error());
  return true;
}

caf::result<std::vector<uint8_t>> get(storage_pointer self, const runtime::block_key& block, int32_t index) {
  if (auto e = check_index(index)) return std::move(*e);
  auto r = self->state.store->get(key_of(block, index));
  if (!r) return to_caf_error(r.error());
  std::vector<uint8_t> out(r->size());
  std::memcpy(out.data(), r->data(), r->size());
  return out;
}

caf::result<std::vector<uint8_t>> exists(storage_pointer self, const chunk_query& q) {
  if (q.keys.size() != q.indices.size())
    return make_error(errc::invalid_request, "chunk query: " + std::to_string(q.keys.size()) + " keys for " +
                                               std::to_string(q.indices.size()) + " chunk indices (expected one each)");
  std::vector<storage::chunk_key> keys;
  for (size_t i = 0; i < q.indices.size(); ++i) {
    if (auto e = check_index(q.indices[i])) return std::move(*e);
    keys.push_back(key_of(q.keys[i], q.indices[i]));
  }
  std::vector<bool> held = self->state.store->exists(keys);
  return std::vector<uint8_t>(held.begin(), held.end());
}

storage_stats_snapshot snapshot(const storage_state& st) {
  storage::store_stats s = st.store->stats();
  const auto& o = st.config.store;
  return {s.chunks, s.usage_bytes, s.capacity_bytes,
          static_cast<int32_t>(o.gc_high_watermark * 100 + 0.5), static_cast<int32_t>(o.gc_low_watermark * 100 + 0.5),
          s.puts, s.put_failures, s.gets, s.get_hits, s.gc_runs, s.evicted_chunks, s.sweeps, s.expired_chunks,
          s.corrupt_removed, s.put_seconds, s.get_seconds};
}

// Flips one payload byte of the chunk's file (the path the store uses for the key).
bool corrupt(storage_pointer self, const runtime::block_key& block, int32_t index) {
  auto key = key_of(block, index);
  if (!self->state.store->meta(key)) return false;
  std::string path = storage::chunk_path(self->state.config.store.root, key);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  if (!f) return false;
  f.seekg(0, std::ios::end);
  auto size = static_cast<std::streamoff>(f.tellg());
  if (size <= 0) return false;
  std::streamoff at = size - 1;  // the payload's last byte
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(at);
  f.write(&c, 1);
  return f.good();
}

uint64_t maintain(storage_pointer self) {
  auto& store = *self->state.store;
  uint64_t removed = store.sweep();
  if (store.over_high_watermark()) removed += store.run_gc();
  return removed;
}

storage_node_impl::behavior_type storage_behavior(storage_pointer self, std::shared_ptr<storage::chunk_store> store,
                                                  std::shared_ptr<std::unique_ptr<storage::bulk_server>> bulk,
                                                  storage_node_config config) {
  self->state.store = std::move(store);
  self->state.bulk = std::move(*bulk);
  self->state.config = std::move(config);
  self->delayed_send(self, self->state.config.maintenance_interval, step_atom_v);
  return {
    [self](put_atom, chunk_put& c) { return put(self, c); },
    [self](get_atom, const runtime::block_key& key, int32_t index) { return get(self, key, index); },
    [self](exists_atom, const chunk_query& q) { return exists(self, q); },
    [self](stats_atom) { return snapshot(self->state); },
    [self](corrupt_atom, const runtime::block_key& key, int32_t index) { return corrupt(self, key, index); },
    [self](gc_atom) { return maintain(self); },
    [self](step_atom) {
      maintain(self);
      self->delayed_send(self, self->state.config.maintenance_interval, step_atom_v);
    },
  };
}

}  // namespace

std::expected<storage_node, std::string> spawn_storage_node(caf::actor_system& sys, storage_node_config config) {
  auto store = storage::chunk_store::open(config.store);
  if (!store) return std::unexpected("storage node at " + config.store.root + ": " + storage::to_string(store.error()));
  std::shared_ptr<storage::chunk_store> shared = std::move(*store);
  storage::bulk_server_options bo;
  bo.host = config.bulk_host;
  bo.port = config.bulk_port;
  auto bulk = storage::bulk_server::start(shared, bo);
  if (!bulk) return std::unexpected("storage node at " + config.store.root + ": " + bulk.error());
  uint16_t port = (*bulk)->port();
  // The server travels into the actor through a shared_ptr (spawn arguments are copied).
  auto holder = std::make_shared<std::unique_ptr<storage::bulk_server>>(std::move(*bulk));
  auto a = sys.spawn(storage_behavior, std::move(shared), std::move(holder), std::move(config));
  return storage_node{caf::actor_cast<storage_node_actor>(a), port};
}

}  // namespace shoal::actors
