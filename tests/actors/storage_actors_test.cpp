// Storage node actors over real chunk stores in temp directories, and the kv_client over 12
// of them in one actor system: blocks round-trip bit-exact, survive any 2 lost nodes and a
// corrupt chunk, become a clean miss with a 3rd loss of the same group, and are served again
// by reopened stores; bad requests from a peer get errors naming the problem.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>


#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/interfaces.hpp"
#include "actors/kv_block_store.hpp"
#include "actors/kv_client.hpp"
#include "actors/storage_node_actor.hpp"
#include "tests/support/process.hpp"
#include "runtime/engine/engine.hpp"
#include "tests/support/hung_listener.hpp"
#include "tests/support/random.hpp"
#include "tests/support/tiny_models.hpp"

using namespace shoal;
using namespace std::chrono_literals;
using runtime::block_key;

namespace {

struct system_config : caf::actor_system_config {
  system_config() { actors::add_message_types(*this); }
};

actors::storage_node_config node_config(const std::string& root, uint64_t capacity = 64 << 20) {
  actors::storage_node_config c;
  c.store.root = root;
  c.store.capacity_bytes = capacity;
  c.store.sync = storage::sync_policy::never;
  c.store.now_ms = [] { return int64_t{1'000'000}; };
  return c;
}

struct storage_cluster {
  test::temp_dir dir;
  system_config cfg;
  caf::actor_system sys{cfg};
  std::vector<actors::storage_endpoint> nodes;
  std::unique_ptr<actors::kv_client> client;

  explicit storage_cluster(int n) {
    for (int i = 0; i < n; ++i) start(i);
    actors::kv_client_config kc;
    kc.timeout = 2s;
    auto c = actors::kv_client::create(sys, kc);
    REQUIRE(c);
    client = std::move(*c);
    client->set_nodes(nodes);
  }

  void start(int i) {
    auto a = actors::spawn_storage_node(sys, node_config((dir.path / std::to_string(i)).string()));
    REQUIRE_MESSAGE(a, a.error());
    std::string name = "n" + std::to_string(i) + "/storage0";
    actors::storage_endpoint e{name, a->actor, "127.0.0.1", a->bulk_port};
    if (static_cast<size_t>(i) < nodes.size()) nodes[i] = e;
    else nodes.push_back(e);
  }

  // Returns once the node is down (its bulk server closes as the actor exits).
  void kill(size_t i) {
    caf::anon_send_exit(nodes[i].actor, caf::exit_reason::kill);
    caf::scoped_actor self{sys};
    self->wait_for(nodes[i].actor);
  }

  ~storage_cluster() {
    for (auto& n : nodes) caf::anon_send_exit(n.actor, caf::exit_reason::user_shutdown);
  }
};

// The error reply of a request that must be refused (nullopt when it was answered).
template <class Reply, class... Ts>
std::optional<actors::error_reply> refused(caf::scoped_actor& self, const actors::storage_node_actor& node, Ts... xs) {
  std::optional<actors::error_reply> r;
  self->request(node, 5s, xs...).receive([&](Reply&) {}, [&](caf::error& e) { r = actors::to_error_reply(e); });
  return r;
}

}  // namespace

TEST_CASE("kv_client: blocks round-trip through 12 storage nodes, survive 2 losses and corruption") {
  storage_cluster c(14);  // more nodes than a group: placement picks 12 per block
  std::vector<block_key> chain;
  std::vector<std::vector<uint8_t>> blocks;
  for (uint32_t b = 0; b < 6; ++b) {
    chain.push_back({0x1000 + b, 0xabc0 + b});
    blocks.push_back(test::random_bytes(b == 5 ? 1 : 70'000 + 13 * b, b));
    REQUIRE(c.client->put(chain[b], blocks[b], static_cast<runtime::traffic_class>(b % 2)));
  }
  for (size_t b = 0; b < chain.size(); ++b) {
    auto got = c.client->get(chain[b]);
    REQUIRE_MESSAGE(got, got.error());
    CHECK(*got == blocks[b]);
  }
  CHECK(c.client->lookup(chain) == chain.size());
  std::vector<block_key> longer = chain;
  longer.insert(longer.begin() + 3, block_key{99, 99});  // a block nobody stored ends the run
  CHECK(c.client->lookup(longer) == 3);

  // Placement: 12 distinct nodes, stable for a key.
  auto group = c.client->placement(chain[0]);
  CHECK(group.size() == 12);
  CHECK(std::set<size_t>(group.begin(), group.end()).size() == 12);
  CHECK(c.client->placement(chain[0]) == group);

  // A corrupt chunk is an erasure: the block still decodes bit-exact.
  caf::scoped_actor self{c.sys};
  bool corrupted = false;
  self->request(c.nodes[group[0]].actor, 5s, corrupt_atom_v, chain[0], int32_t{0})
    .receive([&](bool found) { corrupted = found; }, [&](caf::error& e) { FAIL(c.sys.render(e)); });
  REQUIRE(corrupted);
  auto after_corrupt = c.client->get(chain[0]);
  REQUIRE_MESSAGE(after_corrupt, after_corrupt.error());
  CHECK(*after_corrupt == blocks[0]);

  // Any 2 nodes of a block's group down (here: those of chunks 1 and 11): bit-exact still.
  auto g1 = c.client->placement(chain[1]);
  c.kill(g1[1]);
  c.kill(g1[11]);
  auto two_down = c.client->get(chain[1]);
  REQUIRE_MESSAGE(two_down, two_down.error());
  CHECK(*two_down == blocks[1]);
  // A 3rd of the same group: a clean miss naming the problem, never wrong data.
  c.kill(g1[2]);
  auto three_down = c.client->get(chain[1]);
  REQUIRE(!three_down);
  CHECK(three_down.error().find("block miss") != std::string::npos);
  CHECK(three_down.error().find("found 9 valid") != std::string::npos);
  CHECK(c.client->lookup({chain[1]}) == 0);

  // Restarted nodes serve their chunks again (the stores reopen their directories).
  for (size_t i : {g1[1], g1[2], g1[11]}) c.start(static_cast<int>(i));
  c.client->set_nodes(c.nodes);
  for (size_t b = 0; b < chain.size(); ++b) {
    auto got = c.client->get(chain[b]);
    REQUIRE_MESSAGE(got, got.error());
    CHECK(*got == blocks[b]);
  }
}

TEST_CASE("kv_client: put_many and get_many keep per-block results in order, also from several threads") {
  storage_cluster c(12);
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<actors::kv_client::put_item> items;
  std::vector<block_key> keys;
  for (uint32_t b = 0; b < 10; ++b) {
    blocks.push_back(test::random_bytes(20'000 + 7 * b, 100 + b));
    keys.push_back({0x2000 + b, 0x77});
  }
  for (uint32_t b = 0; b < 10; ++b) items.push_back({keys[b], blocks[b], runtime::traffic_class::chat});
  auto puts = c.client->put_many(items);
  REQUIRE(puts.size() == 10);
  for (const auto& r : puts) CHECK_MESSAGE(r, (r ? "" : r.error()));

  // A key nobody stored in the middle of a batch fails alone; the others are bit-exact.
  auto asked = keys;
  asked.insert(asked.begin() + 4, block_key{0xdead, 0xbeef});
  auto gets = c.client->get_many(asked);
  REQUIRE(gets.size() == 11);
  for (size_t i = 0; i < gets.size(); ++i) {
    if (i == 4) {
      REQUIRE(!gets[i]);
      CHECK(gets[i].error().find("block miss") != std::string::npos);
      continue;
    }
    REQUIRE_MESSAGE(gets[i], gets[i].error());
    CHECK(*gets[i] == blocks[i < 4 ? i : i - 1]);
  }

  // Four threads with their own batches at once: every block comes back as written.
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (uint32_t t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::vector<std::vector<uint8_t>> mine;
      std::vector<actors::kv_client::put_item> its;
      std::vector<block_key> ks;
      for (uint32_t b = 0; b < 5; ++b) {
        mine.push_back(test::random_bytes(9'000 + b, 1000 * t + b));
        ks.push_back({0x3000 + t, b});
      }
      for (uint32_t b = 0; b < 5; ++b) its.push_back({ks[b], mine[b], runtime::traffic_class::agent});
      for (const auto& r : c.client->put_many(its)) wrong += r ? 0 : 1;
      auto got = c.client->get_many(ks);
      for (uint32_t b = 0; b < 5; ++b) wrong += (got[b] && *got[b] == mine[b]) ? 0 : 1;
    });
  for (auto& t : threads) t.join();
  CHECK(wrong == 0);
}

TEST_CASE("kv_block_store: a fetch fills the leading run of blocks, stops at the first miss, and reads no other format") {
  storage_cluster c(12);
  auto client = actors::kv_client::create(c.sys, {});
  REQUIRE(client);
  (*client)->set_nodes(c.nodes);
  auto store = std::make_shared<actors::kv_block_store>(std::move(*client), 64, 4);
  const model::kv_format bf16{model::kv_dtype::bf16, 32, 16, 2, 2};  // 96-byte entries, 384-byte blocks
  REQUIRE(bf16.block_bytes() == 384);
  std::vector<std::vector<std::byte>> src(6, std::vector<std::byte>(bf16.block_bytes()));
  std::vector<runtime::block_key> keys;
  for (size_t b = 0; b < src.size(); ++b) {
    for (size_t i = 0; i < src[b].size(); ++i) src[b][i] = static_cast<std::byte>((b * 131 + i * 7) & 0xff);
    keys.push_back({0x4000 + b, 0x11});
    if (b != 3) REQUIRE(store->store_async(keys[b], src[b], bf16, runtime::traffic_class::chat));  // 3 never written
  }
  auto counters = store->stats(true);
  CHECK(counters.written == 5);
  CHECK(counters.failed == 0);
  auto fresh = [&] { return std::vector<std::vector<std::byte>>(6, std::vector<std::byte>(bf16.block_bytes(), std::byte{0xEE})); };
  auto dst = fresh();
  std::vector<std::span<std::byte>> spans(dst.begin(), dst.end());
  auto f = store->start_fetch(keys, spans, bf16);
  f->wait();  // off this thread
  CHECK(f->listed() == 3);
  CHECK(f->blocks() == 3);
  CHECK(f->error().empty());
  CHECK_FALSE(f->other_format());
  for (size_t b = 0; b < 3; ++b) CHECK(dst[b] == src[b]);
  CHECK(dst[3] == fresh()[3]);
  // Another format of the same size (the same shape in fp8 would differ; here fp32 entries of
  // half the values): a counted miss naming both formats, nothing copied.
  const model::kv_format fp32{model::kv_dtype::fp32, 16, 8, 2, 2};
  REQUIRE(fp32.block_bytes() == bf16.block_bytes());
  auto other = fresh();
  std::vector<std::span<std::byte>> other_spans(other.begin(), other.end());
  auto g = store->start_fetch(keys, other_spans, fp32);
  g->wait();
  CHECK(g->blocks() == 0);
  CHECK(g->other_format());
  CHECK(g->error().find("stored as bf16, 32 + 16 values an entry") != std::string::npos);
  CHECK(other == fresh());
  // A destination of another size for the same format is a miss, never a partial copy.
  std::vector<std::byte> small(40, std::byte{0xEE});
  auto h = store->start_fetch({keys[0]}, {std::span<std::byte>(small)}, bf16);
  h->wait();
  CHECK(h->listed() == 1);
  CHECK(h->blocks() == 0);
  CHECK_FALSE(h->other_format());
  CHECK(h->error().find("holds 400 bytes") != std::string::npos);
  CHECK(small == std::vector<std::byte>(40, std::byte{0xEE}));
}

TEST_CASE("storage node: bad requests get errors naming the problem, the node keeps serving") {
  storage_cluster c(1);
  caf::scoped_actor self{c.sys};
  auto node = c.nodes[0].actor;
  auto r1 = refused<bool>(self, node, put_atom_v, actors::chunk_put{{1, 2}, 300, runtime::traffic_class::agent, {1, 2, 3}});
  REQUIRE(r1);
  CHECK(r1->code == actors::errc::invalid_request);
  CHECK(r1->message.find("chunk index 300") != std::string::npos);
  auto r2 = refused<bool>(self, node, put_atom_v, actors::chunk_put{{1, 2}, 0, static_cast<runtime::traffic_class>(7), {1, 2, 3}});
  REQUIRE(r2);
  CHECK(r2->message.find("traffic class 7") != std::string::npos);
  auto r3 = refused<bool>(self, node, put_atom_v, actors::chunk_put{{1, 2}, 0, runtime::traffic_class::agent, {}});
  REQUIRE(r3);
  CHECK(r3->code == actors::errc::invalid_request);
  auto r4 = refused<std::vector<uint8_t>>(self, node, get_atom_v, runtime::block_key{5, 6}, int32_t{0});
  REQUIRE(r4);
  CHECK(r4->code == actors::errc::not_found);
  auto r5 = refused<std::vector<uint8_t>>(self, node, exists_atom_v, actors::chunk_query{{{1, 2}, {3, 4}, {5, 6}}, {0, 1}});
  REQUIRE(r5);
  CHECK(r5->message.find("3 keys for 2 chunk indices") != std::string::npos);
  auto r6 = refused<bool>(self, node, put_atom_v, actors::chunk_put{{1, 2}, 0, runtime::traffic_class::agent, std::vector<uint8_t>(65 << 20, 1)});
  REQUIRE(r6);
  CHECK(r6->code == actors::errc::invalid_request);
  // Still serving.
  bool stored = false;
  self->request(node, 5s, put_atom_v, actors::chunk_put{{1, 2}, 0, runtime::traffic_class::chat, {9, 9, 9}})
    .receive([&](bool ok) { stored = ok; }, [&](caf::error& e) { FAIL(c.sys.render(e)); });
  CHECK(stored);
  std::vector<uint8_t> back;
  self->request(node, 5s, get_atom_v, runtime::block_key{1, 2}, int32_t{0})
    .receive([&](std::vector<uint8_t>& b) { back = b; }, [&](caf::error& e) { FAIL(c.sys.render(e)); });
  CHECK(back == std::vector<uint8_t>{9, 9, 9});
}

namespace {

// Storage nodes that take every request and never answer (hung processes): an actor that
// keeps each request's promise without delivering it, and a bulk port whose listener never
// accepts (the kernel completes the connections, nobody reads).
struct mute_node {
  caf::actor_system& sys;
  actors::storage_node_actor actor;
  test::hung_listener bulk;

  explicit mute_node(caf::actor_system& s) : sys(s) {
    actor = sys.spawn([](actors::storage_node_actor::pointer self) -> actors::storage_node_actor::behavior_type {
      return {
        [self](put_atom, actors::chunk_put&) { return self->make_response_promise<bool>(); },
        [self](get_atom, runtime::block_key, int32_t) { return self->make_response_promise<std::vector<uint8_t>>(); },
        [self](exists_atom, actors::chunk_query&) { return self->make_response_promise<std::vector<uint8_t>>(); },
        [self](stats_atom) { return self->make_response_promise<actors::storage_stats_snapshot>(); },
        [self](corrupt_atom, runtime::block_key, int32_t) { return self->make_response_promise<bool>(); },
        [self](gc_atom) { return self->make_response_promise<uint64_t>(); },
      };
    });
  }
  ~mute_node() { caf::anon_send_exit(actor, caf::exit_reason::user_shutdown); }
  // Takes the place (same name: same placement) of `e`.
  actors::storage_endpoint as(const actors::storage_endpoint& e) const { return {e.name, actor, "127.0.0.1", bulk.port}; }
};

runtime::sampling_params greedy(int32_t n) {
  runtime::sampling_params p;
  p.max_tokens = n;
  p.ignore_eos = true;
  return p;
}

std::shared_ptr<actors::kv_block_store> store_over(caf::actor_system& sys, std::vector<actors::storage_endpoint> nodes) {
  actors::kv_client_config kc;
  kc.timeout = 2s;
  auto client = actors::kv_client::create(sys, kc);
  REQUIRE(client);
  (*client)->set_nodes(std::move(nodes));
  return std::make_shared<actors::kv_block_store>(std::move(*client));
}

}  // namespace

TEST_CASE("engine over storage nodes that hang: one is read around, three delay only the request reading them") {
  storage_cluster c(12);
  auto w = test::tiny_model("v3-tiny");
  const int64_t bs = w->config.block_size;
  auto written = store_over(c.sys, c.nodes);
  auto wcfg = test::exact_engine_config(256);
  wcfg.cache.remote = written;
  runtime::engine writer(w, wcfg), cold(w, test::exact_engine_config(256));
  auto prompt = test::random_tokens(static_cast<size_t>(4 * bs), 91);
  test::run_alone(writer, prompt, greedy(2));
  REQUIRE(written->stats(true).written == 4);
  prompt.push_back(5);  // its 4 full blocks are in the cluster
  const auto ref = test::run_alone(cold, prompt, greedy(4));
  std::vector<std::unique_ptr<mute_node>> mute;
  for (int i = 0; i < 3; ++i) mute.push_back(std::make_unique<mute_node>(c.sys));

  // One hung node of 12: the lookup is decided by the other 11 and the get is hedged past it,
  // well within the engine's 1 s deadline (the client's own timeout is 2 s).
  {
    auto nodes = c.nodes;
    nodes[0] = mute[0]->as(nodes[0]);
    auto cfg = test::exact_engine_config(256);
    cfg.cache.remote = store_over(c.sys, nodes);
    cfg.cache.remote_timeout_s = 1.0;
    runtime::engine reader(w, cfg);
    auto got = test::run_alone(reader, prompt, greedy(4));
    REQUIRE(got.size() == ref.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i].logits == ref[i].logits);
    CHECK(reader.stats().cache.remote_hit_tokens == static_cast<uint64_t>(4 * bs));
    CHECK(reader.stats().cache.remote_timeouts == 0);
  }

  // Three hung nodes: no block can be decided without them. The request that reads waits; the
  // engine's other requests (shorter than a block: nothing to read) complete meanwhile; at its
  // deadline the waiting one recomputes, with the cold logits.
  auto nodes = c.nodes;
  for (int i = 0; i < 3; ++i) nodes[static_cast<size_t>(i)] = mute[static_cast<size_t>(i)]->as(nodes[static_cast<size_t>(i)]);
  auto cfg = test::exact_engine_config(256);
  cfg.cache.remote = store_over(c.sys, nodes);
  cfg.cache.remote_timeout_s = 1.0;
  runtime::engine reader(w, cfg);
  auto waiting = reader.add_request(prompt, greedy(4));
  REQUIRE(waiting);
  std::vector<request_id> others;
  for (uint32_t i = 0; i < 3; ++i) {
    auto o = reader.add_request(test::random_tokens(static_cast<size_t>(bs - 1), 300 + i), greedy(4));
    REQUIRE(o);
    others.push_back(*o);
  }
  std::map<int64_t, std::vector<runtime::token_event>> events;
  auto finished = [&](request_id id) { return !events[id.value].empty() && events[id.value].back().finished; };
  auto step_until = [&](auto done, std::chrono::seconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!done() && std::chrono::steady_clock::now() < end) {
      for (auto& ev : reader.step()) events[ev.id.value].push_back(ev);
      if (reader.stalled()) std::this_thread::sleep_for(1ms);
    }
  };
  step_until([&] { return std::all_of(others.begin(), others.end(), finished); }, 10s);
  for (auto id : others) CHECK(finished(id));
  CHECK(events[waiting->value].empty());  // still waiting on the hung nodes
  CHECK(reader.stats().waiting_for_remote == 1);
  step_until([&] { return finished(*waiting); }, 10s);
  REQUIRE(events[waiting->value].size() == ref.size());
  for (size_t i = 0; i < ref.size(); ++i) CHECK(events[waiting->value][i].logits == ref[i].logits);
  CHECK(reader.stats().cache.remote_timeouts == 1);
  CHECK(reader.stats().cache.remote_hit_tokens == 0);
}
