// The real `shoald` process, started from a config written here: its node agent is reached
// over loopback with remote_actor, rank 0's engine found in the membership must stream the
// same greedy tokens as a local engine on the same checkpoint; SIGTERM lets a running request
// finish while new ones are refused as draining, then the daemon exits 0. Bad
// configs exit 2 naming the key. Every wait is bounded; a daemon left running is killed.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/after.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/remote_actor.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/http_client.hpp"
#include "actors/interfaces.hpp"
#include "actors/node_agent_actor.hpp"
#include "model/generate.hpp"
#include "runtime/engine/engine_setup.hpp"
#include "tests/support/cluster.hpp"
#include "tests/support/process.hpp"
#include "tools/shoald/engine_options.hpp"

extern char** environ;

using namespace shoal;
using test::read_text;
using test::temp_dir;
using test::write_text;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

constexpr auto request_timeout = std::chrono::seconds(20);
constexpr auto start_timeout = std::chrono::seconds(60);
constexpr int64_t drain_timeout_ms = 15'000;

// One shoald process with stdout and stderr redirected to files in `dir`.
struct daemon_process : test::child_process {
  daemon_process(const fs::path& config, const fs::path& dir)
      : child_process({SHOAL_SHOALD_BIN, "--config", config.string()}, dir / "stdout", dir / "stderr") {}

  // The port of the "shoald: listening on HOST:PORT" line, or nullopt when the process exits
  // or prints nothing within `timeout`.
  std::optional<uint16_t> wait_listening(std::chrono::milliseconds timeout) {
    const std::string marker = "shoald: listening on ";
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      std::string text = read_text(out);
      if (auto at = text.find(marker); at != std::string::npos) {
        auto eol = text.find('\n', at);
        if (eol != std::string::npos) {
          std::string addr = text.substr(at + marker.size(), eol - at - marker.size());
          return static_cast<uint16_t>(std::stoi(addr.substr(addr.rfind(':') + 1)));
        }
      }
      if (exited()) return std::nullopt;
      std::this_thread::sleep_for(10ms);
    }
    return std::nullopt;
  }
};

// The tiny preset's checkpoint in DIR/model.
model::generate_options tiny_checkpoint(const fs::path& dir, uint64_t seed) {
  model::generate_options gen;
  gen.preset = "tiny";
  gen.seed = seed;
  gen.out_dir = (dir / "model").string();
  REQUIRE(model::generate_checkpoint(gen));
  return gen;
}

std::string engine_config_text(const std::string& extra_node, int ranks) {
  return "[node]\nname = \"test-node\"\nlisten = \"127.0.0.1:0\"\nmodel_dir = \"model\"\n" + extra_node +
         "drain_timeout_ms = " + std::to_string(drain_timeout_ms) + "\n\n[engine]\nranks = " +
         std::to_string(ranks) +
         "\n\n[cluster]\nheartbeat_interval_ms = 200\nconnection_timeout_ms = 5000\n"
         "request_timeout_ms = 20000\n\n[log]\nlevel = \"debug\"\nfile = \"shoald.log\"\n";
}

struct client_config : caf::actor_system_config {
  client_config() {
    load<caf::io::middleman>();
    actors::add_message_types(*this);
    set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(200)});
    set("middleman.connection-timeout", caf::timespan{std::chrono::seconds(5)});
  }
};

actors::generation_request greedy_request(int64_t id, std::vector<int32_t> prompt, int32_t max_tokens) {
  actors::generation_request r{request_id(id), std::move(prompt), {}};
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

// Submits `req` to `engine`; false (and a failed check) when it is refused or times out.
bool submit(caf::scoped_actor& self, const actors::engine_actor& engine, const actors::generation_request& req) {
  bool accepted = false;
  self->request(engine, request_timeout, submit_atom_v, req)
    .receive([&](request_id id) { accepted = id == req.id; },
             [&](caf::error& e) { FAIL_CHECK("submit refused: " << self->system().render(e)); });
  return accepted;
}

std::optional<actors::membership> members(caf::scoped_actor& self, const actors::node_agent_actor& agent) {
  std::optional<actors::membership> out;
  self->request(agent, request_timeout, members_atom_v)
    .receive([&](actors::membership& m) { out = std::move(m); }, [&](caf::error&) {});
  return out;
}

// Collects token events until every request in `open` has finished (or a timeout passes).
void collect(caf::scoped_actor& self, std::map<int64_t, std::vector<int32_t>>& tokens, int open) {
  bool timed_out = false;
  self->receive_while([&] { return open > 0 && !timed_out; })(
    [&](const actors::token_event& ev) {
      tokens[ev.id.value].push_back(ev.token);
      if (ev.finished) --open;
    },
    caf::after(request_timeout) >> [&] { timed_out = true; });
  CHECK_MESSAGE(!timed_out, "no token within the timeout");
}

// The local addresses ("a.b.c.d:port", "[v6]:port" as hex words) of the listening TCP sockets
// process `pid` holds: its socket inodes matched against its /proc/<pid>/net/tcp{,6}.
std::vector<std::string> listening_addresses(pid_t pid) {
  std::set<std::string> inodes;
  const fs::path proc = "/proc/" + std::to_string(pid);
  std::error_code ec;
  for (const auto& fd : fs::directory_iterator(proc / "fd", ec)) {
    const std::string target = fs::read_symlink(fd.path(), ec).string();
    if (target.starts_with("socket:[")) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::vector<std::string> out;
  for (const char* table : {"net/tcp", "net/tcp6"}) {
    std::istringstream lines(read_text(proc / table));
    std::string line;
    std::getline(lines, line);  // the header
    while (std::getline(lines, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, st, queues, timer, retr, uid, timeout, inode;
      f >> sl >> local >> remote >> st >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (st != "0A" || !inodes.contains(inode)) continue;  // 0A: LISTEN
      const auto colon = local.find(':');
      const std::string host = local.substr(0, colon);
      const unsigned port = std::stoul(local.substr(colon + 1), nullptr, 16);
      if (host.size() == 8) {  // IPv4, in the kernel's byte order (little-endian here)
        const unsigned long a = std::stoul(host, nullptr, 16);
        out.push_back(std::to_string(a & 0xff) + "." + std::to_string((a >> 8) & 0xff) + "." +
                      std::to_string((a >> 16) & 0xff) + "." + std::to_string(a >> 24) + ":" + std::to_string(port));
      } else {
        out.push_back("[" + host + "]:" + std::to_string(port));
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("shoald serves a remote engine with the local engine's greedy tokens and drains on SIGTERM") {
  temp_dir dir;
  const auto gen = tiny_checkpoint(dir.path, 7);
  write_text(dir.path / "node.toml", engine_config_text("roles = [\"engine\"]\n", 2));

  auto model = runtime::load_model_dir(gen.out_dir, false);
  REQUIRE(model);
  std::vector<actors::generation_request> reqs = {
    greedy_request(1, runtime::encode_prompt(*model->tokenizer, "The quick brown fox"), 12),
    greedy_request(2, runtime::encode_prompt(*model->tokenizer, "jumps over the lazy dog, twice."), 9)};
  std::map<int64_t, std::vector<int32_t>> expected;
  {
    runtime::engine local(model->weights, tools::shoald::engine_config_for(model->weights->config));
    std::map<int64_t, int64_t> caller_id;  // engine id → request id
    for (const auto& r : reqs) {
      auto id = local.add_request(r.prompt, r.sampling);
      REQUIRE(id);
      caller_id[id->value] = r.id.value;
    }
    for (auto& c : local.run_to_completion()) expected[caller_id.at(c.id.value)] = c.output;
  }

  daemon_process d(dir.path / "node.toml", dir.path);
  auto port = d.wait_listening(start_timeout);
  REQUIRE_MESSAGE(port, "shoald did not start; stderr:\n" << read_text(d.err));

  {
    client_config cfg;
    caf::actor_system client{cfg};
    auto agent = caf::io::remote_actor<actors::node_agent_actor>(client, "127.0.0.1", *port);
    REQUIRE_MESSAGE(agent, client.render(agent.error()));
    caf::scoped_actor self{client};
    std::optional<actors::membership> view = members(self, *agent);
    REQUIRE(view);
    REQUIRE(view->nodes.size() == 1);
    CHECK(view->nodes[0].name == "test-node");
    CHECK(view->nodes[0].port == *port);
    REQUIRE(view->nodes[0].ranks.size() == 2);
    auto engine = caf::actor_cast<actors::engine_actor>(view->nodes[0].ranks[0].engine);

    for (const auto& r : reqs) REQUIRE(submit(self, engine, r));
    std::map<int64_t, std::vector<int32_t>> got;
    collect(self, got, static_cast<int>(reqs.size()));
    CHECK(got == expected);

    // A long request is running when SIGTERM arrives: it still streams to its end, while a new
    // request is refused as draining once the node announces it drains.
    auto long_req = greedy_request(3, runtime::encode_prompt(*model->tokenizer, "drain me"), 200);
    REQUIRE(submit(self, engine, long_req));
    bool first = false;
    self->receive([&](const actors::token_event& ev) { first = ev.id == long_req.id && !ev.finished; },
                  caf::after(request_timeout) >> [] {});
    REQUIRE(first);
    REQUIRE(kill(d.pid, SIGTERM) == 0);
    auto deadline = std::chrono::steady_clock::now() + request_timeout;
    bool draining = false;
    while (!draining && std::chrono::steady_clock::now() < deadline) {
      auto v = members(self, *agent);
      draining = v && v->nodes.size() == 1 && v->nodes[0].draining;
      if (!draining) std::this_thread::sleep_for(5ms);
    }
    REQUIRE(draining);
    std::optional<actors::error_reply> refused;
    self->request(engine, request_timeout, submit_atom_v, greedy_request(4, {1, 2, 3}, 4))
      .receive([&](request_id) {}, [&](caf::error& e) { refused = actors::to_error_reply(e); });
    REQUIRE(refused);
    CHECK(refused->code == actors::errc::draining);
    std::map<int64_t, std::vector<int32_t>> drained;
    collect(self, drained, 1);
    CHECK(drained[3].size() + 1 == 200);
  }

  auto code = d.wait_exit(std::chrono::milliseconds(drain_timeout_ms) + 10s);
  REQUIRE_MESSAGE(code, "shoald still running after SIGTERM; stderr:\n" << read_text(d.err));
  CHECK(*code == 0);
  std::string log = read_text(dir.path / "shoald.log");
  CHECK(log.find("SIGTERM: draining") != std::string::npos);
  CHECK(log.find("drained: no request running") != std::string::npos);
  CHECK(read_text(d.err).find("2 engine rank(s)") != std::string::npos);  // stderr has the log too
}

TEST_CASE("shoald refuses an invalid config or an unsupported role with exit code 2 naming the key") {
  struct bad_case {
    std::string config, key;
  };
  std::vector<bad_case> cases = {
    {engine_config_text("roles = [\"engine\"]\n", 0), "engine.ranks"},
    {engine_config_text("roles = [\"engine\", \"storage\"]\n", 1), "storage.dir"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.key);
    temp_dir dir;
    write_text(dir.path / "node.toml", c.config);
    daemon_process d(dir.path / "node.toml", dir.path);
    auto code = d.wait_exit(30s);
    REQUIRE_MESSAGE(code, "shoald did not exit on a bad config");
    CHECK(*code == 2);
    std::string err = read_text(d.err);
    CHECK_MESSAGE(err.find(c.key) != std::string::npos, err);
    CHECK(read_text(d.out).empty());
  }
}

TEST_CASE("shoald serves Prometheus text of its engine ranks and storage nodes on node.metrics_listen") {
  temp_dir dir;
  const auto gen = tiny_checkpoint(dir.path, 8);
  const uint16_t metrics_port = test::free_port();
  std::string text = engine_config_text("roles = [\"engine\", \"storage\"]\nmetrics_listen = \"127.0.0.1:" +
                                          std::to_string(metrics_port) + "\"\n",
                                        1);
  text += "\n[storage]\ndir = \"chunks\"\ncapacity_mib = 16\nfsync = \"never\"\n";
  write_text(dir.path / "node.toml", text);
  daemon_process d(dir.path / "node.toml", dir.path);
  auto port = d.wait_listening(start_timeout);
  REQUIRE_MESSAGE(port, "shoald did not start; stderr:\n" << read_text(d.err));
  {
    client_config cfg;
    caf::actor_system client{cfg};
    auto agent = caf::io::remote_actor<actors::node_agent_actor>(client, "127.0.0.1", *port);
    REQUIRE(agent);
    caf::scoped_actor self{client};
    auto view = members(self, *agent);
    REQUIRE(view);
    REQUIRE(view->nodes.size() == 1);
    auto engine = caf::actor_cast<actors::engine_actor>(view->nodes[0].ranks[0].engine);
    REQUIRE(submit(self, engine, greedy_request(1, {1, 2, 3, 4, 5}, 6)));
    std::map<int64_t, std::vector<int32_t>> got;
    collect(self, got, 1);
    REQUIRE(got[1].size() == 6);
  }
  // Every socket it listens on is on the configured loopback address: its node port, metrics,
  // the storage nodes' bulk paths, the transport's endpoints; no port of CAF's own on every
  // interface (automatic connections opened one, outside node.listen and TLS).
  const auto listening = listening_addresses(d.pid);
  CHECK(listening.size() >= 3);
  for (const std::string& a : listening) CHECK_MESSAGE(a.starts_with("127.0.0.1:"), a << " of " << listening.size());
  auto r = actors::http_call("127.0.0.1", metrics_port, "GET", "/metrics", "");
  REQUIRE_MESSAGE(r, r.error());
  CHECK(r->status == 200);
  const std::string& body = r->body;
  auto value = [&](const std::string& series) {
    std::smatch m;
    REQUIRE_MESSAGE(std::regex_search(body, m, std::regex(series + " ([0-9.e+-]+)\\n")), series << "\n" << body);
    return std::stod(m[1]);
  };
  CHECK(value("shoal_engine_steps_total\\{actor=\"rank0\"\\}") >= 6);
  CHECK(value("shoal_engine_prefill_tokens_total\\{actor=\"rank0\"\\}") == 5);
  CHECK(value("shoal_engine_prefix_queries_total\\{actor=\"rank0\"\\}") == 1);
  CHECK(value("shoal_engine_kv_blocks_free\\{actor=\"rank0\"\\}") > 0);
  CHECK(value("shoal_engine_requests_running\\{actor=\"rank0\"\\}") == 0);
  CHECK(value("shoal_engine_handoff_failures_total\\{actor=\"rank0\"\\}") == 0);  // a colocated engine takes none
  CHECK(value("shoal_storage_capacity_bytes\\{actor=\"storage0\"\\}") == 16.0 * 1024 * 1024);
  CHECK(body.find("# TYPE shoal_engine_steps_total counter") != std::string::npos);
  auto nf = actors::http_call("127.0.0.1", metrics_port, "GET", "/v1/models", "");
  REQUIRE(nf);
  CHECK(nf->status == 404);
  // promtool (Debian's prometheus package) checks the exposition format when it is installed.
  if (std::system("command -v promtool > /dev/null 2>&1") == 0) {
    write_text(dir.path / "metrics.txt", body);
    const std::string cmd = "promtool check metrics < " + (dir.path / "metrics.txt").string() + " > " +
                            (dir.path / "promtool.out").string() + " 2>&1";
    CHECK_MESSAGE(std::system(cmd.c_str()) == 0, read_text(dir.path / "promtool.out"));
  } else {
    MESSAGE("promtool not installed: exposition format not checked by it");
  }
  REQUIRE(kill(d.pid, SIGTERM) == 0);
  CHECK(d.wait_exit(std::chrono::milliseconds(drain_timeout_ms) + 10s));
}

TEST_CASE("shoal shell: an actor that does not answer gets a line saying so, the others are listed, the command fails") {
  temp_dir dir;
  write_text(dir.path / "node.toml",
             "[node]\nname = \"store\"\nlisten = \"127.0.0.1:0\"\nroles = [\"storage\"]\n\n"
             "[storage]\ndir = \"chunks\"\nnodes = 3\ncapacity_mib = 16\nfsync = \"never\"\n\n"
             "[cluster]\nheartbeat_interval_ms = 200\nconnection_timeout_ms = 5000\n\n[log]\nfile = \"shoald.log\"\n");
  daemon_process d(dir.path / "node.toml", dir.path);
  auto port = d.wait_listening(start_timeout);
  REQUIRE_MESSAGE(port, "shoald did not start; stderr:\n" << read_text(d.err));
  const std::string at = "--connect=127.0.0.1:" + std::to_string(*port);
  std::string out;
  CHECK_MESSAGE(test::run_shoal(dir.path, {"shell", at, "-c", "storage"}, out) == 0, out);
  CHECK(out.find("3 storage node(s)") != std::string::npos);
  // storage1 killed: its line says it did not answer, storage0 and storage2 are still shown.
  CHECK(test::run_shoal(dir.path, {"shell", at, "-c", "kill store/storage1; storage"}, out) == 1);
  CHECK_MESSAGE(out.find("store/storage0: chunks=0 ") != std::string::npos, out);
  CHECK_MESSAGE(out.find("store/storage1: no answer (") != std::string::npos, out);
  CHECK_MESSAGE(out.find("store/storage2: chunks=0 ") != std::string::npos, out);
  CHECK_MESSAGE(out.find("error: an actor did not answer") != std::string::npos, out);
  // The node still serves the shell.
  CHECK_MESSAGE(test::run_shoal(dir.path, {"shell", at, "-c", "nodes"}, out) == 0, out);
  REQUIRE(kill(d.pid, SIGTERM) == 0);
  CHECK(d.wait_exit(std::chrono::milliseconds(drain_timeout_ms) + 10s));
}
