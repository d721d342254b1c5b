// kv_client: codec, rendezvous placement, chunk puts and gets over the storage nodes' bulk
// servers (storage/bulk.hpp: every chunk of a batch in flight, replies read by one poll loop in
// the calling thread), and the existence queries as CAF requests fanned out through a one-shot
// actor whose replies land in a collector the calling thread waits on (bounded by the timeout).
#include "actors/kv_client.hpp"

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>

#include <xxhash.h>

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>

#include "storage/bulk.hpp"
#include "storage/erasure.hpp"

namespace shoal::actors {

namespace {

// Replies of one fan-out (existence queries), filled by the one-shot actor, read by the
// waiting caller.
struct collector {
  std::mutex mu;
  std::condition_variable cv;
  std::map<size_t, std::vector<uint8_t>> ok;  // by request number
  std::map<size_t, std::string> failed;
  size_t expected = 0;
  bool all_in() const { return ok.size() + failed.size() >= expected; }
};

// Sends (exists_atom, queries[i]) to targets[i] for every i; replies and errors land in the
// collector.
std::shared_ptr<collector> fan_out(caf::actor_system& sys, const std::vector<storage_node_actor>& targets,
                                   std::chrono::milliseconds timeout, std::vector<chunk_query> queries) {
  auto c = std::make_shared<collector>();
  c->expected = targets.size();
  for (size_t i = 0; i < targets.size(); ++i)
    if (!targets[i]) c->failed.emplace(i, "storage node is down");
  if (c->all_in()) return c;
  sys.spawn([c, targets, timeout, queries = std::move(queries)](caf::event_based_actor* self) mutable {
    for (size_t i = 0; i < targets.size(); ++i) {
      if (!targets[i]) continue;
      self->request(targets[i], timeout, exists_atom_v, std::move(queries[i]))
        .then(
          [c, i](std::vector<uint8_t>& held) {
            std::lock_guard lock(c->mu);
            c->ok.emplace(i, std::move(held));
            c->cv.notify_all();
          },
          [c, i](caf::error& e) {
            std::lock_guard lock(c->mu);
            c->failed.emplace(i, to_error_reply(e).message);
            c->cv.notify_all();
          });
    }
  });
  return c;
}

uint64_t rank_score(const std::string& name, const block_key& key) {
  uint64_t words[2] = {key.hi, key.lo};
  uint64_t seed = XXH3_64bits(words, sizeof words);
  return XXH3_64bits_withSeed(name.data(), name.size(), seed);
}

}  // namespace

struct kv_client::impl {
  caf::actor_system& sys;
  kv_client_config cfg;
  storage::ec_codec codec;
  mutable std::shared_mutex mu;  // guards nodes: callers on several threads, set_nodes
  std::vector<storage_endpoint> nodes;
  storage::bulk_pool pool;       // connections to the nodes' bulk servers

  // One member of a placement group as seen when the call starts.
  struct member {
    storage::bulk_endpoint bulk;
    storage_node_actor actor;  // null: the node is down
    bool up() const { return actor && bulk.port != 0; }
  };
  using group = std::vector<member>;

  // A key's placement group in chunk order, taken under the lock.
  std::optional<group> group_of(const block_key& key) const {
    std::shared_lock lock(mu);
    std::vector<size_t> idx = placement_locked(key);
    if (static_cast<int>(idx.size()) < codec.n()) return std::nullopt;
    group g;
    for (size_t i : idx) {
      const auto& n = nodes[i];
      g.push_back({{n.name, n.host, n.bulk_port}, n.actor});
    }
    return g;
  }
  std::vector<size_t> placement_locked(const block_key& key) const {
    std::vector<std::pair<uint64_t, size_t>> ranked;
    for (size_t i = 0; i < nodes.size(); ++i) ranked.emplace_back(rank_score(nodes[i].name, key), i);
    std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<size_t> out;
    for (size_t i = 0; i < ranked.size() && static_cast<int>(out.size()) < codec.n(); ++i) out.push_back(ranked[i].second);
    return out;
  }
  // Chunk traffic of one call: connects bounded by a second (a dead node refuses sooner), sends
  // by the request timeout.
  storage::bulk_exchange exchange() {
    return {pool, std::min(cfg.timeout, std::chrono::milliseconds(1000)), cfg.timeout};
  }
  std::string too_few_nodes() const {
    std::shared_lock lock(mu);
    return "kv client: " + std::to_string(nodes.size()) + " storage node(s), a placement group needs " +
           std::to_string(codec.n());
  }
};

kv_client::kv_client(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
kv_client::~kv_client() = default;

std::expected<std::unique_ptr<kv_client>, std::string> kv_client::create(caf::actor_system& sys, kv_client_config cfg) {
  auto codec = storage::ec_codec::create(cfg.k, cfg.m);
  if (!codec) return std::unexpected("kv client: " + codec.error().message);
  if (cfg.put_acks < cfg.k || cfg.put_acks > cfg.k + cfg.m)
    return std::unexpected("kv client: put_acks must be in [k, k + m], got " + std::to_string(cfg.put_acks));
  auto im = std::unique_ptr<impl>(new impl{sys, cfg, std::move(*codec), {}, {}, {}});
  return std::unique_ptr<kv_client>(new kv_client(std::move(im)));
}

void kv_client::set_nodes(std::vector<storage_endpoint> nodes) {
  // Placement is over every node name ever seen: a node that left keeps its place (its
  // chunks stay where the ranking put them), with no handle until it comes back.
  std::unique_lock lock(impl_->mu);
  auto& known = impl_->nodes;
  for (auto& k : known) k.actor = nullptr;
  for (auto& n : nodes) {
    auto it = std::find_if(known.begin(), known.end(), [&](const storage_endpoint& k) { return k.name == n.name; });
    if (it != known.end()) *it = std::move(n);  // a restarted node may listen elsewhere now
    else known.push_back(std::move(n));
  }
}

std::vector<storage_endpoint> kv_client::nodes_of(const membership& m) {
  std::vector<storage_endpoint> out;
  for (const node_info& n : m.nodes)
    for (size_t i = 0; i < n.storage.size(); ++i)
      if (n.storage[i])
        out.push_back({n.name + "/storage" + std::to_string(i), caf::actor_cast<storage_node_actor>(n.storage[i]), n.host,
                       i < n.storage_ports.size() ? n.storage_ports[i] : uint16_t{0}});
  return out;
}

std::vector<size_t> kv_client::placement(const block_key& key) const {
  std::shared_lock lock(impl_->mu);
  return impl_->placement_locked(key);
}

std::expected<void, std::string> kv_client::put(const block_key& key, std::span<const uint8_t> block,
                                                runtime::traffic_class cls) {
  put_item item{key, block, cls};
  return std::move(put_many({&item, 1})[0]);
}

namespace {

std::string joined(const std::vector<std::string>& xs) {
  std::string out;
  for (const auto& x : xs) out += (out.empty() ? "" : "; ") + x;
  return out;
}

}  // namespace

std::vector<std::expected<void, std::string>> kv_client::put_many(std::span<const put_item> items) {
  auto& im = *impl_;
  std::vector<std::expected<void, std::string>> out(items.size());
  const auto start = std::chrono::steady_clock::now();
  auto ex = im.exchange();
  struct flight {
    bool sent = false;
    std::vector<size_t> calls;
    std::vector<std::string> down;  // chunks not sent: their node is down
  };
  std::vector<flight> flights(items.size());
  for (size_t b = 0; b < items.size(); ++b) {
    const put_item& it = items[b];
    auto g = im.group_of(it.key);
    if (!g) {
      out[b] = std::unexpected(im.too_few_nodes());
      continue;
    }
    auto chunks = im.codec.encode(it.block);
    if (!chunks) {
      out[b] = std::unexpected("kv client: " + chunks.error().message);
      continue;
    }
    flights[b].sent = true;
    for (size_t i = 0; i < g->size(); ++i) {
      const auto& e = (*g)[i];
      if (!e.up()) {
        flights[b].down.push_back(e.bulk.name + ": storage node is down");
        continue;
      }
      flights[b].calls.push_back(ex.add(e.bulk, {storage::bulk_op::put, 0,
                                                 {it.key, static_cast<uint8_t>(i)},
                                                 static_cast<uint8_t>(it.cls), (*chunks)[i]}));
    }
  }
  auto acks = [&](const flight& f) {
    int n = 0;
    for (size_t c : f.calls) n += ex[c].ok ? 1 : 0;
    return n;
  };
  auto settled = [&](const flight& f) {
    return !f.sent || acks(f) >= im.cfg.put_acks ||
           std::all_of(f.calls.begin(), f.calls.end(), [&](size_t c) { return ex[c].done; });
  };
  ex.run_until(start + im.cfg.timeout, [&] { return std::all_of(flights.begin(), flights.end(), settled); });
  // Acknowledged: the remaining chunks were sent whole and land on their nodes; their replies
  // are skipped by the connections' next users.
  for (size_t b = 0; b < items.size(); ++b) {
    const flight& f = flights[b];
    if (!f.sent || acks(f) >= im.cfg.put_acks) continue;
    std::vector<std::string> why = f.down;
    for (size_t c : f.calls)
      if (!ex[c].ok) why.push_back(ex[c].done ? ex[c].error : "no reply in " + std::to_string(im.cfg.timeout.count()) + " ms");
    out[b] = std::unexpected("kv client: put acknowledged by " + std::to_string(acks(f)) + " of " +
                             std::to_string(im.cfg.put_acks) + " needed chunk(s)" +
                             (why.empty() ? "" : " (" + joined(why) + ")"));
  }
  return out;
}

std::expected<std::vector<uint8_t>, std::string> kv_client::get(const block_key& key) {
  return std::move(get_many({&key, 1})[0]);
}

namespace {

// The chunks of every block of `keys`, all in flight at once, each verified on arrival: the
// first k + 1 chunks of every block; where k valid are not in after the hedge delay (a hung
// node only shows as a timeout) or a first-wave chunk already failed, the rest too.
class chunk_gather {
 public:
  chunk_gather(kv_client::impl& im, std::span<const block_key> keys)
      : im_(im), keys_(keys), k_(im.codec.k()), start_(std::chrono::steady_clock::now()), ex_(im.exchange()),
        flights_(keys.size()) {}

  // Runs the exchange until every block has k valid chunks or cannot get them, or the timeout
  // (the rest are abandoned, cancelled).
  void run() {
    const size_t first_wave = static_cast<size_t>(k_ + 1);
    for (size_t b = 0; b < keys_.size(); ++b) {
      flights_[b].g = im_.group_of(keys_[b]);
      if (flights_[b].g) ask(b, 0, std::min(first_wave, flights_[b].g->size()));
    }
    auto on_reply = [this](size_t call) { take(call); };
    auto all_enough = [this] { return std::all_of(flights_.begin(), flights_.end(), [this](const flight& f) { return enough(f); }); };
    hedge();
    ex_.run_until(start_ + im_.cfg.hedge, [&] {
      hedge();  // a failed chunk asks for the rest at once, without waiting for the delay
      return all_enough();
    }, on_reply);
    hedge();
    ex_.run_until(start_ + im_.cfg.timeout, all_enough, on_reply);
  }

  // on_block(b, refs, why) once per block with the valid chunks received (at most k; refs
  // valid during the call only) and why others failed, or with refs null when the block has
  // no placement group (why then says so).
  template <class OnBlock>
  void report(OnBlock&& on_block) {
    for (size_t b = 0; b < keys_.size(); ++b) {
      auto& f = flights_[b];
      if (!f.g) {
        on_block(b, nullptr, im_.too_few_nodes());
        continue;
      }
      std::vector<storage::chunk_ref> refs;
      std::vector<std::string> why = f.why;
      for (auto& [call, i] : f.calls) {
        auto& r = ex_[call];
        if (accepted_[call]) {
          if (static_cast<int>(refs.size()) < k_) refs.push_back({i, r.payload});
        } else if (!r.ok) {
          why.push_back("chunk " + std::to_string(i) + ": " + (r.done ? r.error : "no reply"));
        }
      }
      on_block(b, &refs, why.empty() ? std::string() : " (" + joined(why) + ")");
    }
  }

 private:
  struct flight {
    std::optional<kv_client::impl::group> g;
    std::vector<std::pair<size_t, uint32_t>> calls;  // (exchange call, chunk index)
    std::vector<std::string> why;                    // chunks that failed, and why
    int valid = 0;
    size_t asked = 0;  // chunk indices [0, asked) asked (or down)
  };

  // Asks for chunks [first, last) of block b (a down node's chunk counts as failed).
  void ask(size_t b, size_t first, size_t last) {
    auto& f = flights_[b];
    for (size_t i = first; i < last; ++i) {
      const auto& e = (*f.g)[i];
      if (!e.up()) {
        f.why.push_back("chunk " + std::to_string(i) + ": " + e.bulk.name + " is down");
        continue;
      }
      size_t call = ex_.add(e.bulk, {storage::bulk_op::get, 0, {keys_[b], static_cast<uint8_t>(i)}, 0, {}});
      f.calls.emplace_back(call, static_cast<uint32_t>(i));
      owner_.resize(call + 1);
      accepted_.resize(call + 1);
      owner_[call] = {b, static_cast<uint32_t>(i)};
    }
    f.asked = last;
  }

  // A reply: its checksum checked once, as it arrives; a bad one is an erasure.
  void take(size_t call) {
    auto [b, i] = owner_[call];
    auto& r = ex_[call];
    if (r.ok && storage::verify_chunk(r.payload)) {
      accepted_[call] = true;
      ++flights_[b].valid;
    } else if (r.ok) {
      flights_[b].why.push_back("chunk " + std::to_string(i) + " failed its checksum");
    }
  }

  bool enough(const flight& f) {
    return !f.g || f.valid >= k_ ||
           (f.asked >= f.g->size() &&
            std::all_of(f.calls.begin(), f.calls.end(), [&](auto& c) { return ex_[c.first].done; }));
  }

  // The rest of a block's chunks once one of its asked chunks failed or the hedge delay passed.
  void hedge() {
    for (size_t b = 0; b < flights_.size(); ++b) {
      auto& f = flights_[b];
      if (!f.g || f.valid >= k_ || f.asked >= f.g->size()) continue;
      int lost = 0;
      for (auto& c : f.calls) lost += ex_[c.first].done && !accepted_[c.first] ? 1 : 0;
      lost += static_cast<int>(f.asked) - static_cast<int>(f.calls.size());  // down nodes
      if (lost > 0 || std::chrono::steady_clock::now() >= start_ + im_.cfg.hedge) ask(b, f.asked, f.g->size());
    }
  }

  kv_client::impl& im_;
  std::span<const block_key> keys_;
  const int k_;
  const std::chrono::steady_clock::time_point start_;
  storage::bulk_exchange ex_;
  std::vector<flight> flights_;
  std::vector<std::pair<size_t, uint32_t>> owner_;  // exchange call → (block, chunk index)
  std::vector<bool> accepted_;                      // exchange call → valid chunk
};

template <class OnBlock>
void gather(kv_client::impl& im, std::span<const block_key> keys, OnBlock&& on_block) {
  chunk_gather g(im, keys);
  g.run();
  g.report(std::forward<OnBlock>(on_block));
}

}  // namespace

std::vector<std::expected<std::vector<uint8_t>, std::string>> kv_client::get_many(std::span<const block_key> keys) {
  std::vector<std::expected<std::vector<uint8_t>, std::string>> out(keys.size());
  gather(*impl_, keys, [&](size_t b, const std::vector<storage::chunk_ref>* refs, const std::string& why) {
    if (!refs) {
      out[b] = std::unexpected(why);
      return;
    }
    auto block = impl_->codec.decode(*refs, true);  // every ref passed verify_chunk on arrival
    if (!block)
      out[b] = std::unexpected("kv client: block miss: " + block.error().message + why);
    else
      out[b] = std::move(*block);
  });
  return out;
}

std::vector<std::expected<void, std::string>> kv_client::get_many_into(std::span<const block_key> keys,
                                                                       std::span<const std::span<uint8_t>> dsts) {
  std::vector<std::expected<void, std::string>> out(keys.size());
  gather(*impl_, keys.first(std::min(keys.size(), dsts.size())),
         [&](size_t b, const std::vector<storage::chunk_ref>* refs, const std::string& why) {
           if (!refs) {
             out[b] = std::unexpected(why);
             return;
           }
           auto done = impl_->codec.decode_into(*refs, dsts[b], true);
           if (!done) out[b] = std::unexpected("kv client: block miss: " + done.error().message + why);
         });
  out.resize(std::min(keys.size(), dsts.size()));
  return out;
}

std::optional<std::string> kv_client::placement_problem() const {
  {
    std::shared_lock lock(impl_->mu);
    if (static_cast<int>(impl_->nodes.size()) >= impl_->codec.n()) return std::nullopt;
  }
  return impl_->too_few_nodes();
}

size_t kv_client::lookup(const std::vector<block_key>& chain) {
  auto& im = *impl_;
  std::shared_lock nodes_lock(im.mu);
  if (chain.empty() || static_cast<int>(im.nodes.size()) < im.codec.n()) return 0;
  // One query per node with every (block, chunk) placed on it.
  std::vector<chunk_query> queries(im.nodes.size());
  std::vector<std::vector<size_t>> block_of(im.nodes.size());  // query entry → chain index
  for (size_t b = 0; b < chain.size(); ++b) {
    std::vector<size_t> group = im.placement_locked(chain[b]);
    for (size_t i = 0; i < group.size(); ++i) {
      auto& q = queries[group[i]];
      q.keys.push_back(chain[b]);
      q.indices.push_back(static_cast<int32_t>(i));
      block_of[group[i]].push_back(b);
    }
  }
  std::vector<storage_node_actor> targets;
  std::vector<size_t> node_of;
  std::vector<chunk_query> asked;
  for (size_t n = 0; n < queries.size(); ++n)
    if (!queries[n].indices.empty()) {
      targets.push_back(im.nodes[n].actor);
      node_of.push_back(n);
      asked.push_back(std::move(queries[n]));
    }
  nodes_lock.unlock();
  auto c = fan_out(im.sys, targets, im.cfg.timeout, std::move(asked));
  const int k = im.codec.k();
  // The run is known as soon as every block up to its end has k chunks held, and the block
  // after it cannot reach k with the answers still out: a node that never answers costs the
  // timeout only when its answer could change the result.
  std::vector<int> held(chain.size()), open(chain.size());
  size_t run = 0;
  auto decided = [&] {
    std::fill(held.begin(), held.end(), 0);
    std::fill(open.begin(), open.end(), 0);
    for (size_t t = 0; t < targets.size(); ++t) {
      const auto& blocks = block_of[node_of[t]];
      if (auto it = c->ok.find(t); it != c->ok.end()) {
        for (size_t j = 0; j < blocks.size() && j < it->second.size(); ++j) held[blocks[j]] += it->second[j] ? 1 : 0;
      } else if (!c->failed.contains(t)) {
        for (size_t b : blocks) ++open[b];
      }
    }
    for (run = 0; run < chain.size() && held[run] >= k;) ++run;
    return run == chain.size() || held[run] + open[run] < k;
  };
  std::unique_lock lock(c->mu);
  c->cv.wait_for(lock, im.cfg.timeout + std::chrono::seconds(1), [&] { return c->all_in() || decided(); });
  decided();  // the run from the answers in, also after a timeout
  return run;
}

}  // namespace shoal::actors
