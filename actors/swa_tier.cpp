// The SWA-cache directory, the machine's store actor and the engines' slot fetcher.
#include "actors/swa_tier.hpp"

#include <algorithm>

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

namespace shoal::actors {

namespace {

std::pair<uint64_t, uint64_t> key_of(const runtime::block_key& k) { return {k.hi, k.lo}; }

}  // namespace

// -- directory --------------------------------------------------------------------------------

void swa_directory_state::remove_key(size_t h, const runtime::block_key& k) {
  auto it = index_.find(key_of(k));
  if (it == index_.end()) return;
  std::erase(it->second, h);
  if (it->second.empty()) index_.erase(it);
}

void swa_directory_state::apply(const swa_report& r) {
  ++reports_;
  if (r.full) ++full_reports_;
  // One holder per node: a restarted node's new store replaces its old one.
  size_t h = 0;
  while (h < holders_.size() && holders_[h].node != r.node) ++h;
  if (h == holders_.size()) holders_.push_back({r.node, r.store, {}});
  holder& x = holders_[h];
  if (x.store != r.store || r.full) {
    for (const auto& k : x.keys) remove_key(h, {k.second, k.first});
    x.keys.clear();
    x.store = r.store;
  }
  for (const auto& k : r.evicted)
    if (x.keys.erase(key_of(k))) remove_key(h, k);
  for (const auto& k : r.added)
    if (x.keys.insert(key_of(k)).second) index_[key_of(k)].push_back(h);
}

void swa_directory_state::drop(const caf::actor_addr& store) {
  for (size_t h = 0; h < holders_.size(); ++h)
    if (holders_[h].store && holders_[h].store.address() == store) {
      for (const auto& k : holders_[h].keys) remove_key(h, {k.second, k.first});
      holders_[h].keys.clear();
      holders_[h].store = caf::actor{};
    }
}

swa_hit swa_directory_state::lookup(const std::vector<runtime::block_key>& keys, const std::string& asker) {
  ++lookups_;
  for (size_t i = keys.size(); i-- > 0;) {
    auto it = index_.find(key_of(keys[i]));
    if (it == index_.end()) continue;
    for (size_t h : it->second)
      if (holders_[h].node != asker && holders_[h].store) {
        ++hits_;
        return {static_cast<int32_t>(i), holders_[h].store, holders_[h].node};
      }
  }
  return {};
}

swa_directory_stats swa_directory_state::stats() const {
  swa_directory_stats s;
  s.entries = static_cast<int64_t>(index_.size());
  for (const auto& h : holders_) {
    if (!h.store) continue;
    s.nodes.push_back(h.node);
    s.slots.push_back(static_cast<int64_t>(h.keys.size()));
  }
  s.lookups = lookups_;
  s.hits = hits_;
  s.reports = reports_;
  s.full_reports = full_reports_;
  return s;
}

namespace {

struct directory_actor_state {
  static inline const char* name = "swa_directory";
  swa_directory_state dir;
  std::set<caf::actor_addr> monitored;
};

swa_directory_actor::behavior_type directory_behavior(
    swa_directory_actor::stateful_pointer<directory_actor_state> self) {
  self->set_down_handler([self](caf::down_msg& msg) {
    self->state.monitored.erase(msg.source);
    self->state.dir.drop(msg.source);
  });
  return {
    [self](swa_report& r) {
      if (!r.store) return;
      if (self->state.monitored.insert(r.store.address()).second) self->monitor(r.store);
      self->state.dir.apply(r);
    },
    [self](swa_atom, lookup_atom, const std::vector<runtime::block_key>& keys, const std::string& asker) {
      return self->state.dir.lookup(keys, asker);
    },
    [self](stats_atom) { return self->state.dir.stats(); },
  };
}

}  // namespace

swa_directory_actor spawn_swa_directory(caf::actor_system& sys) { return sys.spawn(directory_behavior); }

// -- store ------------------------------------------------------------------------------------

namespace {

struct store_actor_state {
  static inline const char* name = "swa_store";
  swa_store_config config;
  std::shared_ptr<runtime::registered_memory> reg;
  caf::actor directory;
  uint64_t served = 0;
};

using store_impl = swa_store_actor::extend<caf::reacts_to<tick_atom>>;
using store_pointer = store_impl::stateful_pointer<store_actor_state>;

void report(store_pointer self, bool full) {
  auto& st = self->state;
  runtime::swa_changes ch = st.config.store->take_changes();  // drained also without a directory
  if (!st.directory) return;
  if (!full && ch.empty()) return;
  swa_report r{st.config.node, caf::actor_cast<caf::actor>(self), full, {}, {}};
  if (full) {
    r.added = st.config.store->keys();
  } else {
    r.added = std::move(ch.added);
    r.evicted = std::move(ch.evicted);
  }
  self->send(caf::actor_cast<swa_directory_actor>(st.directory), std::move(r));
}

store_impl::behavior_type store_behavior(store_pointer self, swa_store_config config,
                                         std::shared_ptr<runtime::registered_memory> reg) {
  self->state.config = std::move(config);
  self->state.reg = std::move(reg);
  self->delayed_send(self, self->state.config.report_interval, tick_atom_v);
  return {
    [self](swa_atom, get_atom, const runtime::block_key& key) -> caf::result<runtime::remote_memory> {
      auto m = self->state.config.store->describe(key, *self->state.reg);
      if (!m) return make_error(errc::not_found, "no SWA slot for this key on " + self->state.config.node);
      ++self->state.served;
      return *m;
    },
    [self](stats_atom) {
      auto s = self->state.config.store->stats();
      return swa_store_stats{s.slots, s.capacity, self->state.config.store->slot_bytes(), s.puts, s.evictions,
                             self->state.served};
    },
    [self](const membership& m) {
      caf::actor dir;
      for (const auto& n : m.nodes)
        if (n.swa_directory) {
          dir = n.swa_directory;
          break;
        }
      if (dir == self->state.directory) return;
      self->state.directory = dir;
      if (self->state.config.fetcher) self->state.config.fetcher->set_directory(dir);
      report(self, true);  // a new directory (or a restarted one) learns everything held here
    },
    [self](tick_atom) {
      report(self, false);
      self->delayed_send(self, self->state.config.report_interval, tick_atom_v);
    },
  };
}

}  // namespace

std::expected<swa_store_actor, std::string> spawn_swa_store(caf::actor_system& sys, swa_store_config config) {
  if (!config.store || !config.transport) return std::unexpected("SWA store: no store or no transport");
  auto reg = config.transport->register_memory(config.store->memory());
  if (!reg) return std::unexpected("SWA store: cannot register " + std::to_string(config.store->memory().size()) +
                                   " bytes with " + config.transport->name() + ": " + reg.error());
  std::shared_ptr<runtime::registered_memory> shared(std::move(*reg));
  auto a = sys.spawn(store_behavior, std::move(config), shared);
  return caf::actor_cast<swa_store_actor>(a);
}

// -- fetcher ----------------------------------------------------------------------------------

// A fetch misses at once when this many wait for a reader (the engine replays the window).
constexpr size_t swa_fetch_queue_limit = 1024;

swa_fetcher::swa_fetcher(caf::actor_system& sys, std::shared_ptr<runtime::transport> transport, std::string node,
                         std::chrono::milliseconds timeout, size_t readers)
    : sys_(sys), transport_(std::move(transport)), node_(std::move(node)), timeout_(timeout),
      jobs_(readers, swa_fetch_queue_limit, 1, [this](std::span<job> js) { serve(js.front()); }) {}

swa_fetcher::~swa_fetcher() = default;

std::shared_ptr<runtime::slot_fetch> swa_fetcher::start_fetch(std::vector<runtime::block_key> keys,
                                                              size_t max_bytes) {
  auto f = std::make_shared<runtime::slot_fetch>();
  if (!jobs_.push({std::move(keys), max_bytes, f}))
    f->complete(-1, {}, std::to_string(swa_fetch_queue_limit) + " SWA slot fetches wait already");
  return f;
}

void swa_fetcher::set_directory(caf::actor directory) {
  std::lock_guard lock(mu_);
  directory_ = std::move(directory);
}

void swa_fetcher::serve(job& j) {
  caf::actor dir;
  {
    std::lock_guard lock(mu_);
    dir = directory_;
  }
  if (j.fetch->cancelled() || j.keys.empty()) return j.fetch->complete(-1, {});
  if (!dir) return j.fetch->complete(-1, {});  // no directory known: a miss
  caf::scoped_actor self{sys_};
  swa_hit hit;
  std::string error;
  self->request(caf::actor_cast<swa_directory_actor>(dir), timeout_, swa_atom_v, lookup_atom_v, j.keys, node_)
    .receive([&](swa_hit& h) { hit = std::move(h); },
             [&](caf::error& e) { error = "SWA directory: " + to_error_reply(e).message; });
  if (!error.empty()) return j.fetch->complete(-1, {}, error);
  if (hit.index < 0 || static_cast<size_t>(hit.index) >= j.keys.size() || !hit.store)
    return j.fetch->complete(-1, {});
  if (j.fetch->cancelled()) return j.fetch->complete(-1, {});
  runtime::remote_memory mem;
  self->request(caf::actor_cast<swa_store_actor>(hit.store), timeout_, swa_atom_v, get_atom_v,
                j.keys[static_cast<size_t>(hit.index)])
    .receive([&](runtime::remote_memory& m) { mem = std::move(m); },
             [&](caf::error& e) { error = "SWA store on " + hit.node + ": " + to_error_reply(e).message; });
  if (!error.empty()) return j.fetch->complete(-1, {}, error);
  if (mem.length == 0 || mem.length > j.max_bytes)
    return j.fetch->complete(-1, {}, "SWA store on " + hit.node + " described a slot of " +
                                         std::to_string(mem.length) + " bytes, at most " +
                                         std::to_string(j.max_bytes) + " expected");
  std::vector<uint8_t> bytes(mem.length);
  auto t = transport_->read(mem, std::as_writable_bytes(std::span(bytes)), timeout_);
  t->wait();  // bounded by the timeout given to the read
  if (!t->ok()) return j.fetch->complete(-1, {}, "SWA slot read from " + hit.node + ": " + t->error());
  j.fetch->complete(hit.index, std::move(bytes));
}

}  // namespace shoal::actors
