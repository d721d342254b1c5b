// The KV-cache storage cluster as processes: 12 storage nodes (one shoald each), three engine
// nodes with the storage tier on, and a gateway, started by `shoal up` on a deepseek_v3 tiny
// checkpoint. A prompt computed once on one engine is a prefix hit for an engine on another
// node (cached tokens in the usage, same greedy text as a cold computation); with 2 storage
// nodes killed -9 the blocks are still read; with a 3rd the read is a miss and the request is
// recomputed correctly; restarted storage nodes serve their chunks again; a storage node
// killed -9 under a write load comes back with only whole chunks.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/http_client.hpp"
#include "actors/interfaces.hpp"
#include "actors/kv_client.hpp"
#include "runtime/core/block_pool.hpp"
#include "runtime/engine/engine_setup.hpp"
#include "storage/erasure.hpp"
#include "tests/support/cluster.hpp"
#include "tests/support/random.hpp"
#include "tools/shoald/engine_options.hpp"

using namespace shoal;
using namespace std::chrono_literals;
using nlohmann::json;
using test::read_text;
using test::write_text;
namespace fs = std::filesystem;

namespace {

constexpr int storage_nodes = 12;

struct storage_cluster {
  test::temp_dir dir;
  fs::path model_dir, config_dir, state_dir;
  uint16_t seed_port = 0, http_port = 0;
  std::map<std::string, fs::path> configs;  // node name → its config file
  std::map<std::string, uint16_t> bulk_ports;  // storage nodes with a configured bulk port
  std::optional<runtime::loaded_model> model;
  bool up = false;

  storage_cluster() {
    model_dir = dir.path / "model";
    config_dir = dir.path / "config";
    state_dir = dir.path / "state";
    fs::create_directories(config_dir);
    model = test::generated_model(model_dir, "v3-tiny", 5);
    seed_port = test::free_port();
    http_port = test::free_port();
    add("gateway", "[\"gateway\"]", "[gateway]\nlisten = \"127.0.0.1:" + std::to_string(http_port) + "\"\n", false, true);
    for (const char* e : {"engine-a", "engine-b", "engine-c"})
      add(e, "[\"engine\"]", "[engine]\nranks = 1\ncache_mib = 32\nkv_storage = true\n", true, true);
    for (int i = 0; i < storage_nodes; ++i) {
      char name[32];
      std::snprintf(name, sizeof name, "storage-%02d", i);
      // The first half serve chunks on a configured port, the rest on any free one (restarted
      // nodes of the second half come back on a new port, learnt through the membership).
      std::string bulk;
      if (i < storage_nodes / 2) {
        bulk_ports[name] = test::free_port();
        bulk = "bulk_port = " + std::to_string(bulk_ports[name]) + "\n";
      }
      add(name, "[\"storage\"]",
          "[storage]\ndir = \"" + (dir.path / "chunks" / name).string() + "\"\ncapacity_mib = 64\nfsync = \"never\"\n" +
            bulk,
          true, false);
    }
  }

  void add(const std::string& name, const std::string& roles, const std::string& section, bool seeded, bool model) {
    fs::path p = config_dir / (name + ".toml");
    write_text(p, test::node_config_text(name, name == "gateway" ? seed_port : test::free_port(), roles,
                                         model ? model_dir : fs::path(), section, seeded ? seed_port : 0));
    configs[name] = p;
  }

  int shoal(std::vector<std::string> args, std::string& out) { return test::run_shoal(dir.path, std::move(args), out); }

  std::map<std::string, pid_t> pids() const { return test::cluster_pids(state_dir); }

  ~storage_cluster() {
    if (up) test::cluster_down(dir.path, state_dir);
  }

  json complete(const std::string& prompt, int max_tokens) {
    json body = {{"model", "model"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
    auto r = actors::http_call("127.0.0.1", http_port, "POST", "/v1/completions", body.dump());
    REQUIRE_MESSAGE(r, r.error());
    REQUIRE_MESSAGE(r->status == 200, r->body);
    return json::parse(r->body);
  }

  std::string offline(const std::string& prompt, int max_tokens) {
    runtime::engine e(model->weights, tools::shoald::engine_config_for(model->weights->config));
    runtime::sampling_params p;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    auto id = e.add_request(runtime::encode_prompt(*model->tokenizer, prompt), p);
    REQUIRE(id);
    return test::as_json_text(model->tokenizer->decode(e.run_to_completion().at(0).output));
  }
};

struct client_config : caf::actor_system_config {
  client_config() {
    load<caf::io::middleman>();
    actors::add_message_types(*this);
  }
};

// Chunks held by each storage node, by node name, through the seed's membership.
std::map<std::string, uint64_t> chunks_by_node(caf::actor_system& sys, uint16_t seed_port) {
  std::map<std::string, uint64_t> out;
  auto agent = sys.middleman().remote_actor<actors::node_agent_actor>("127.0.0.1", seed_port);
  REQUIRE(agent);
  caf::scoped_actor self{sys};
  actors::membership m;
  self->request(*agent, 10s, members_atom_v).receive([&](actors::membership& x) { m = x; }, [&](caf::error&) {});
  for (const auto& n : m.nodes)
    for (const auto& s : n.storage)
      self->request(caf::actor_cast<actors::storage_node_actor>(s), 10s, stats_atom_v)
        .receive([&](const actors::storage_stats_snapshot& st) { out[n.name] = st.chunks; }, [&](caf::error&) {});
  return out;
}

uint64_t total(const std::map<std::string, uint64_t>& m) {
  uint64_t t = 0;
  for (const auto& [n, c] : m) t += c;
  return t;
}

}  // namespace

TEST_CASE("storage cluster: a prefix computed on one engine is read by others, survives 2 lost storage nodes") {
  storage_cluster c;
  std::string out;
  REQUIRE_MESSAGE(c.shoal({"up", "--config", c.config_dir.string(), "--state-dir", c.state_dir.string(),
                           "--timeout", "120"}, out) == 0, out);
  c.up = true;
  std::string at = "--connect=127.0.0.1:" + std::to_string(c.seed_port);
  const int64_t bs = c.model->weights->config.block_size;
  std::string prompt = "The storage cluster keeps every block of this prompt in ten data and two parity chunks, ";
  while (static_cast<int64_t>(runtime::encode_prompt(*c.model->tokenizer, prompt).size()) < 2 * bs + 10)
    prompt += "again and again, ";
  const int n = 8;
  const std::string expected = c.offline(prompt, n);
  const auto prompt_len = static_cast<int64_t>(runtime::encode_prompt(*c.model->tokenizer, prompt).size());
  const int64_t full_blocks = prompt_len / bs;                // a later request's prefix hit
  const int64_t stored_blocks = (prompt_len + n - 1) / bs;    // full blocks computed (the last token is not)

  // 1. engine-a (the router's first choice while all are idle) computes it; its blocks are
  //    written back to every storage node (12 nodes: every placement group is all of them).
  json first = c.complete(prompt, n);
  CHECK(first["choices"][0]["text"] == expected);
  CHECK(first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);
  client_config cfg;
  caf::actor_system sys{cfg};
  auto deadline = std::chrono::steady_clock::now() + 30s;
  std::map<std::string, uint64_t> chunks;
  while ((chunks = chunks_by_node(sys, c.seed_port), total(chunks)) < static_cast<uint64_t>(stored_blocks * storage_nodes) &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(100ms);
  CHECK(chunks.size() == storage_nodes);
  CHECK(total(chunks) == static_cast<uint64_t>(stored_blocks * storage_nodes));
  {  // every storage node advertises its bulk port; the configured ones are where they were asked
    auto agent = sys.middleman().remote_actor<actors::node_agent_actor>("127.0.0.1", c.seed_port);
    REQUIRE(agent);
    caf::scoped_actor self{sys};
    actors::membership m;
    self->request(*agent, 10s, members_atom_v).receive([&](actors::membership& x) { m = x; }, [&](caf::error&) {});
    int with_ports = 0;
    for (const auto& n : m.nodes) {
      if (n.storage.empty()) continue;
      REQUIRE(n.storage_ports.size() == 1);
      CHECK(n.storage_ports[0] != 0);
      if (auto it = c.bulk_ports.find(n.name); it != c.bulk_ports.end()) {
        CHECK(n.storage_ports[0] == it->second);
        ++with_ports;
      }
    }
    CHECK(with_ports == storage_nodes / 2);
  }

  // 2. engine-a drains; with 2 storage nodes killed -9, engine-b reads the prefix from the rest.
  REQUIRE(c.shoal({"shell", at, "-c", "storage; drain engine-a"}, out) == 0);
  CHECK(out.find("12 storage node(s)") != std::string::npos);
  CHECK(out.find("storage-05/storage0: chunks=" + std::to_string(stored_blocks) + " ") != std::string::npos);
  CHECK(out.find("watermarks=90%/70%") != std::string::npos);
  auto pids = c.pids();
  REQUIRE(kill(pids.at("storage-03"), SIGKILL) == 0);
  REQUIRE(kill(pids.at("storage-07"), SIGKILL) == 0);
  std::this_thread::sleep_for(3s);  // the heartbeat timeout removes them from the views
  json second = c.complete(prompt, n);
  CHECK(second["choices"][0]["text"] == expected);
  REQUIRE(c.shoal({"shell", at, "-c", "stats engine-b/rank0; stats engine-c/rank0; storage; drain engine-b"}, out) == 0);
  // On a miss the engines' remote counters and last read error say which step fell short.
  CHECK_MESSAGE(second["usage"]["prompt_tokens_details"]["cached_tokens"] == full_blocks * bs, out);
  CHECK_MESSAGE(out.find("prefix_hit_tokens=" + std::to_string(full_blocks * bs)) != std::string::npos, out);

  // 3. A 3rd storage node down: fewer than 10 chunks anywhere, engine-c misses and recomputes.
  REQUIRE(kill(pids.at("storage-11"), SIGKILL) == 0);
  std::this_thread::sleep_for(3s);
  json third = c.complete(prompt, n);
  CHECK(third["choices"][0]["text"] == expected);
  CHECK(third["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);

  // 4. Restarted storage nodes rejoin and serve their chunks again (index rebuilt from disk).
  std::vector<std::unique_ptr<test::child_process>> restarted;  // killed when the test ends
  for (const char* name : {"storage-03", "storage-07", "storage-11"})
    restarted.push_back(std::make_unique<test::child_process>(
      std::vector<std::string>{SHOAL_SHOALD_BIN, "--config", c.configs.at(name).string()},
      c.dir.path / (std::string(name) + ".restart.out"), c.dir.path / (std::string(name) + ".restart.err")));
  std::this_thread::sleep_for(3s);
  chunks = chunks_by_node(sys, c.seed_port);
  CHECK(chunks.size() == storage_nodes);
  for (const char* name : {"storage-03", "storage-07", "storage-11"}) CHECK(chunks[name] == static_cast<uint64_t>(stored_blocks));
  auto client = actors::kv_client::create(sys, {});
  REQUIRE(client);
  {
    auto agent = sys.middleman().remote_actor<actors::node_agent_actor>("127.0.0.1", c.seed_port);
    REQUIRE(agent);
    caf::scoped_actor self{sys};
    self->request(*agent, 10s, members_atom_v)
      .receive([&](actors::membership& m) { (*client)->set_nodes(actors::kv_client::nodes_of(m)); }, [&](caf::error&) {});
  }
  auto chain = runtime::chain_keys(runtime::encode_prompt(*c.model->tokenizer, prompt), static_cast<int>(bs));
  CHECK((*client)->lookup(chain) == static_cast<size_t>(full_blocks));  // the prompt's full blocks
  auto block = (*client)->get(chain[0]);
  CHECK_MESSAGE(block, (block ? "" : block.error()));

  // 5. kill -9 of a storage node in the middle of a write load, then a restart: every block
  //    whose put was acknowledged reads back bit-exact, and every chunk the restarted node
  //    returns is whole and exactly the chunk that was sent (encoding is deterministic).
  std::vector<runtime::block_key> written;
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<bool> acked;
  {
    std::atomic<bool> stop{false};
    std::thread writer([&] {
      for (uint64_t b = 0; !stop && b < 4000; b += 4) {
        std::vector<actors::kv_client::put_item> items;
        for (uint64_t i = b; i < b + 4; ++i) {
          written.push_back({0x5eed0000 + i, 0xc0ffee});
          payloads.push_back(test::random_bytes(30'000 + 17 * i, static_cast<uint32_t>(i)));
        }
        for (uint64_t i = b; i < b + 4; ++i) items.push_back({written[i], payloads[i], runtime::traffic_class::chat});
        for (const auto& r : (*client)->put_many(items)) acked.push_back(r.has_value());
      }
    });
    std::this_thread::sleep_for(700ms);
    REQUIRE(kill(pids.at("storage-05"), SIGKILL) == 0);
    std::this_thread::sleep_for(700ms);
    stop = true;
    writer.join();
  }
  REQUIRE(written.size() == acked.size());
  restarted.push_back(std::make_unique<test::child_process>(
    std::vector<std::string>{SHOAL_SHOALD_BIN, "--config", c.configs.at("storage-05").string()},
    c.dir.path / "storage-05.restart.out", c.dir.path / "storage-05.restart.err"));
  std::this_thread::sleep_for(3s);
  actors::storage_node_actor node05;
  {
    auto agent = sys.middleman().remote_actor<actors::node_agent_actor>("127.0.0.1", c.seed_port);
    REQUIRE(agent);
    caf::scoped_actor self{sys};
    self->request(*agent, 10s, members_atom_v)
      .receive(
        [&](actors::membership& m) {
          (*client)->set_nodes(actors::kv_client::nodes_of(m));
          for (const auto& n : m.nodes)
            if (n.name == "storage-05" && !n.storage.empty())
              node05 = caf::actor_cast<actors::storage_node_actor>(n.storage[0]);
        },
        [&](caf::error&) {});
  }
  REQUIRE(node05);
  size_t acked_count = 0, exact = 0;
  for (size_t i = 0; i < written.size(); ++i) {
    if (!acked[i]) continue;
    ++acked_count;
    auto got = (*client)->get(written[i]);
    if (got && *got == payloads[i]) ++exact;
  }
  CHECK(acked_count > 20);
  CHECK(exact == acked_count);
  // The restarted node: which chunk of each block it holds (one index per block, or none), and
  // that chunk compared byte for byte with a fresh encoding of the block.
  auto codec = storage::ec_codec::create(10, 2);
  REQUIRE(codec);
  caf::scoped_actor self{sys};
  actors::chunk_query q;
  for (const auto& k : written)
    for (int32_t idx = 0; idx < storage_nodes; ++idx) {
      q.keys.push_back(k);
      q.indices.push_back(idx);
    }
  std::vector<uint8_t> held;
  self->request(node05, 10s, exists_atom_v, q)
    .receive([&](std::vector<uint8_t>& bits) { held = std::move(bits); }, [&](caf::error& e) { FAIL(sys.render(e)); });
  REQUIRE(held.size() == q.indices.size());
  size_t returned = 0, whole = 0;
  for (size_t i = 0; i < written.size(); ++i)
    for (int32_t idx = 0; idx < storage_nodes; ++idx) {
      if (!held[i * storage_nodes + static_cast<size_t>(idx)]) continue;
      auto chunks = codec->encode(payloads[i]);
      REQUIRE(chunks);
      self->request(node05, 10s, get_atom_v, written[i], idx)
        .receive(
          [&](std::vector<uint8_t>& bytes) {
            ++returned;
            whole += bytes == (*chunks)[static_cast<size_t>(idx)] ? 1 : 0;
          },
          [&](caf::error& e) { FAIL("restarted node lists chunk it cannot serve: " << sys.render(e)); });
    }
  CHECK(returned > 0);
  CHECK(whole == returned);
  MESSAGE("kill -9 under writes: " << written.size() << " blocks put, " << acked_count << " acknowledged, "
          << returned << " chunks on the restarted node, all whole");
  std::fflush(stdout);
}
