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

#include "actors/interfaces.hpp"
#include "actors/kv_block_store.hpp"
#include "actors/kv_client.hpp"
#include "actors/storage_node_actor.hpp"
#include "tests/support/process.hpp"
#include "tests/support/random.hpp"

using namespace shoal;
using namespace std::chrono_literals;
using actors::block_key;

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
    REQUIRE(c.client->put(chain[b], blocks[b], b % 2));
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
  self->request(c.nodes[group[0]].actor, 5s, corrupt_atom_v, chain[0].hi, chain[0].lo, int32_t{0})
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
  for (uint32_t b = 0; b < 10; ++b) items.push_back({keys[b], blocks[b], 1});
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
      for (uint32_t b = 0; b < 5; ++b) its.push_back({ks[b], mine[b], 0});
      for (const auto& r : c.client->put_many(its)) wrong += r ? 0 : 1;
      auto got = c.client->get_many(ks);
      for (uint32_t b = 0; b < 5; ++b) wrong += (got[b] && *got[b] == mine[b]) ? 0 : 1;
    });
  for (auto& t : threads) t.join();
  CHECK(wrong == 0);
}

TEST_CASE("kv_block_store: fetch_many fills the leading run of blocks and stops at the first miss") {
  storage_cluster c(12);
  auto client = actors::kv_client::create(c.sys, {});
  REQUIRE(client);
  (*client)->set_nodes(c.nodes);
  auto store = std::make_shared<actors::kv_block_store>(std::move(*client), 64, 4);
  std::vector<std::vector<float>> src(6, std::vector<float>(96));
  std::vector<runtime::block_key> keys;
  for (size_t b = 0; b < src.size(); ++b) {
    for (size_t i = 0; i < src[b].size(); ++i) src[b][i] = static_cast<float>(b * 1000 + i) * 0.5f;
    keys.push_back({0x4000 + b, 0x11});
    if (b != 3) REQUIRE(store->store_async(keys[b], src[b], 1));  // block 3 never written
  }
  auto counters = store->stats(true);
  CHECK(counters.written == 5);
  CHECK(counters.failed == 0);
  CHECK(store->lookup(keys) == 3);
  std::vector<std::vector<float>> dst(6, std::vector<float>(96, -1.0f));
  std::vector<std::span<float>> spans(dst.begin(), dst.end());
  CHECK(store->fetch_many(keys, spans) == 3);
  for (size_t b = 0; b < 3; ++b) CHECK(dst[b] == src[b]);
  CHECK(dst[3] == std::vector<float>(96, -1.0f));
  // A destination of another shape is a miss, never a partial copy.
  std::vector<float> small(10, -1.0f);
  CHECK(!store->fetch(keys[0], small));
  CHECK(small == std::vector<float>(10, -1.0f));
}

TEST_CASE("storage node: bad requests get errors naming the problem, the node keeps serving") {
  storage_cluster c(1);
  caf::scoped_actor self{c.sys};
  auto node = c.nodes[0].actor;
  auto r1 = refused<bool>(self, node, put_atom_v, actors::chunk_put{1, 2, 300, 0, {1, 2, 3}});
  REQUIRE(r1);
  CHECK(r1->code == actors::errc::invalid_request);
  CHECK(r1->message.find("chunk index 300") != std::string::npos);
  auto r2 = refused<bool>(self, node, put_atom_v, actors::chunk_put{1, 2, 0, 7, {1, 2, 3}});
  REQUIRE(r2);
  CHECK(r2->message.find("traffic class 7") != std::string::npos);
  auto r3 = refused<bool>(self, node, put_atom_v, actors::chunk_put{1, 2, 0, 0, {}});
  REQUIRE(r3);
  CHECK(r3->code == actors::errc::invalid_request);
  auto r4 = refused<std::vector<uint8_t>>(self, node, get_atom_v, uint64_t{5}, uint64_t{6}, int32_t{0});
  REQUIRE(r4);
  CHECK(r4->code == actors::errc::not_found);
  auto r5 = refused<std::vector<uint8_t>>(self, node, exists_atom_v, actors::chunk_query{{1, 2, 3}, {0, 1}});
  REQUIRE(r5);
  CHECK(r5->message.find("3 key words for 2 chunks") != std::string::npos);
  auto r6 = refused<bool>(self, node, put_atom_v, actors::chunk_put{1, 2, 0, 0, std::vector<uint8_t>(65 << 20, 1)});
  REQUIRE(r6);
  CHECK(r6->code == actors::errc::invalid_request);
  // Still serving.
  bool stored = false;
  self->request(node, 5s, put_atom_v, actors::chunk_put{1, 2, 0, 1, {9, 9, 9}})
    .receive([&](bool ok) { stored = ok; }, [&](caf::error& e) { FAIL(c.sys.render(e)); });
  CHECK(stored);
  std::vector<uint8_t> back;
  self->request(node, 5s, get_atom_v, uint64_t{1}, uint64_t{2}, int32_t{0})
    .receive([&](std::vector<uint8_t>& b) { back = b; }, [&](caf::error& e) { FAIL(c.sys.render(e)); });
  CHECK(back == std::vector<uint8_t>{9, 9, 9});
}
