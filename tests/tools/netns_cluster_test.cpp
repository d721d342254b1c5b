// The 3-node cluster across network namespaces: three hosts (`ip netns`), each with its own
// address on a bridge (10.77.S.1-3/24; the test's clients on 10.77.S.254), one shoald each
// (gateway on host 1, the two engine nodes whose 4 ranks form one expert-parallel group on
// hosts 2 and 3, the addresses of config/local-3node changed), nothing on 127.0.0.1. Faults
// are link cuts (`ip link set … down` on the host's end of its veth pair):
// - an engine host cut under 30 streams: every stream ends (completed with the offline
//   engine's text, or a clear error), none hung; the link restored, the node is back in every
//   member's view within the bound stated below and serves again;
// - the gateway host cut under 30 streams: its clients get a clear error or complete; the link
//   restored, the gateway is back in every view and serves.
// Needs root (CI runs as root); elsewhere each case says it did not run.
#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
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
#include "runtime/engine/engine_setup.hpp"
#include "tests/support/cluster.hpp"
#include "tests/support/skip.hpp"
#include "tools/shoald/engine_options.hpp"

using namespace shoal;
using namespace std::chrono_literals;
using nlohmann::json;
using test::completion_body;
using test::read_text;
using test::temp_dir;
using test::write_text;
namespace fs = std::filesystem;

namespace {

constexpr int64_t connection_timeout_ms = 2000;
constexpr uint16_t agent_port = 7100, http_port = 8000;
// Bound on a healed partition, from the link coming back to the node in every member's view:
// each node's healer looks every 1 s and tries each lost member with an exponential back-off
// from 0.5 s to 8 s, a try waiting up to 5 s (a connect into a cut link gets no answer): at
// worst 8 + 1 + 5 s, and margin for a 2-core host.
constexpr auto heal_bound = 20s;

int sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

std::string ip_binary() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
    if (fs::exists(p)) return p;
  return "ip";
}

// Three hosts on one bridge. `subnet` keeps concurrent cases apart (10.77.<subnet>.0/24).
struct netns_lab {
  std::string tag, ip = ip_binary();
  int subnet;
  bool ready = false;
  std::string why;  // why the namespaces could not be made

  netns_lab(const std::string& t, int s) : tag(t + std::to_string(::getpid() % 10000)), subnet(s) {
    if (::geteuid() != 0) {
      why = "not root";
      return;
    }
    teardown();  // leftovers of a killed run
    if (sh(ip + " link add " + bridge() + " type bridge") != 0) {
      why = "cannot create a bridge (" + ip + " link add ... type bridge)";
      return;
    }
    bool ok = sh(ip + " addr add " + prefix() + "254/24 dev " + bridge()) == 0 && sh(ip + " link set " + bridge() + " up") == 0;
    for (int h = 1; ok && h <= 3; ++h) {
      ok = sh(ip + " netns add " + ns(h)) == 0 &&
           sh(ip + " link add " + outer(h) + " type veth peer name " + inner(h)) == 0 &&
           sh(ip + " link set " + inner(h) + " netns " + ns(h)) == 0 &&
           sh(ip + " link set " + outer(h) + " master " + bridge() + " up") == 0 &&
           sh(ip + " -n " + ns(h) + " addr add " + addr(h) + "/24 dev " + inner(h)) == 0 &&
           sh(ip + " -n " + ns(h) + " link set " + inner(h) + " up") == 0 &&
           sh(ip + " -n " + ns(h) + " link set lo up") == 0;
    }
    if (!ok) {
      why = "ip netns / veth set-up failed";
      teardown();
      return;
    }
    ready = true;
  }
  ~netns_lab() { teardown(); }
  netns_lab(const netns_lab&) = delete;
  netns_lab& operator=(const netns_lab&) = delete;

  void teardown() {
    for (int h = 1; h <= 3; ++h) sh(ip + " netns del " + ns(h)), sh(ip + " link del " + outer(h));
    sh(ip + " link del " + bridge());
  }
  std::string prefix() const { return "10.77." + std::to_string(subnet) + "."; }
  std::string addr(int h) const { return prefix() + std::to_string(h); }
  std::string ns(int h) const { return "shoal-" + tag + "-" + std::to_string(h); }
  std::string bridge() const { return "shb" + tag; }
  std::string outer(int h) const { return "sh" + tag + "h" + std::to_string(h); }  // the bridge's end
  std::string inner(int h) const { return "sh" + tag + "n" + std::to_string(h); }  // the host's end
  bool cut(int h) const { return sh(ip + " link set " + outer(h) + " down") == 0; }
  bool restore(int h) const { return sh(ip + " link set " + outer(h) + " up") == 0; }
};

struct client_config : caf::actor_system_config {
  client_config() {
    load<caf::io::middleman>();
    actors::add_message_types(*this);
  }
};
struct client_system : client_config, caf::actor_system {
  client_system() : caf::actor_system(static_cast<client_config&>(*this)) {}
};

const std::vector<std::string> all_nodes = {"engine-a", "engine-b", "gateway"};

// gateway on host 1, engine-a on host 2, engine-b on host 3: one shoald per namespace.
struct netns_cluster {
  netns_lab& lab;
  temp_dir dir;
  fs::path model_dir = dir.path / "model";
  std::optional<runtime::loaded_model> model;
  std::map<std::string, std::unique_ptr<test::child_process>> nodes;
  client_system sys;

  explicit netns_cluster(netns_lab& l) : lab(l) {
    model = test::generated_model(model_dir, "tiny", 11);
    const std::string engine = "[engine]\nranks = 2\nexpert_parallel = true\ncache_mib = 64\n";
    start("gateway", 1, "[\"gateway\"]", "[gateway]\nlisten = \"" + lab.addr(1) + ":" + std::to_string(http_port) + "\"\n");
    start("engine-a", 2, "[\"engine\"]", engine);
    start("engine-b", 3, "[\"engine\"]", engine);
  }
  ~netns_cluster() {
    for (int h = 1; h <= 3; ++h) lab.restore(h);
    for (auto& [name, p] : nodes) kill(p->pid, SIGTERM);
    for (auto& [name, p] : nodes)
      if (!p->wait_exit(20s)) kill(p->pid, SIGKILL);
    if (const char* keep = std::getenv("SHOAL_TEST_KEEP_LOGS")) {
      std::error_code ec;
      fs::copy(dir.path, keep, fs::copy_options::recursive | fs::copy_options::overwrite_existing, ec);
    }
  }

  void start(const std::string& name, int host, const std::string& roles, const std::string& section) {
    const std::string seeds = host == 1 ? "" : "\"" + lab.addr(1) + ":" + std::to_string(agent_port) + "\"";
    const fs::path cfg = dir.path / (name + ".toml");
    write_text(cfg, "[node]\nname = \"" + name + "\"\nlisten = \"" + lab.addr(host) + ":" + std::to_string(agent_port) +
                        "\"\nroles = " + roles + "\nmodel_dir = \"" + model_dir.string() +
                        "\"\ndrain_timeout_ms = 5000\n\n" + section + "\n[cluster]\nseeds = [" + seeds +
                        "]\nheartbeat_interval_ms = 300\nconnection_timeout_ms = " +
                        std::to_string(connection_timeout_ms) + "\nrequest_timeout_ms = 30000\n\n[log]\nlevel = \"debug\"\n");
    nodes[name] = std::make_unique<test::child_process>(
        std::vector<std::string>{lab.ip, "netns", "exec", lab.ns(host), SHOAL_SHOALD_BIN, "--config", cfg.string()},
        dir.path / (name + ".out"), dir.path / (name + ".log"));
  }

  // Member names in the view of the node on `host` (empty when it cannot be asked).
  std::vector<std::string> view(int host) {
    std::vector<std::string> out;
    auto agent = sys.middleman().remote_actor<actors::node_agent_actor>(lab.addr(host), agent_port);
    if (!agent) return out;
    caf::scoped_actor self{sys};
    self->request(*agent, 3s, members_atom_v)
      .receive([&](const actors::membership& m) { for (const auto& n : m.nodes) out.push_back(n.name); },
               [&](caf::error&) {});
    return out;
  }
  bool everyone_sees_all() { return view(1) == all_nodes && view(2) == all_nodes && view(3) == all_nodes; }

  std::expected<actors::http_response, std::string> post(const std::string& path, const json& body,
                                                         actors::http_call_options o = {}) const {
    return actors::http_call(lab.addr(1), http_port, "POST", path, body.dump(), o);
  }

  // Up: every node sees all three, and the gateway serves a completion.
  void wait_up() {
    const auto t0 = std::chrono::steady_clock::now();
    bool up = false;
    while (!up && std::chrono::steady_clock::now() - t0 < 120s) {
      for (auto& [name, p] : nodes) REQUIRE_MESSAGE(!p->exited(), name << " exited: " << read_text(p->err));
      up = everyone_sees_all();
      if (up) {
        actors::http_call_options o;
        o.timeout = 20s;
        auto r = post("/v1/completions", completion_body("warm up", 2, false), o);
        up = r && r->status == 200;
      }
      if (!up) std::this_thread::sleep_for(200ms);
    }
    REQUIRE_MESSAGE(up, "the cluster did not come up in 120 s; gateway log:\n" << read_text(nodes["gateway"]->err));
  }

  std::vector<std::string> offline(const std::vector<std::string>& prompts, int32_t n) const {
    runtime::engine local(model->weights, tools::shoald::engine_config_for(model->weights->config));
    runtime::sampling_params p;
    p.max_tokens = n;
    p.ignore_eos = true;
    std::map<int64_t, size_t> index;
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto id = local.add_request(runtime::encode_prompt(*model->tokenizer, prompts[i]), p);
      REQUIRE(id);
      index[id->value] = i;
    }
    std::vector<std::string> out(prompts.size());
    for (auto& c : local.run_to_completion()) out[index.at(c.id.value)] = test::as_json_text(model->tokenizer->decode(c.output));
    return out;
  }

  // Steps of an engine rank, from `shoal shell -c "stats NODE/rankK"` through the gateway.
  int64_t steps(const std::string& rank) {
    std::string out;
    const int rc = test::run_shoal(dir.path, {"shell", "--connect=" + lab.addr(1) + ":" + std::to_string(agent_port), "-c", "stats " + rank}, out);
    const size_t at = out.find("steps=");
    if (rc != 0 || at == std::string::npos) return -1;
    return std::stoll(out.substr(at + 6));
  }
};

std::vector<std::string> prompts_for(const std::string& what, int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(what + " stream " + std::to_string(i) + " asks");
  return out;
}

// Every stream accounted for: completed with the offline text (ended with [DONE]), or ended
// with a clear error; the counts must add up to the streams sent. Returns completed.
int check_outcomes(const test::stream_outcome& got, const std::vector<std::string>& expected) {
  int completed = 0, errored = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    CAPTURE(i);
    if (got.errors[i].empty() && got.done[i] && got.texts[i] == expected[i]) {
      ++completed;
    } else if (!got.errors[i].empty()) {
      ++errored;
      MESSAGE("stream " << i << ": " << got.errors[i]);
    } else {
      FAIL_CHECK("stream " << i << " ended without its text or an error (done " << got.done[i] << ")");
    }
  }
  CHECK(completed + errored == static_cast<int>(expected.size()));
  return completed;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

TEST_CASE("netns cluster: an engine host's link cut under 30 streams loses nothing, restored it rejoins and serves") {
  netns_lab lab("e", 41);
  if (!lab.ready) SHOAL_SKIP("network namespaces unavailable (" + lab.why + ")");
  netns_cluster c(lab);
  c.wait_up();
  const int32_t n = 40;
  const auto prompts = prompts_for("engine cut", 30);
  const auto expected = c.offline(prompts, n);
  auto post = [&](const std::string& path, const json& body, actors::http_call_options o) { return c.post(path, body, o); };
  auto got = test::streams_with_fault(post, prompts, n, 1, [&] { return lab.cut(3); }, 0ms, 90s);
  MESSAGE("engine-b's link cut at " << got.kill_at_s << " s; every stream ended after " << got.seconds << " s");
  const int completed = check_outcomes(got, expected);
  MESSAGE(completed << " of 30 completed, " << 30 - completed << " ended with a clear error, 0 lost");
  CHECK(got.seconds < 100);  // none hung until the client timeout

  // The gateway dropped the cut node; engine-a serves alone meanwhile.
  const auto t0 = std::chrono::steady_clock::now();
  while (c.view(1).size() == 3 && seconds_since(t0) < 4.0 * connection_timeout_ms / 1000) std::this_thread::sleep_for(50ms);
  CHECK(c.view(1) == std::vector<std::string>{"engine-a", "gateway"});
  auto alone = c.post("/v1/completions", completion_body(prompts[0], n, false));
  REQUIRE(alone);
  CHECK_MESSAGE(alone->status == 200, alone->body);

  // Link back: engine-b is in every member's view within the bound, and steps requests again.
  REQUIRE(lab.restore(3));
  const auto t1 = std::chrono::steady_clock::now();
  bool healed = false;
  while (!healed && std::chrono::steady_clock::now() - t1 < 60s) {
    healed = c.everyone_sees_all();
    if (!healed) std::this_thread::sleep_for(100ms);
  }
  const double healed_s = seconds_since(t1);
  MESSAGE("engine-b back in every view " << healed_s << " s after its link came back (bound "
                                         << std::chrono::duration<double>(heal_bound).count() << " s)");
  REQUIRE(healed);
  CHECK(healed_s < std::chrono::duration<double>(heal_bound).count());
  const int64_t before = c.steps("engine-b/rank0");
  for (int i = 0; i < 4; ++i) {
    auto r = c.post("/v1/completions", completion_body(prompts[static_cast<size_t>(i)], n, false));
    REQUIRE(r);
    CHECK_MESSAGE(r->status == 200, r->body);
    if (r->status == 200) CHECK(json::parse(r->body)["choices"][0]["text"] == expected[static_cast<size_t>(i)]);
  }
  const int64_t after = c.steps("engine-b/rank0");
  MESSAGE("engine-b/rank0 steps " << before << " -> " << after);
  CHECK(before >= 0);
  CHECK(after > before);  // the rejoined node computes again
}

TEST_CASE("netns cluster: the gateway host's link cut under 30 streams, its clients get a clear error or complete") {
  netns_lab lab("g", 42);
  if (!lab.ready) SHOAL_SKIP("network namespaces unavailable (" + lab.why + ")");
  netns_cluster c(lab);
  c.wait_up();
  const int32_t n = 40;
  const auto prompts = prompts_for("gateway cut", 30);
  const auto expected = c.offline(prompts, n);
  auto post = [&](const std::string& path, const json& body, actors::http_call_options o) { return c.post(path, body, o); };
  // The gateway's link is down for 8 s (past the connection timeout: the engines drop it).
  std::thread restorer;
  auto got = test::streams_with_fault(post, prompts, n, 1, [&] {
    if (!lab.cut(1)) return false;
    restorer = std::thread([&] {
      std::this_thread::sleep_for(8s);
      lab.restore(1);
    });
    return true;
  }, 0ms, 60s);
  if (restorer.joinable()) restorer.join();
  MESSAGE("gateway link cut at " << got.kill_at_s << " s for 8 s; every stream ended after " << got.seconds << " s");
  const int completed = check_outcomes(got, expected);
  MESSAGE(completed << " of 30 completed, " << 30 - completed << " ended with a clear error, 0 lost");
  CHECK(got.seconds < 75);

  const auto t1 = std::chrono::steady_clock::now();
  bool healed = false;
  while (!healed && std::chrono::steady_clock::now() - t1 < 60s) {
    healed = c.everyone_sees_all();
    if (!healed) std::this_thread::sleep_for(100ms);
  }
  MESSAGE("the gateway back in every view " << seconds_since(t1) << " s after the restored link was checked");
  REQUIRE(healed);
  auto r = c.post("/v1/completions", completion_body(prompts[0], n, false));
  REQUIRE(r);
  CHECK_MESSAGE(r->status == 200, r->body);
  if (r->status == 200) CHECK(json::parse(r->body)["choices"][0]["text"] == expected[0]);
}
