// Authenticated cluster traffic: two nodes with certificates of one cluster CA
// (scripts/make-cluster-certs.sh) form a cluster over TLS and serve; a node without the
// credential, and one with a certificate of another CA, are refused, each naming the reason in
// its log; the shell needs a certificate of the CA too; a certificate its CA did not sign stops
// shoald at start with an error naming the file.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/http_client.hpp"
#include "tests/support/cluster.hpp"

using namespace shoal;
using namespace std::chrono_literals;
using test::read_text;
using test::temp_dir;
using test::write_text;
namespace fs = std::filesystem;

namespace {

void make_certs(const fs::path& dir, const std::vector<std::string>& nodes) {
  std::string cmd = "bash " + std::string(SHOAL_SOURCE_DIR) + "/scripts/make-cluster-certs.sh " + dir.string();
  for (const auto& n : nodes) cmd += " " + n;
  REQUIRE_MESSAGE(std::system((cmd + " >/dev/null").c_str()) == 0, cmd);
}

struct tls_cluster {
  temp_dir dir;
  fs::path model_dir = dir.path / "model", certs = dir.path / "certs", other = dir.path / "other-ca";
  uint16_t gateway_port = test::free_port(), http_port = test::free_port();
  std::map<std::string, std::unique_ptr<test::child_process>> nodes;

  tls_cluster() {
    test::generated_model(model_dir, "tiny", 11);
    make_certs(certs, {"gateway", "engine-a", "shell"});
    make_certs(other, {"rogue"});
  }
  ~tls_cluster() {
    for (auto& [name, p] : nodes) kill(p->pid, SIGTERM);
    for (auto& [name, p] : nodes)
      if (!p->wait_exit(20s)) kill(p->pid, SIGKILL);
  }

  // `tls_dir`/`cert_name`.pem and .key with `tls_dir`/ca.pem; empty cert_name: no [cluster] TLS.
  void start(const std::string& name, uint16_t port, const std::string& roles, const std::string& section,
             const fs::path& tls_dir, const std::string& cert_name, bool seeded = true) {
    std::string tls;
    if (!cert_name.empty())
      tls = "tls_certificate = \"" + (tls_dir / (cert_name + ".pem")).string() + "\"\ntls_key = \"" +
            (tls_dir / (cert_name + ".key")).string() + "\"\ntls_ca_file = \"" + (tls_dir / "ca.pem").string() + "\"\n";
    const fs::path cfg = dir.path / (name + ".toml");
    write_text(cfg, "[node]\nname = \"" + name + "\"\nlisten = \"127.0.0.1:" + std::to_string(port) + "\"\nroles = " +
                        roles + "\nmodel_dir = \"" + model_dir.string() + "\"\n\n" + section + "\n[cluster]\nseeds = [" +
                        (seeded ? "\"127.0.0.1:" + std::to_string(gateway_port) + "\"" : "") +
                        "]\nheartbeat_interval_ms = 300\nconnection_timeout_ms = 2000\nrequest_timeout_ms = 5000\n" + tls +
                        "\n[log]\nlevel = \"debug\"\n");
    nodes[name] = std::make_unique<test::child_process>(
        std::vector<std::string>{SHOAL_SHOALD_BIN, "--config", cfg.string()}, dir.path / (name + ".out"),
        dir.path / (name + ".log"));
  }
  std::string log(const std::string& name) const { return read_text(dir.path / (name + ".log")); }

  // Waits until `name`'s log holds `text` (or the node exits, or 60 s pass).
  bool log_has(const std::string& name, const std::string& text) {
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < 60s) {
      if (log(name).find(text) != std::string::npos) return true;
      if (nodes[name]->exited()) return log(name).find(text) != std::string::npos;
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }

  // `shoal shell -c nodes` with the shell's certificate of `tls_dir` (none: without TLS).
  int shell(const fs::path& tls_dir, const std::string& cert_name, std::string& out) {
    std::vector<std::string> args = {"shell", "--connect=127.0.0.1:" + std::to_string(gateway_port), "-c", "nodes"};
    if (!cert_name.empty())
      for (auto [flag, file] : {std::pair{"--tls-cert", cert_name + ".pem"}, std::pair{"--tls-key", cert_name + ".key"},
                                std::pair{"--tls-ca", std::string("ca.pem")}}) {
        args.push_back(flag);
        args.push_back((tls_dir / file).string());
      }
    return test::run_shoal(dir.path, args, out, 60s);
  }
};

}  // namespace

TEST_CASE("cluster TLS: members with the cluster's certificates serve, nodes and shells without them are refused saying why") {
  tls_cluster c;
  c.start("gateway", c.gateway_port, "[\"gateway\"]",
          "[gateway]\nlisten = \"127.0.0.1:" + std::to_string(c.http_port) + "\"\n", c.certs, "gateway", false);
  REQUIRE_MESSAGE(c.log_has("gateway", "cluster traffic is TLS"), c.log("gateway"));
  REQUIRE_MESSAGE(c.log_has("gateway", "up on"), c.log("gateway"));
  c.start("engine-a", test::free_port(), "[\"engine\"]", "[engine]\nranks = 1\ncache_mib = 64\n", c.certs, "engine-a");
  REQUIRE_MESSAGE(c.log_has("engine-a", "joined the cluster: 2 node(s)"), c.log("engine-a"));

  // The members serve (the HTTP API keeps its own auth: bearer tokens).
  bool served = false;
  for (int i = 0; i < 100 && !served; ++i) {
    auto r = actors::http_call("127.0.0.1", c.http_port, "POST", "/v1/completions",
                               test::completion_body("over TLS", 4, false).dump());
    served = r && r->status == 200;
    if (!served) std::this_thread::sleep_for(200ms);
  }
  CHECK(served);

  // A shell with a certificate of the CA sees both; without one, or with another CA's, it is refused.
  std::string out;
  CHECK_MESSAGE(c.shell(c.certs, "shell", out) == 0, out);
  CHECK(out.find("engine-a") != std::string::npos);
  CHECK(out.find("gateway") != std::string::npos);
  CHECK(c.shell("", "", out) == 1);
  CHECK_MESSAGE(out.find("cannot reach a shoal node") != std::string::npos, out);
  CHECK_MESSAGE(out.find("runs without cluster TLS: the other side may require it") != std::string::npos, out);
  CHECK(c.shell(c.other, "rogue", out) == 1);
  CHECK_MESSAGE(out.find("with cluster TLS on here") != std::string::npos, out);

  // A node without the credential cannot join, and says why in its log.
  c.start("intruder", test::free_port(), "[\"engine\"]", "[engine]\nranks = 1\ncache_mib = 64\n", "", "");
  CHECK_MESSAGE(c.log_has("intruder", "runs without cluster TLS: the other side may require it"), c.log("intruder"));
  // One with a certificate of another CA neither.
  c.start("rogue", test::free_port(), "[\"engine\"]", "[engine]\nranks = 1\ncache_mib = 64\n", c.other, "rogue");
  CHECK_MESSAGE(c.log_has("rogue", "join attempt 1 failed"), c.log("rogue"));
  CHECK_MESSAGE(c.log("rogue").find("not accept this node's certificate") != std::string::npos, c.log("rogue"));
  for (const std::string name : {"intruder", "rogue"}) {
    const std::string log = c.log(name);
    const size_t at = log.find("join attempt 1 failed");
    if (at != std::string::npos) MESSAGE(name << ": " << log.substr(at, log.find('\n', at) - at));
  }
  // The members' views never held either.
  CHECK_MESSAGE(c.shell(c.certs, "shell", out) == 0, out);
  CHECK(out.find("intruder") == std::string::npos);
  CHECK(out.find("rogue") == std::string::npos);
  CHECK_MESSAGE(out.find("engine-a") != std::string::npos,
                out << "\ngateway log:\n" << c.log("gateway") << "\nengine-a log:\n" << c.log("engine-a"));
  // Refused handshakes never cost a member its connections (cluster_tls.cpp: CAF's sessions
  // and OpenSSL's error queue): the members never lost each other.
  CHECK_MESSAGE(c.log("gateway").find("membership: lost") == std::string::npos, c.log("gateway"));
  CHECK_MESSAGE(c.log("engine-a").find("membership: lost") == std::string::npos, c.log("engine-a"));
}

TEST_CASE("cluster TLS: a certificate the CA did not sign stops shoald at start, naming the file") {
  tls_cluster c;
  // The rogue certificate and key with the cluster's CA file.
  const fs::path mixed = c.dir.path / "mixed";
  fs::create_directories(mixed);
  fs::copy_file(c.other / "rogue.pem", mixed / "node.pem");
  fs::copy_file(c.other / "rogue.key", mixed / "node.key");
  fs::copy_file(c.certs / "ca.pem", mixed / "ca.pem");
  c.start("gateway", c.gateway_port, "[\"gateway\"]",
          "[gateway]\nlisten = \"127.0.0.1:" + std::to_string(c.http_port) + "\"\n", mixed, "node", false);
  auto code = c.nodes["gateway"]->wait_exit(60s);
  REQUIRE(code);
  CHECK(*code != 0);
  const std::string log = c.log("gateway");
  CHECK_MESSAGE(log.find("[cluster] tls_certificate " + (mixed / "node.pem").string() + " is not signed by tls_ca_file") !=
                    std::string::npos,
                log);
}
