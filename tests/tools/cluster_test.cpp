// The 3-process loopback cluster as `shoal up` starts it (gateway node + two engine nodes
// with 2 ranks each, the 4 ranks one expert-parallel group across both processes) on a tiny
// checkpoint: greedy completions and chat completions, streamed and not, equal the offline
// engine's; the operator shell scripts a session; kill -9 of an engine node under 50
// concurrent streams ends every request (completed or a clear error) and the survivor keeps
// serving; SIGSTOP of a node is detected within the connection timeout, and after SIGCONT
// the node is back in every member's view (the partition heals) and the cluster serves.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/http_client.hpp"
#include "actors/interfaces.hpp"
#include "model/forward.hpp"
#include "runtime/serve/chat_template.hpp"
#include "runtime/engine/engine_setup.hpp"
#include "tests/support/cluster.hpp"
#include "tools/shoald/engine_options.hpp"

using namespace shoal;
using namespace std::chrono_literals;
using nlohmann::json;
using test::completion_body;
using test::stream_text;
using test::read_text;
using test::temp_dir;
using test::write_text;
namespace fs = std::filesystem;

namespace {

constexpr int64_t connection_timeout_ms = 2000;

struct cluster {
  temp_dir dir;
  fs::path model_dir, config_dir, state_dir;
  uint16_t gateway_port = 0, http_port = 0, engine_a_port = 0, engine_b_port = 0;
  uint16_t metrics_a_port = 0, metrics_b_port = 0;  // the engine nodes' node.metrics_listen
  std::optional<runtime::loaded_model> model;
  bool up = false;

  cluster() {
    model_dir = dir.path / "model";
    config_dir = dir.path / "config";
    state_dir = dir.path / "state";
    fs::create_directories(config_dir);
    model = test::generated_model(model_dir, "tiny", 11);
    gateway_port = test::free_port();
    http_port = test::free_port();
    engine_a_port = test::free_port();
    engine_b_port = test::free_port();
    metrics_a_port = test::free_port();
    metrics_b_port = test::free_port();
    write_text(config_dir / "gateway.toml", node_toml("gateway", gateway_port, "[\"gateway\"]",
                                                      "[gateway]\nlisten = \"127.0.0.1:" + std::to_string(http_port) +
                                                        "\"\n", false));
    std::string engine = "[engine]\nranks = 2\nexpert_parallel = true\ncache_mib = 64\n";
    write_text(config_dir / "engine-a.toml", node_toml("engine-a", engine_a_port, "[\"engine\"]", engine, true, metrics_a_port));
    write_text(config_dir / "engine-b.toml", node_toml("engine-b", engine_b_port, "[\"engine\"]", engine, true, metrics_b_port));
  }

  std::string node_toml(const std::string& name, uint16_t port, const std::string& roles, const std::string& extra,
                        bool seeded, uint16_t metrics_port = 0) const {
    return "[node]\nname = \"" + name + "\"\nlisten = \"127.0.0.1:" + std::to_string(port) + "\"\nroles = " + roles +
           (metrics_port ? "\nmetrics_listen = \"127.0.0.1:" + std::to_string(metrics_port) + "\"" : std::string()) +
           "\nmodel_dir = \"" + model_dir.string() + "\"\ndrain_timeout_ms = 10000\n\n" + extra +
           "\n[cluster]\nseeds = [" + (seeded ? "\"127.0.0.1:" + std::to_string(gateway_port) + "\"" : "") +
           "]\nheartbeat_interval_ms = 300\nconnection_timeout_ms = " + std::to_string(connection_timeout_ms) +
           "\nrequest_timeout_ms = 30000\n\n[log]\nlevel = \"debug\"\n";
  }

  int shoal(std::vector<std::string> args, std::string& out) { return test::run_shoal(dir.path, std::move(args), out); }

  void start() {
    std::string out;
    int rc = shoal({"up", "--config", config_dir.string(), "--state-dir", state_dir.string(), "--timeout", "120"}, out);
    REQUIRE_MESSAGE(rc == 0, out);
    up = true;
  }

  std::map<std::string, pid_t> pids() const { return test::cluster_pids(state_dir); }

  ~cluster() {
    if (up) test::cluster_down(dir.path, state_dir);
  }

  std::expected<actors::http_response, std::string> post(const std::string& path, const json& body,
                                                         actors::http_call_options opts = {}) const {
    return actors::http_call("127.0.0.1", http_port, "POST", path, body.dump(), opts);
  }

  // What the offline engine generates greedily for each prompt (token ids), decoded.
  std::vector<std::string> offline(const std::vector<std::vector<int32_t>>& prompts, int32_t max_tokens) const {
    runtime::engine local(model->weights, tools::shoald::engine_config_for(model->weights->config));
    runtime::sampling_params p;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    std::map<int64_t, size_t> index;
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto id = local.add_request(prompts[i], p);
      REQUIRE(id);
      index[id->value] = i;
    }
    std::vector<std::string> out(prompts.size());
    for (auto& c : local.run_to_completion()) out[index.at(c.id.value)] = test::as_json_text(model->tokenizer->decode(c.output));
    return out;
  }
};

}  // namespace

TEST_CASE("3-process cluster: completions and chat, streamed and not, equal the offline engine, and the shell") {
  cluster c;
  c.start();
  auto post = [&](const std::string& path, const json& body) { return c.post(path, body); };
  auto expected = [&](const std::vector<int32_t>& ids, int32_t n) { return c.offline({ids}, n)[0]; };
  test::check_api_forms(post, *c.model->tokenizer, c.model_dir, 12, expected,
                        {"The quick brown fox", "jumps over", "the lazy dog, twice and again"}, "hello there");
  const std::string first_prompt = "The quick brown fox";
  const int32_t n = 12;

  // Every rank of the group stepped (lockstep), whichever engines the prefill balancer chose.
  std::string out;
  std::string at = "--connect=127.0.0.1:" + std::to_string(c.gateway_port);
  int rc = c.shoal({"shell", at, "-c",
                    "nodes; actors; stats engine-a/rank0; stats engine-b/rank1; requests; submit hello world; "
                    "drain engine-b; nodes"},
                   out);
  CHECK_MESSAGE(rc == 0, out);
  CHECK(out.find("engine-a         127.0.0.1:" + std::to_string(c.engine_a_port)) != std::string::npos);
  CHECK(out.find("engine-b/rank1  (engine + expert-parallel rank)") != std::string::npos);
  CHECK(out.find("gateway/gateway  (gateway: HTTP API, request relays)") != std::string::npos);
  CHECK(out.find("gateway/prefill_balancer  (balancer)") != std::string::npos);
  CHECK(out.find("gateway/decode_balancer  (balancer)") != std::string::npos);
  CHECK(out.find("rank1: running=0 steps=") != std::string::npos);
  CHECK_MESSAGE(out.find("steps=0 ") == std::string::npos, out);
  // Partitioned weights: each engine process holds only its two ranks' half of the routed
  // experts (ranks 0-1 on engine-a, 2-3 on engine-b), every expert once in the group.
  {
    const model::model_weights& w = *c.model->weights;
    const int64_t E = w.config.n_routed_experts, slots = model::moe_slot_count(w.config);
    double all_bytes = 0;
    for (int64_t s = 0; s < slots; ++s)
      for (int64_t e = 0; e < E; ++e) {
        const auto& x = model::routed_expert_weights(const_cast<model::model_weights&>(w), s, e);
        all_bytes += static_cast<double>(x.gate_up.bytes() + x.down.bytes());
      }
    double bytes = 0;
    for (uint16_t port : {c.metrics_a_port, c.metrics_b_port}) {
      auto r = actors::http_call("127.0.0.1", port, "GET", "/metrics", "");
      REQUIRE_MESSAGE(r, r.error());
      auto value = [&](const std::string& series) {
        std::smatch m;
        REQUIRE_MESSAGE(std::regex_search(r->body, m, std::regex(series + " ([0-9.e+-]+)\\n")), series << "\n" << r->body);
        return std::stod(m[1]);
      };
      CHECK(value("shoal_engine_experts_resident\\{actor=\"node\"\\}") == static_cast<double>(slots * (E / 2)));
      bytes += value("shoal_engine_experts_resident_bytes\\{actor=\"node\"\\}");
    }
    CHECK(bytes == all_bytes);
  }
  CHECK(out.find("0 request(s) in flight") != std::string::npos);
  CHECK(out.find("[length]") != std::string::npos);
  CHECK(out.find("engine-b: draining") != std::string::npos);
  CHECK(out.find("draining\n") != std::string::npos);
  // A failing command makes the exit code 1; an unreachable node is a clear message.
  CHECK(c.shoal({"shell", at, "-c", "nodes; stats nowhere/rank9"}, out) == 1);
  CHECK(out.find("no node 'nowhere'") != std::string::npos);
  CHECK(c.shoal({"shell", "--connect=127.0.0.1:1", "-c", "nodes"}, out) == 1);
  CHECK(out.find("cannot reach a shoal node at 127.0.0.1:1") != std::string::npos);
  // The drained node takes no new requests; the other engine node serves them.
  auto after = c.post("/v1/completions", completion_body(first_prompt, n, false));
  REQUIRE(after);
  CHECK(after->status == 200);
}

TEST_CASE("3-process cluster: kill -9 of an engine node under 50 streams fails none, every text exact, the survivor serves") {
  cluster c;
  c.start();
  const int streams = 50;
  const int32_t n = 40;
  std::vector<std::string> prompts;
  for (int i = 0; i < streams; ++i) prompts.push_back("request number " + std::to_string(i) + " says");
  std::vector<std::vector<int32_t>> ids;
  for (const auto& p : prompts) ids.push_back(runtime::encode_prompt(*c.model->tokenizer, p));
  std::vector<std::string> expected = c.offline(ids, n);

  // Kill engine-b once streams are flowing.
  auto pids = c.pids();
  REQUIRE(pids.contains("engine-b"));
  auto post = [&](const std::string& path, const json& body, actors::http_call_options o) { return c.post(path, body, o); };
  auto got = test::streams_with_kill(post, prompts, n, 1, pids["engine-b"]);
  CHECK(got.seconds < 110);  // bounded: nothing hung until the client timeout

  int completed = 0, failed = 0;
  for (int i = 0; i < streams; ++i) {
    CAPTURE(i);
    CHECK(got.done[i]);  // every stream ended properly with [DONE]
    if (got.errors[i].empty()) {
      CHECK(got.texts[i] == expected[i]);  // re-routed requests recomputed the same tokens
      ++completed;
    } else {
      ++failed;
      MESSAGE("request " << i << " failed: " << got.errors[i]);
    }
  }
  MESSAGE(completed << " completed, " << failed << " failed with an error");
  CHECK(failed == 0);  // the lost engine's requests were re-routed and recomputed, none failed
  CHECK(completed == streams);

  // The survivor keeps serving, and the gateway's view no longer has engine-b.
  auto r = c.post("/v1/completions", completion_body(prompts[0], n, false));
  REQUIRE(r);
  CHECK_MESSAGE(r->status == 200, r->body);
  if (r->status == 200) CHECK(json::parse(r->body)["choices"][0]["text"] == expected[0]);
  std::string out;
  CHECK(c.shoal({"shell", "--connect=127.0.0.1:" + std::to_string(c.gateway_port), "-c", "nodes"}, out) == 0);
  CHECK(out.find("engine-b") == std::string::npos);
}

namespace {

// A node of the cluster to SIGSTOP; resumed (SIGCONT) at the latest when the test ends.
struct stoppable {
  pid_t pid = -1;
  stoppable(const std::map<std::string, pid_t>& pids, const std::string& name) {
    REQUIRE(pids.contains(name));
    pid = pids.at(name);
  }
  void stop() const { REQUIRE(kill(pid, SIGSTOP) == 0); }
  void resume() const { REQUIRE(kill(pid, SIGCONT) == 0); }
  ~stoppable() { kill(pid, SIGCONT); }
};

// The test's own actor system, to talk to the nodes' agents.
struct client_config : caf::actor_system_config {
  client_config() {
    load<caf::io::middleman>();
    actors::add_message_types(*this);
  }
};
struct client_system : client_config, caf::actor_system {
  client_system() : caf::actor_system(static_cast<client_config&>(*this)) {}
};

}  // namespace

TEST_CASE("3-process cluster: a SIGSTOPped node is detected within the connection timeout") {
  cluster c;
  c.start();
  stoppable node{c.pids(), "engine-a"};
  node.stop();
  auto t0 = std::chrono::steady_clock::now();
  client_system sys;
  auto agent = sys.middleman().remote_actor<actors::node_agent_actor>("127.0.0.1", c.gateway_port);
  REQUIRE(agent);
  caf::scoped_actor self{sys};
  bool gone = false;
  // How soon is CAF's connection timeout (the middleman's heartbeats), reported below; the
  // check is that the real daemons notice at all, with room for a loaded machine.
  while (!gone && std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(10 * connection_timeout_ms)) {
    self->request(*agent, 5s, members_atom_v)
      .receive(
        [&](const actors::membership& m) {
          gone = std::none_of(m.nodes.begin(), m.nodes.end(), [](const auto& n) { return n.name == "engine-a"; });
        },
        [&](caf::error&) {});
    if (!gone) std::this_thread::sleep_for(50ms);
  }
  double waited_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("SIGSTOP detected after " << waited_ms << " ms (connection timeout " << connection_timeout_ms << " ms)");
  CHECK(gone);
  // Requests still complete on the other engine node.
  auto r = c.post("/v1/completions", completion_body("still serving", 8, false));
  REQUIRE(r);
  CHECK_MESSAGE(r->status == 200, r->body);
}

TEST_CASE("3-process cluster: a node stopped past the connection timeout is back in every view after SIGCONT") {
  cluster c;
  c.start();
  stoppable node{c.pids(), "engine-a"};
  client_system sys;
  caf::scoped_actor self{sys};
  auto names_at = [&](uint16_t port) {
    std::vector<std::string> out;
    auto agent = sys.middleman().remote_actor<actors::node_agent_actor>("127.0.0.1", port);
    if (!agent) return out;
    self->request(*agent, 5s, members_atom_v)
      .receive([&](const actors::membership& m) { for (const auto& n : m.nodes) out.push_back(n.name); },
               [&](caf::error&) {});
    return out;
  };
  const std::vector<std::string> all = {"engine-a", "engine-b", "gateway"};
  REQUIRE(names_at(c.gateway_port) == all);
  node.stop();
  auto t0 = std::chrono::steady_clock::now();
  while (names_at(c.gateway_port).size() == 3 &&
         std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(4 * connection_timeout_ms))
    std::this_thread::sleep_for(50ms);
  REQUIRE(names_at(c.gateway_port) == std::vector<std::string>{"engine-b", "gateway"});
  node.resume();
  auto t1 = std::chrono::steady_clock::now();
  bool healed = false;
  while (!healed && std::chrono::steady_clock::now() - t1 < 30s) {
    healed = names_at(c.gateway_port) == all && names_at(c.engine_b_port) == all && names_at(c.engine_a_port) == all;
    if (!healed) std::this_thread::sleep_for(100ms);
  }
  const double healed_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
  MESSAGE("every view holds all 3 nodes " << healed_ms << " ms after SIGCONT");
  CHECK(healed);
  auto r = c.post("/v1/completions", completion_body("healed", 8, false));
  REQUIRE(r);
  CHECK_MESSAGE(r->status == 200, r->body);
}

TEST_CASE("3-process cluster: SIGSTOP of an engine node under 30 streams fails none, after SIGCONT its group is whole") {
  cluster c;
  c.start();
  const int streams = 30;
  const int32_t n = 40;
  std::vector<std::string> prompts;
  std::vector<std::vector<int32_t>> ids;
  for (int i = 0; i < streams; ++i) {
    prompts.push_back("stopped stream " + std::to_string(i) + " says");
    ids.push_back(runtime::encode_prompt(*c.model->tokenizer, prompts.back()));
  }
  const std::vector<std::string> expected = c.offline(ids, n);
  stoppable node{c.pids(), "engine-b"};
  auto post = [&](const std::string& path, const json& body, actors::http_call_options o) { return c.post(path, body, o); };
  auto got = test::streams_with_fault(post, prompts, n, 1, [&] { return kill(node.pid, SIGSTOP) == 0; });
  const int failed = test::check_streams_exact(got, expected);
  MESSAGE("engine-b stopped after " << got.kill_at_s << " s; every stream ended after " << got.seconds << " s");
  CHECK_MESSAGE(failed == 0, test::log_tails(c.state_dir, 60));
  node.resume();
  // Both engine nodes report the expert-parallel group at its 4 ranks again.
  auto group_ranks = [&](uint16_t port) {
    auto r = actors::http_call("127.0.0.1", port, "GET", "/metrics", "");
    std::smatch m;
    if (!r || !std::regex_search(r->body, m, std::regex("shoal_ep_group_ranks\\{actor=\"node\"\\} ([0-9.]+)"))) return -1.0;
    return std::stod(m[1]);
  };
  const auto t0 = std::chrono::steady_clock::now();
  while ((group_ranks(c.metrics_a_port) != 4 || group_ranks(c.metrics_b_port) != 4) &&
         std::chrono::steady_clock::now() - t0 < 60s)
    std::this_thread::sleep_for(100ms);
  CHECK(group_ranks(c.metrics_a_port) == 4);
  CHECK(group_ranks(c.metrics_b_port) == 4);
  auto r = c.post("/v1/completions", completion_body(prompts[0], n, false));
  REQUIRE(r);
  REQUIRE_MESSAGE(r->status == 200, r->body);
  CHECK(json::parse(r->body)["choices"][0]["text"] == expected[0]);
}
