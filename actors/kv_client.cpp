// kv_client: codec, rendezvous placement, and fan-out of storage requests through one-shot
// actors whose replies land in a collector the calling thread waits on (bounded by the
// configured timeout per request).
#include "actors/kv_client.hpp"

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>

#include <xxhash.h>

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>

#include "storage/erasure.hpp"

namespace shoal::actors {

namespace {

// Replies of one fan-out, filled by the one-shot actor, read by the waiting caller.
template <class Reply>
struct collector {
  std::mutex mu;
  std::condition_variable cv;
  std::map<size_t, Reply> ok;               // by request number
  std::map<size_t, std::string> failed;
  std::function<bool(const Reply&)> accept;  // checked once per reply as it arrives; null = all
  std::map<size_t, bool> accepted;           // by request number, for every reply in `ok`
  int accepted_count = 0;
  size_t expected = 0;
  bool all_in() const { return ok.size() + failed.size() >= expected; }
};

// Sends `make(i)` to targets[i] for every i; replies and errors land in the collector.
template <class Reply, class Handle, class Make>
std::shared_ptr<collector<Reply>> fan_out(caf::actor_system& sys, const std::vector<Handle>& targets,
                                          std::chrono::milliseconds timeout, Make make,
                                          std::function<bool(const Reply&)> accept = nullptr) {
  auto c = std::make_shared<collector<Reply>>();
  c->accept = std::move(accept);
  c->expected = targets.size();
  for (size_t i = 0; i < targets.size(); ++i)
    if (!targets[i]) c->failed.emplace(i, "storage node is down");
  if (c->all_in()) return c;
  // Messages are built here, not in the actor: it may start after the caller gave up waiting.
  std::vector<decltype(make(0))> msgs;
  for (size_t i = 0; i < targets.size(); ++i) msgs.push_back(make(i));
  sys.spawn([c, targets, timeout, msgs = std::move(msgs)](caf::event_based_actor* self) mutable {
    for (size_t i = 0; i < targets.size(); ++i) {
      if (!targets[i]) continue;
      std::apply([&](auto&... xs) { return self->request(targets[i], timeout, std::move(xs)...); }, msgs[i])
        .then(
          [c, i](Reply& r) {
            bool good = !c->accept || c->accept(r);  // outside the lock: may be a checksum
            std::lock_guard lock(c->mu);
            c->accepted[i] = good;
            c->accepted_count += good ? 1 : 0;
            c->ok.emplace(i, std::move(r));
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

  // A key's placement group as handles and names, taken under the lock (a null handle: down).
  struct group {
    std::vector<storage_node_actor> actors;
    std::vector<std::string> names;
  };
  std::optional<group> group_of(const block_key& key) const {
    std::shared_lock lock(mu);
    std::vector<size_t> idx = placement_locked(key);
    if (static_cast<int>(idx.size()) < codec.n()) return std::nullopt;
    group g;
    for (size_t i : idx) {
      g.actors.push_back(nodes[i].actor);
      g.names.push_back(nodes[i].name);
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
};

kv_client::kv_client(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
kv_client::~kv_client() = default;

std::expected<std::unique_ptr<kv_client>, std::string> kv_client::create(caf::actor_system& sys, kv_client_config cfg) {
  auto codec = storage::ec_codec::create(cfg.k, cfg.m);
  if (!codec) return std::unexpected("kv client: " + codec.error().message);
  if (cfg.put_acks < cfg.k || cfg.put_acks > cfg.k + cfg.m)
    return std::unexpected("kv client: put_acks must be in [k, k + m], got " + std::to_string(cfg.put_acks));
  auto im = std::unique_ptr<impl>(new impl{sys, cfg, std::move(*codec), {}, {}});
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
    if (it != known.end()) it->actor = std::move(n.actor);
    else known.push_back(std::move(n));
  }
}

std::vector<storage_endpoint> kv_client::nodes_of(const membership& m) {
  std::vector<storage_endpoint> out;
  for (const node_info& n : m.nodes)
    for (size_t i = 0; i < n.storage.size(); ++i)
      if (n.storage[i])
        out.push_back({n.name + "/storage" + std::to_string(i), caf::actor_cast<storage_node_actor>(n.storage[i])});
  return out;
}

std::vector<size_t> kv_client::placement(const block_key& key) const {
  std::shared_lock lock(impl_->mu);
  return impl_->placement_locked(key);
}

std::expected<void, std::string> kv_client::put(const block_key& key, std::span<const uint8_t> block,
                                                int traffic_class) {
  put_item item{key, block, traffic_class};
  return std::move(put_many({&item, 1})[0]);
}

std::vector<std::expected<void, std::string>> kv_client::put_many(std::span<const put_item> items) {
  auto& im = *impl_;
  std::vector<std::expected<void, std::string>> out(items.size());
  struct flight {
    std::vector<std::string> names;
    std::shared_ptr<collector<bool>> c;
  };
  std::vector<flight> flights(items.size());
  for (size_t b = 0; b < items.size(); ++b) {
    const put_item& it = items[b];
    auto g = im.group_of(it.key);
    if (!g) {
      std::shared_lock lock(im.mu);
      out[b] = std::unexpected("kv client: " + std::to_string(im.nodes.size()) +
                               " storage node(s), a placement group needs " + std::to_string(im.codec.n()));
      continue;
    }
    auto chunks = im.codec.encode(it.block);
    if (!chunks) {
      out[b] = std::unexpected("kv client: " + chunks.error().message);
      continue;
    }
    flights[b].names = std::move(g->names);
    flights[b].c = fan_out<bool>(im.sys, g->actors, im.cfg.timeout, [&](size_t i) {
      return std::make_tuple(put_atom_v, chunk_put{it.key.hi, it.key.lo, static_cast<int32_t>(i), it.traffic_class,
                                                   std::move((*chunks)[i])});
    });
  }
  auto deadline = std::chrono::steady_clock::now() + im.cfg.timeout + std::chrono::seconds(1);
  for (size_t b = 0; b < items.size(); ++b) {
    auto& c = flights[b].c;
    if (!c) continue;
    std::unique_lock lock(c->mu);
    c->cv.wait_until(lock, deadline,
                     [&] { return static_cast<int>(c->ok.size()) >= im.cfg.put_acks || c->all_in(); });
    if (static_cast<int>(c->ok.size()) >= im.cfg.put_acks) continue;
    std::string why;
    for (const auto& [i, e] : c->failed) why += (why.empty() ? "" : "; ") + flights[b].names[i] + ": " + e;
    out[b] = std::unexpected("kv client: put acknowledged by " + std::to_string(c->ok.size()) + " of " +
                             std::to_string(im.cfg.put_acks) + " needed chunk(s)" + (why.empty() ? "" : " (" + why + ")"));
  }
  return out;
}

std::expected<std::vector<uint8_t>, std::string> kv_client::get(const block_key& key) {
  return std::move(get_many({&key, 1})[0]);
}

std::vector<std::expected<std::vector<uint8_t>, std::string>> kv_client::get_many(std::span<const block_key> keys) {
  auto& im = *impl_;
  const int k = im.codec.k();
  const size_t first_wave = static_cast<size_t>(k + 1);
  using reply = std::vector<uint8_t>;
  using coll = std::shared_ptr<collector<reply>>;
  auto chunk_ok = [](const reply& bytes) { return storage::verify_chunk(bytes).has_value(); };
  auto ask = [&](const block_key& key, const impl::group& g, size_t first, size_t last) {
    std::vector<storage_node_actor> targets(g.actors.begin() + static_cast<ptrdiff_t>(first),
                                            g.actors.begin() + static_cast<ptrdiff_t>(last));
    return fan_out<reply>(
      im.sys, targets, im.cfg.timeout,
      [&](size_t i) { return std::make_tuple(get_atom_v, key.hi, key.lo, static_cast<int32_t>(first + i)); },
      chunk_ok);
  };
  auto state_of = [](const coll& c) {
    std::lock_guard lock(c->mu);
    return std::pair<int, bool>{c->accepted_count, c->all_in()};
  };
  // Every block's first k + 1 nodes at once. Then block by block: when k valid chunks are not
  // in after the hedge delay (a dead node may only show as a timeout), the rest of its group
  // as well, and the first k valid from either wave decode.
  struct flight {
    std::optional<impl::group> g;
    coll c1, c2;
  };
  std::vector<flight> flights(keys.size());
  for (size_t b = 0; b < keys.size(); ++b) {
    flights[b].g = im.group_of(keys[b]);
    if (flights[b].g) flights[b].c1 = ask(keys[b], *flights[b].g, 0, first_wave);
  }
  auto hedge_at = std::chrono::steady_clock::now() + im.cfg.hedge;
  auto deadline = std::chrono::steady_clock::now() + im.cfg.timeout + std::chrono::seconds(1);
  std::vector<std::expected<reply, std::string>> out;
  out.reserve(keys.size());
  for (size_t b = 0; b < keys.size(); ++b) {
    auto& f = flights[b];
    if (!f.g) {
      out.push_back(std::unexpected("kv client: not enough storage nodes"));
      continue;
    }
    {
      std::unique_lock lock(f.c1->mu);
      f.c1->cv.wait_until(lock, hedge_at, [&] { return f.c1->accepted_count >= k || f.c1->all_in(); });
    }
    for (;;) {
      auto [v1, in1] = state_of(f.c1);
      if (v1 >= k) break;
      if (!f.c2 && f.g->actors.size() > first_wave) f.c2 = ask(keys[b], *f.g, first_wave, f.g->actors.size());
      auto [v2, in2] = f.c2 ? state_of(f.c2) : std::pair<int, bool>{0, true};
      if (v1 + v2 >= k || (in1 && in2) || std::chrono::steady_clock::now() >= deadline) break;
      std::unique_lock lock(f.c2 ? f.c2->mu : f.c1->mu);
      (f.c2 ? f.c2->cv : f.c1->cv).wait_for(lock, std::chrono::milliseconds(2));
    }
    std::vector<reply> valid(f.g->actors.size());
    std::vector<storage::chunk_ref> refs;
    std::string why;
    for (auto [c, first] : {std::pair{f.c1, size_t{0}}, std::pair{f.c2, first_wave}}) {
      if (!c) continue;
      std::lock_guard lock(c->mu);
      for (auto& [i, bytes] : c->ok) {
        if (static_cast<int>(refs.size()) >= k) break;
        if (!c->accepted.at(i)) {
          why += (why.empty() ? "" : "; ") + std::string("chunk ") + std::to_string(first + i) + " failed its checksum";
          continue;
        }
        valid[first + i] = std::move(bytes);
        refs.push_back({static_cast<uint32_t>(first + i), valid[first + i]});
      }
      for (const auto& [i, e] : c->failed)
        why += (why.empty() ? "" : "; ") + std::string("chunk ") + std::to_string(first + i) + ": " + e;
    }
    auto block = im.codec.decode(refs);
    if (!block)
      out.push_back(std::unexpected("kv client: block miss: " + block.error().message + (why.empty() ? "" : " (" + why + ")")));
    else
      out.push_back(std::move(*block));
  }
  return out;
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
      q.keys.push_back(chain[b].hi);
      q.keys.push_back(chain[b].lo);
      q.indices.push_back(static_cast<int32_t>(i));
      block_of[group[i]].push_back(b);
    }
  }
  std::vector<storage_node_actor> targets;
  std::vector<size_t> node_of;
  for (size_t n = 0; n < queries.size(); ++n)
    if (!queries[n].indices.empty()) {
      targets.push_back(im.nodes[n].actor);
      node_of.push_back(n);
    }
  nodes_lock.unlock();
  auto c = fan_out<std::vector<uint8_t>>(im.sys, targets, im.cfg.timeout, [&](size_t i) {
    return std::make_tuple(exists_atom_v, queries[node_of[i]]);
  });
  std::unique_lock lock(c->mu);
  c->cv.wait_for(lock, im.cfg.timeout + std::chrono::seconds(1), [&] { return c->all_in(); });
  std::vector<int> held(chain.size(), 0);
  for (const auto& [i, bits] : c->ok) {
    const auto& blocks = block_of[node_of[i]];
    for (size_t j = 0; j < blocks.size() && j < bits.size(); ++j) held[blocks[j]] += bits[j] ? 1 : 0;
  }
  size_t run = 0;
  while (run < chain.size() && held[run] >= im.codec.k()) ++run;
  return run;
}

}  // namespace shoal::actors
