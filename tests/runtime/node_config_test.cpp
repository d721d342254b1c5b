// Tests of the shoald node config (runtime/node_config): every sample under config/ parses to
// the values its comments promise, defaults and path resolution hold, and a table of bad files
// each fails with the expected error code, line and key, formatted as FILE:LINE:COL: key '…'.
#include "runtime/config/node_config.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

namespace fs = std::filesystem;
using namespace shoal::runtime;

namespace {

fs::path source_dir() { return fs::absolute(SHOAL_SOURCE_DIR); }

node_config load_sample(const std::string& relative) {
  const auto c = load_node_config(source_dir() / relative);
  INFO(relative);
  REQUIRE_MESSAGE(c.has_value(), (c ? std::string() : to_string(c.error())));
  return *c;
}

// A valid engine-only node; the bad-input cases below append to it, so their lines start at 6.
const std::string base = R"([node]
name = "n1"
listen = "127.0.0.1:7100"
roles = ["engine"]
model_dir = "m"
)";

}  // namespace

TEST_CASE("node_config: config/local-1node.toml is one gateway + engine node with 1 rank") {
  const node_config c = load_sample("config/local-1node.toml");
  CHECK(c.name == "local");
  CHECK(c.listen == host_port{"127.0.0.1", 7100});
  CHECK(c.roles == std::vector<role>{role::gateway, role::engine});
  CHECK(c.model_dir == (source_dir() / "models/small").lexically_normal());
  CHECK(c.drain_timeout_ms == 30'000);
  CHECK(c.ranks == 1);
  REQUIRE(c.http_listen);
  CHECK(*c.http_listen == host_port{"127.0.0.1", 8000});
  CHECK_FALSE(c.auth_token_file);
  CHECK(c.seeds.empty());
  CHECK(c.heartbeat_interval_ms == 1'000);
  CHECK(c.connection_timeout_ms == 5'000);
  CHECK(c.request_timeout_ms == 60'000);
  CHECK(c.level == log_level::info);
  CHECK_FALSE(c.log_file);
}

TEST_CASE("node_config: config/local-engine.toml is an engine-only node (no gateway)") {
  const node_config c = load_sample("config/local-engine.toml");
  CHECK(c.name == "engine-local");
  CHECK(c.listen == host_port{"127.0.0.1", 7110});
  CHECK(c.roles == std::vector<role>{role::engine});
  CHECK(c.model_dir == (source_dir() / "models/small").lexically_normal());
  CHECK(c.ranks == 1);
  CHECK_FALSE(c.http_listen);
}

TEST_CASE("node_config: config/local-3node/ is 1 gateway node and 2 engine nodes of 2 ranks") {
  const node_config gw = load_sample("config/local-3node/gateway.toml");
  const node_config a = load_sample("config/local-3node/engine-a.toml");
  const node_config b = load_sample("config/local-3node/engine-b.toml");
  const fs::path model = (source_dir() / "models/small").lexically_normal();

  CHECK(gw.name == "gateway");
  CHECK(gw.roles == std::vector<role>{role::gateway});
  CHECK(gw.listen == host_port{"127.0.0.1", 7100});
  CHECK(gw.http_listen == host_port{"127.0.0.1", 8000});
  CHECK(gw.seeds.empty());
  CHECK(gw.model_dir == model);

  for (const node_config* e : {&a, &b}) {
    CAPTURE(e->name);
    CHECK(e->roles == std::vector<role>{role::engine});
    CHECK(e->ranks == 2);
    CHECK_FALSE(e->http_listen);
    CHECK(e->seeds == std::vector<host_port>{gw.listen});
    CHECK(e->model_dir == model);
    CHECK(e->transport == "auto");  // shm between the two engine nodes of this host
  }
  CHECK(a.name == "engine-a");
  CHECK(b.name == "engine-b");
  CHECK(a.listen == host_port{"127.0.0.1", 7101});
  CHECK(b.listen == host_port{"127.0.0.1", 7102});
  for (const node_config* n : {&gw, &a, &b}) {
    CHECK(n->listen.host == "127.0.0.1");
    CHECK(n->heartbeat_interval_ms == 500);
    CHECK(n->connection_timeout_ms == 3'000);
  }
}

TEST_CASE("node_config: config/local-disagg/ is a gateway, 2 prefill and 2 decode engine nodes over tcp/ofi_rxm") {
  const node_config gw = load_sample("config/local-disagg/gateway.toml");
  CHECK(gw.roles == (std::vector<role>{role::gateway, role::directory}));
  CHECK(gw.listen == host_port{"127.0.0.1", 7200});
  CHECK(gw.http_listen == host_port{"127.0.0.1", 8000});
  CHECK(gw.disagg_role == engine_role::both);
  CHECK(gw.prefill_policy == "tiered");
  CHECK(gw.decode_policy == "decode_balancer");
  CHECK(gw.tier_bounds == std::vector<int64_t>{16384, 65536, 262144});
  CHECK(gw.balancer_round_ms == 10'000);
  CHECK(gw.max_in_flight == 256);
  const std::vector<std::pair<std::string, engine_role>> nodes = {{"prefill-a", engine_role::prefill},
                                                                  {"prefill-b", engine_role::prefill},
                                                                  {"decode-a", engine_role::decode},
                                                                  {"decode-b", engine_role::decode}};
  uint16_t port = 7201;
  for (const auto& [name, r] : nodes) {
    const node_config e = load_sample("config/local-disagg/" + name + ".toml");
    CAPTURE(name);
    CHECK(e.name == name);
    CHECK(e.listen == host_port{"127.0.0.1", port++});
    CHECK(e.roles == std::vector<role>{role::engine});
    CHECK(e.disagg_role == r);
    CHECK(e.transport == "tcp;ofi_rxm");
    CHECK(e.handoff_timeout_ms == 5'000);
    CHECK_FALSE(e.expert_parallel);
    CHECK(e.seeds == std::vector<host_port>{gw.listen});
  }
}

TEST_CASE("node_config: config/bench-2p2d/ pins the prefill pool to CPU 0 and the decode pool to CPU 1") {
  const node_config gw = load_sample("config/bench-2p2d/gateway.toml");
  CHECK(gw.cpus.empty());
  CHECK(gw.http_listen == host_port{"127.0.0.1", 8100});
  for (const auto& [name, cpu, r] : {std::tuple{"prefill-a", 0, engine_role::prefill}, std::tuple{"prefill-b", 0, engine_role::prefill},
                                     std::tuple{"decode-a", 1, engine_role::decode}, std::tuple{"decode-b", 1, engine_role::decode}}) {
    const node_config e = load_sample(std::string("config/bench-2p2d/") + name + ".toml");
    CAPTURE(name);
    CHECK(e.cpus == std::vector<int>{cpu});
    CHECK(e.threads == 1);
    CHECK(e.disagg_role == r);
    CHECK(e.seeds == std::vector<host_port>{gw.listen});
  }
}

TEST_CASE("node_config: config/local-vision/ is a gateway, 2 VE workers, a prefill and a decode engine") {
  const node_config gw = load_sample("config/local-vision/gateway.toml");
  CHECK(gw.roles == std::vector<role>{role::gateway});
  CHECK(gw.http_listen == host_port{"127.0.0.1", 8020});
  CHECK(gw.model_dir.filename() == "small-vision");
  uint16_t port = 7401;
  for (const char* name : {"ve-a", "ve-b"}) {
    const node_config v = load_sample(std::string("config/local-vision/") + name + ".toml");
    CAPTURE(name);
    CHECK(v.roles == std::vector<role>{role::ve});
    CHECK(v.listen == host_port{"127.0.0.1", port++});
    CHECK(v.ve_transport == "tcp;ofi_rxm");
    CHECK(v.ve_cache_mib == 256);
    CHECK(v.model_dir == gw.model_dir);
    CHECK(v.seeds == std::vector<host_port>{gw.listen});
  }
  for (const auto& [name, r] : {std::pair{"prefill", engine_role::prefill}, std::pair{"decode", engine_role::decode}}) {
    const node_config e = load_sample(std::string("config/local-vision/") + name + ".toml");
    CAPTURE(name);
    CHECK(e.listen == host_port{"127.0.0.1", port++});
    CHECK(e.disagg_role == r);
    CHECK(e.seeds == std::vector<host_port>{gw.listen});
  }
}

TEST_CASE("node_config: [eplb] presets and overrides") {
  const std::string ep = base + "[engine]\nexpert_parallel = true\n";
  const auto d = parse_node_config(ep, "");
  REQUIRE(d.has_value());
  CHECK(d->eplb_preset == "decode");
  CHECK(d->eplb_redundant_per_rank == 1);
  CHECK(d->eplb_period_steps == 10'000);
  CHECK(d->eplb_window_steps == 1'000);
  const auto p = parse_node_config(ep + "[eplb]\npreset = \"prefill\"\nperiod_steps = 50\ninterval_ms = 200\n", "");
  REQUIRE_MESSAGE(p.has_value(), (p ? std::string() : to_string(p.error())));
  CHECK(p->eplb_redundant_per_rank == 4);
  CHECK(p->eplb_window_steps == 100);
  CHECK(p->eplb_period_steps == 50);  // the key overrides the preset
  CHECK(p->eplb_interval_ms == 200);
  CHECK(p->eplb_fetch_timeout_ms == 60'000);
  CHECK(p->eplb_expert_groups == 1);  // the global policy
  const auto t = parse_node_config(ep + "[eplb]\nfetch_timeout_ms = 2500\nexpert_groups = 8\n", "");
  REQUIRE(t.has_value());
  CHECK(t->eplb_fetch_timeout_ms == 2500);
  CHECK(t->eplb_expert_groups == 8);
  // A prefill group takes the prefill preset unless [eplb] names one; its group is "prefill".
  const auto pf = parse_node_config(ep + "role = \"prefill\"\n", "");
  REQUIRE_MESSAGE(pf.has_value(), (pf ? std::string() : to_string(pf.error())));
  CHECK(pf->eplb_preset == "prefill");
  CHECK(pf->eplb_redundant_per_rank == 4);
  CHECK(pf->eplb_period_steps == 1'000);
  CHECK(pf->eplb_window_steps == 100);
  CHECK(pf->ep_group == "prefill");
  CHECK(d->ep_group == "both");
  CHECK(d->ep_group_size == 0);
  const auto pd = parse_node_config(ep + "role = \"prefill\"\n[eplb]\npreset = \"decode\"\n", "");
  REQUIRE(pd.has_value());
  CHECK(pd->eplb_redundant_per_rank == 1);
}

TEST_CASE("node_config: expert-parallel decode groups with speculation, named groups, step budgets") {
  const auto c = parse_node_config(base + "[engine]\nexpert_parallel = true\nrole = \"decode\"\nep_group = \"decode-0\"\n"
                                          "ep_group_size = 4\nspeculative = \"auto\"\nspec_nextn = 3\nspec_auto_from = 8\n"
                                          "token_budget = 4096\nmax_running = 32\noverlap_scheduling = false\n", "");
  REQUIRE_MESSAGE(c.has_value(), (c ? std::string() : to_string(c.error())));
  CHECK_FALSE(c->overlap_scheduling);
  CHECK(c->disagg_role == engine_role::decode);
  CHECK(c->ep_group == "decode-0");
  CHECK(c->ep_group_size == 4);
  CHECK(c->speculative == "auto");
  CHECK(c->spec_auto_from == 8);
  CHECK(c->token_budget == 4096);
  CHECK(c->max_running == 32);
  CHECK(c->eplb_preset == "decode");
}

TEST_CASE("node_config: a [faults] plan is read, and without it nothing is injected") {
  const auto c = parse_node_config(base + "[faults]\nplan = \"seed=9, storage_read=0.5\"\n", "");
  REQUIRE_MESSAGE(c.has_value(), (c ? std::string() : to_string(c.error())));
  CHECK(c->faults.seed == 9);
  CHECK(c->faults[fault_point::storage_read] == 0.5);
  const auto d = parse_node_config(base, "");
  REQUIRE(d.has_value());
  CHECK(!d->faults.any());
}

TEST_CASE("node_config: config/local-tls/ is the 3-node cluster with cluster TLS, paths beside the files") {
  for (const std::string name : {"gateway", "engine-a", "engine-b"}) {
    CAPTURE(name);
    const node_config c = load_sample("config/local-tls/" + name + ".toml");
    const fs::path dir = source_dir() / "config/local-tls";
    REQUIRE(c.tls_certificate);
    CHECK(*c.tls_certificate == (dir / "certs" / (name + ".pem")).lexically_normal());
    CHECK(*c.tls_key == (dir / "certs" / (name + ".key")).lexically_normal());
    CHECK(*c.tls_ca_file == (dir / "certs/ca.pem").lexically_normal());
  }
  CHECK(!load_sample("config/local-3node/gateway.toml").tls_certificate);
  // Expert frames stay inside the encrypted CAF messages under TLS; without TLS they use libfabric.
  CHECK(load_sample("config/local-tls/engine-a.toml").ep_frames == "caf");
  CHECK(load_sample("config/local-3node/engine-a.toml").ep_frames == "transport");
}

TEST_CASE("node_config: optional keys take their defaults") {
  const auto c = parse_node_config(base, "");
  REQUIRE_MESSAGE(c.has_value(), (c ? std::string() : to_string(c.error())));
  CHECK(c->ranks == 1);
  CHECK(c->threads == 0);
  CHECK(c->cpus.empty());
  CHECK(c->disagg_role == engine_role::both);
  CHECK(c->transport == "tcp;ofi_rxm");
  CHECK(c->drain_timeout_ms == 30'000);
  CHECK(c->seeds.empty());
  CHECK(c->heartbeat_interval_ms == 1'000);
  CHECK(c->connection_timeout_ms == 5'000);
  CHECK(c->request_timeout_ms == 60'000);
  CHECK(c->level == log_level::info);
  CHECK_FALSE(c->http_listen);
  CHECK_FALSE(c->auth_token_file);
  CHECK_FALSE(c->log_file);
  CHECK(c->model_dir == fs::path("m"));  // no file name: stays relative
}

TEST_CASE("node_config: relative paths resolve against the config file's directory") {
  const std::string text = R"([node]
name = "g"
listen = "[::1]:0"
roles = ["gateway"]
model_dir = "../models/tiny"
[gateway]
listen = "0.0.0.0:8080"
auth_token_file = "secrets/tokens.txt"
[log]
level = "debug"
file = "/var/log/shoal/g.log"
)";
  const auto c = parse_node_config(text, "/etc/shoal/g.toml");
  REQUIRE_MESSAGE(c.has_value(), (c ? std::string() : to_string(c.error())));
  CHECK(c->model_dir == fs::path("/etc/models/tiny"));
  CHECK(c->auth_token_file == fs::path("/etc/shoal/secrets/tokens.txt"));
  CHECK(c->log_file == fs::path("/var/log/shoal/g.log"));  // absolute: kept
  CHECK(c->listen == host_port{"::1", 0});                 // port 0: any free port
  CHECK(to_string(c->listen) == "[::1]:0");
  CHECK(c->level == log_level::debug);
}

TEST_CASE("node_config: every bad input names its line and key") {
  struct bad_case {
    const char* what;
    std::string text;
    config_errc code;
    int32_t line;
    std::string key;  // "" for syntax errors
    std::string message_part;
  };
  const std::vector<bad_case> cases = {
      {"syntax: unterminated string", "[node]\nname = \"n1\nlisten = \"x\"\n", config_errc::syntax, 2, "", ""},
      {"syntax: unclosed header", base + "[engine\nranks = 1\n", config_errc::syntax, 6, "", ""},
      {"syntax: duplicate key", base + "[engine]\nranks = 1\nranks = 2\n", config_errc::syntax, 8, "", ""},
      {"unknown section (typo)", base + "[engin]\nranks = 2\n", config_errc::unknown_key, 6, "engin",
       "did you mean 'engine'"},
      {"unknown key (typo), first in file order",
       base + "[cluster]\nheartbeat_intervl_ms = 500\nzzz = 1\n", config_errc::unknown_key, 7,
       "cluster.heartbeat_intervl_ms", "did you mean 'heartbeat_interval_ms'"},
      {"unknown key at the root", "ranks = 2\n" + base, config_errc::unknown_key, 1, "ranks", "section"},
      {"unknown nested table", base + "[node.extra]\nx = 1\n", config_errc::unknown_key, 6, "node.extra",
       "unknown key"},
      {"section that is not a table", base + "[[engine]]\nranks = 1\n", config_errc::wrong_type, 6, "engine",
       "expected a table"},
      {"unknown role", "[node]\nname = \"n1\"\nlisten = \"127.0.0.1:7100\"\nroles = [\"engine\", \"engin\"]\n",
       config_errc::bad_value, 4, "node.roles", "unknown role 'engin'"},
      {"role listed twice", "[node]\nname = \"n1\"\nlisten = \"127.0.0.1:7100\"\nroles = [\"storage\", \"storage\"]\n",
       config_errc::bad_value, 4, "node.roles", "listed twice"},
      {"no roles", "[node]\nname = \"n1\"\nlisten = \"127.0.0.1:7100\"\nroles = []\n", config_errc::bad_value, 4,
       "node.roles", "at least one role"},
      {"roles not an array", "[node]\nname = \"n1\"\nlisten = \"127.0.0.1:7100\"\nroles = \"engine\"\n",
       config_errc::wrong_type, 4, "node.roles", "expected an array of strings, got a string"},
      {"ranks = 0", base + "[engine]\nranks = 0\n", config_errc::bad_value, 7, "engine.ranks", "must be ≥ 1, got 0"},
      {"ranks too large", base + "[engine]\nranks = 5000\n", config_errc::bad_value, 7, "engine.ranks",
       "must be ≤ 1024"},
      {"ranks as a string", base + "[engine]\nranks = \"2\"\n", config_errc::wrong_type, 7, "engine.ranks",
       "expected an integer, got a string"},
      {"ranks as a float", base + "[engine]\nranks = 2.0\n", config_errc::wrong_type, 7, "engine.ranks",
       "got a float"},
      {"listen port out of range", "[node]\nname = \"n1\"\nlisten = \"127.0.0.1:70000\"\nroles = [\"storage\"]\n",
       config_errc::bad_value, 3, "node.listen", "port out of range"},
      {"listen without port", "[node]\nname = \"n1\"\nlisten = \"localhost\"\nroles = [\"storage\"]\n",
       config_errc::bad_value, 3, "node.listen", "expected host:port"},
      {"listen with a bad IPv4", "[node]\nname = \"n1\"\nlisten = \"10.0.0.300:1\"\nroles = [\"storage\"]\n",
       config_errc::bad_value, 3, "node.listen", "bad host"},
      {"IPv6 without brackets", "[node]\nname = \"n1\"\nlisten = \"::1:7100\"\nroles = [\"storage\"]\n",
       config_errc::bad_value, 3, "node.listen", "brackets"},
      {"seed without a port", base + "[cluster]\nseeds = [\"127.0.0.1:7100\",\n  \"host\"]\n", config_errc::bad_value,
       8, "cluster.seeds", "expected host:port, got 'host'"},
      {"seed with port 0", base + "[cluster]\nseeds = [\"127.0.0.1:0\"]\n", config_errc::bad_value, 7,
       "cluster.seeds", "port out of range"},
      {"seed not a string", base + "[cluster]\nseeds = [7100]\n", config_errc::wrong_type, 7, "cluster.seeds",
       "got an integer"},
      {"connection timeout = heartbeat",
       base + "[cluster]\nheartbeat_interval_ms = 1000\nconnection_timeout_ms = 1000\n", config_errc::bad_value, 8,
       "cluster.connection_timeout_ms", "must exceed cluster.heartbeat_interval_ms (1000)"},
      {"heartbeat above the default connection timeout", base + "[cluster]\nheartbeat_interval_ms = 9000\n",
       config_errc::bad_value, 7, "cluster.heartbeat_interval_ms", "(5000, the default)"},
      {"negative drain timeout", base + "drain_timeout_ms = -1\n", config_errc::bad_value, 6,
       "node.drain_timeout_ms", "must be ≥ 0"},
      {"missing node.name", "[node]\nlisten = \"127.0.0.1:7100\"\nroles = [\"storage\"]\n", config_errc::missing_key,
       1, "node.name", "required"},
      {"missing [node] altogether", "[log]\nlevel = \"info\"\n", config_errc::missing_key, 0, "node.name",
       "required"},
      {"gateway role without [gateway]",
       "[node]\nname = \"g\"\nlisten = \"127.0.0.1:7100\"\nroles = [\"gateway\"]\nmodel_dir = \"m\"\n",
       config_errc::missing_key, 4, "gateway.listen", "gateway role"},
      {"[gateway] without listen",
       "[node]\nname = \"g\"\nlisten = \"127.0.0.1:7100\"\nroles = [\"gateway\"]\nmodel_dir = \"m\"\n"
       "[gateway]\nauth_token_file = \"t\"\n",
       config_errc::missing_key, 6, "gateway.listen", "gateway role"},
      {"[ve] on a node without the role", base + "[ve]\ncache_mib = 64\n", config_errc::bad_value, 6, "ve",
       "has no 've'"},
      {"ve role without a model", "[node]\nname = \"v\"\nlisten = \"127.0.0.1:7100\"\nroles = [\"ve\"]\n",
       config_errc::missing_key, 1, "node.model_dir", "gateway, engine or ve role"},
      {"engine.kv_dtype unknown",
       "[node]\nname = \"e\"\nlisten = \"127.0.0.1:7100\"\nroles = [\"engine\"]\nmodel_dir = \"m\"\n"
       "[engine]\nkv_dtype = \"int4\"\n", config_errc::bad_value, 7, "engine.kv_dtype",
       "expected \"bf16\", \"fp8\" or \"fp32\", got \"int4\""},
      {"engine.device unknown",
       "[node]\nname = \"e\"\nlisten = \"127.0.0.1:7100\"\nroles = [\"engine\"]\nmodel_dir = \"m\"\n"
       "[engine]\ndevice = \"tpu\"\n", config_errc::bad_value, 7, "engine.device",
       "expected a compute backend of this build (\"cpu\""},
      {"ve.cache_mib = 0", "[node]\nname = \"v\"\nlisten = \"127.0.0.1:7100\"\nroles = [\"ve\"]\nmodel_dir = \"m\"\n"
       "[ve]\ncache_mib = 0\n", config_errc::bad_value, 7, "ve.cache_mib", "must be ≥ 1, got 0"},
      {"ve.transport empty", "[node]\nname = \"v\"\nlisten = \"127.0.0.1:7100\"\nroles = [\"ve\"]\nmodel_dir = \"m\"\n"
       "[ve]\ntransport = \"\"\n", config_errc::bad_value, 7, "ve.transport", "libfabric provider"},
      {"[gateway] on a node without the role", base + "[gateway]\nlisten = \"127.0.0.1:8000\"\n",
       config_errc::bad_value, 6, "gateway", "has no 'gateway'"},
      {"unknown prefill policy",
       "[node]\nname = \"g\"\nlisten = \"127.0.0.1:7100\"\nroles = [\"gateway\"]\nmodel_dir = \"m\"\n"
       "[gateway]\nlisten = \"127.0.0.1:8000\"\nprefill_policy = \"fastest\"\n",
       config_errc::bad_value, 8, "gateway.prefill_policy", "expected tiered, untiered"},
      {"unknown decode policy",
       "[node]\nname = \"g\"\nlisten = \"127.0.0.1:7100\"\nroles = [\"gateway\"]\nmodel_dir = \"m\"\n"
       "[gateway]\nlisten = \"127.0.0.1:8000\"\ndecode_policy = \"random\"\n",
       config_errc::bad_value, 8, "gateway.decode_policy", "expected decode_balancer"},
      {"tier bounds not ascending",
       "[node]\nname = \"g\"\nlisten = \"127.0.0.1:7100\"\nroles = [\"gateway\"]\nmodel_dir = \"m\"\n"
       "[gateway]\nlisten = \"127.0.0.1:8000\"\ntier_bounds = [100, 50]\n",
       config_errc::bad_value, 8, "gateway.tier_bounds", "ascending positive integers"},
      {"tier bounds not an array",
       "[node]\nname = \"g\"\nlisten = \"127.0.0.1:7100\"\nroles = [\"gateway\"]\nmodel_dir = \"m\"\n"
       "[gateway]\nlisten = \"127.0.0.1:8000\"\ntier_bounds = 100\n",
       config_errc::wrong_type, 8, "gateway.tier_bounds", "expected an array of integers"},
      {"balancer round of 0 ms",
       "[node]\nname = \"g\"\nlisten = \"127.0.0.1:7100\"\nroles = [\"gateway\"]\nmodel_dir = \"m\"\n"
       "[gateway]\nlisten = \"127.0.0.1:8000\"\nbalancer_round_ms = 0\n",
       config_errc::bad_value, 8, "gateway.balancer_round_ms", "must be ≥ 1"},
      {"no request in flight allowed",
       "[node]\nname = \"g\"\nlisten = \"127.0.0.1:7100\"\nroles = [\"gateway\"]\nmodel_dir = \"m\"\n"
       "[gateway]\nlisten = \"127.0.0.1:8000\"\nmax_in_flight = 0\n",
       config_errc::bad_value, 8, "gateway.max_in_flight", "must be ≥ 1"},
      {"gateway.listen = node.listen",
       "[node]\nname = \"g\"\nlisten = \"127.0.0.1:7100\"\nroles = [\"gateway\"]\nmodel_dir = \"m\"\n"
       "[gateway]\nlisten = \"127.0.0.1:7100\"\n",
       config_errc::bad_value, 7, "gateway.listen", "same address"},
      {"node.metrics_listen = gateway.listen",
       "[node]\nname = \"g\"\nlisten = \"127.0.0.1:7100\"\nroles = [\"gateway\"]\nmodel_dir = \"m\"\n"
       "metrics_listen = \"127.0.0.1:8000\"\n[gateway]\nlisten = \"127.0.0.1:8000\"\n",
       config_errc::bad_value, 6, "node.metrics_listen", "same address as gateway.listen"},
      {"node.metrics_listen not host:port",
       "[node]\nname = \"g\"\nlisten = \"127.0.0.1:7100\"\nroles = [\"storage\"]\nmetrics_listen = \"nope\"\n"
       "[storage]\ndir = \"d\"\n",
       config_errc::bad_value, 5, "node.metrics_listen", ""},
      {"engine role without model_dir", "[node]\nname = \"n1\"\nlisten = \"127.0.0.1:7100\"\nroles = [\"engine\"]\n",
       config_errc::missing_key, 1, "node.model_dir", "required"},
      {"empty model_dir",
       "[node]\nname = \"n1\"\nlisten = \"127.0.0.1:7100\"\nroles = [\"engine\"]\nmodel_dir = \"\"\n",
       config_errc::bad_value, 5, "node.model_dir", "must not be empty"},
      {"node name with a space", "[node]\nname = \"node one\"\nlisten = \"127.0.0.1:7100\"\nroles = [\"storage\"]\n",
       config_errc::bad_value, 2, "node.name", "[A-Za-z0-9._-]"},
      {"bulk ports past 65535",
       "[node]\nname = \"s\"\nlisten = \"127.0.0.1:7100\"\nroles = [\"storage\"]\n"
       "[storage]\ndir = \"d\"\nnodes = 4\nbulk_port = 65534\n",
       config_errc::bad_value, 8, "storage.bulk_port", "65534..65537 for 4 storage nodes"},
      {"bulk port out of range",
       "[node]\nname = \"s\"\nlisten = \"127.0.0.1:7100\"\nroles = [\"storage\"]\n[storage]\ndir = \"d\"\nbulk_port = 70000\n",
       config_errc::bad_value, 7, "storage.bulk_port", "70000"},
      {"unknown log level", base + "[log]\nlevel = \"verbose\"\n", config_errc::bad_value, 7, "log.level",
       "unknown level 'verbose'"},
      {"log file as a boolean", base + "[log]\nfile = true\n", config_errc::wrong_type, 7, "log.file",
       "expected a string, got a boolean"},
      {"unknown engine role", base + "[engine]\nrole = \"encode\"\n", config_errc::bad_value, 7, "engine.role",
       "expected \"both\", \"prefill\" or \"decode\", got \"encode\""},
      {"a group name with a space", base + "[engine]\nexpert_parallel = true\nep_group = \"a b\"\n",
       config_errc::bad_value, 8, "engine.ep_group", "letters, digits, '-' or '_', got \"a b\""},
      {"a group without expert parallelism", base + "[engine]\nep_group = \"decode\"\n", config_errc::bad_value, 7,
       "engine.ep_group", "engine.expert_parallel is not true"},
      {"a zero group size", base + "[engine]\nexpert_parallel = true\nep_group_size = 0\n", config_errc::bad_value, 8,
       "engine.ep_group_size", ""},
      {"a zero token budget", base + "[engine]\ntoken_budget = 0\n", config_errc::bad_value, 7, "engine.token_budget", ""},
      {"a zero max_running", base + "[engine]\nmax_running = 0\n", config_errc::bad_value, 7, "engine.max_running", ""},
      {"overlap as a string", base + "[engine]\noverlap_scheduling = \"yes\"\n", config_errc::wrong_type, 7,
       "engine.overlap_scheduling", "expected true or false"},
      {"auto threshold with fixed speculation", base + "[engine]\nspeculative = \"fixed\"\nspec_auto_from = 4\n",
       config_errc::bad_value, 8, "engine.spec_auto_from", "only used with engine.speculative = \"auto\""},
      {"adaptive threshold with auto speculation", base + "[engine]\nspeculative = \"auto\"\nspec_adaptive_from = 4\n",
       config_errc::bad_value, 8, "engine.spec_adaptive_from", "only used with engine.speculative = \"adaptive\""},
      {"a decode cost model with fixed speculation",
       base + "[engine]\nspeculative = \"fixed\"\nspec_cost_model = \"cost.json\"\n", config_errc::bad_value, 8,
       "engine.spec_cost_model", "only used with engine.speculative = \"adaptive\""},
      {"handoff timeout on a colocated engine", base + "[engine]\nhandoff_timeout_ms = 100\n", config_errc::bad_value, 7,
       "engine.handoff_timeout_ms", "only prefill and decode engines"},
      {"negative SWA slots", base + "[engine]\nswa_slots = -1\n", config_errc::bad_value, 7, "engine.swa_slots", ""},
      {"empty transport", base + "[engine]\nrole = \"decode\"\ntransport = \"\"\n", config_errc::bad_value, 8,
       "engine.transport", "libfabric provider"},
      {"a zero step budget", base + "[engine]\nstep_ms = 0\n", config_errc::bad_value, 7, "engine.step_ms", ""},
      {"unknown speculative mode", base + "[engine]\nspeculative = \"always\"\n", config_errc::bad_value, 7,
       "engine.speculative", "expected \"off\", \"fixed\", \"adaptive\" or \"auto\", got \"always\""},
      {"speculation on a prefill engine", base + "[engine]\nrole = \"prefill\"\nspeculative = \"fixed\"\n",
       config_errc::bad_value, 8, "engine.speculative", "nothing to speculate on"},
      {"adaptive speculation without a cost model", base + "[engine]\nspeculative = \"adaptive\"\n",
       config_errc::missing_key, 7, "engine.spec_cost_model", "shoal bench fit-cost --decode"},
      {"draft count without speculation", base + "[engine]\nspec_nextn = 3\n", config_errc::bad_value, 7,
       "engine.spec_nextn", "only used with engine.speculative"},
      {"nine drafts", base + "[engine]\nspeculative = \"fixed\"\nspec_nextn = 9\n", config_errc::bad_value, 8,
       "engine.spec_nextn", "9"},
      {"a CPU listed twice", base + "cpus = [0, 1, 0]\n", config_errc::bad_value, 6, "node.cpus",
       "distinct CPU numbers"},
      {"a negative CPU", base + "cpus = [-1]\n", config_errc::bad_value, 6, "node.cpus", "distinct CPU numbers"},
      {"no CPUs", base + "cpus = []\n", config_errc::bad_value, 6, "node.cpus", "at least one CPU"},
      {"cpus not an array", base + "cpus = 1\n", config_errc::wrong_type, 6, "node.cpus",
       "expected an array of integers, got an integer"},
      {"negative threads", base + "[engine]\nthreads = -1\n", config_errc::bad_value, 7, "engine.threads",
       "must be ≥ 0, got -1"},
      {"handoff timeout of 0", base + "[engine]\nrole = \"decode\"\nhandoff_timeout_ms = 0\n",
       config_errc::bad_value, 8, "engine.handoff_timeout_ms", "got 0"},
      {"an unknown fault point", base + "[faults]\nplan = \"seed=1,disk_ful=0.1\"\n", config_errc::bad_value, 7,
       "faults.plan", "unknown fault point 'disk_ful'"},
      {"a fault probability above 1", base + "[faults]\nplan = \"kv_handoff=2\"\n", config_errc::bad_value, 7,
       "faults.plan", "not a number in [0, 1]"},
      {"a simulator-only fault point", base + "[faults]\nplan = \"message_dup=0.1\"\n", config_errc::bad_value, 7,
       "faults.plan", "simulator only"},
      {"a fault key that is not plan", base + "[faults]\nseed = 1\n", config_errc::unknown_key, 7, "faults.seed", ""},
      {"a TLS certificate without its key and CA", base + "[cluster]\ntls_certificate = \"node.pem\"\n",
       config_errc::missing_key, 6, "cluster.tls_key", "tls_certificate, tls_key and tls_ca_file together"},
      {"an empty TLS key path", base + "[cluster]\ntls_key = \"\"\n", config_errc::bad_value, 7, "cluster.tls_key",
       "must not be empty"},
      {"a balancer without expert parallelism", base + "[eplb]\nperiod_steps = 10\n", config_errc::bad_value, 6,
       "eplb", "engine.expert_parallel is not true"},
      {"an unknown balancer preset", base + "[engine]\nexpert_parallel = true\n[eplb]\npreset = \"fast\"\n",
       config_errc::bad_value, 9, "eplb.preset", "expected \"decode\" or \"prefill\""},
      {"expert frames without expert parallelism", base + "[engine]\nep_frames = \"caf\"\n", config_errc::bad_value, 7,
       "engine.ep_frames", "engine.expert_parallel is not true"},
      {"a bulk frame size with frames inside CAF messages",
       base + "[engine]\nexpert_parallel = true\nep_frames = \"caf\"\nep_bulk_min_bytes = 4096\n",
       config_errc::bad_value, 9, "engine.ep_bulk_min_bytes", "engine.ep_frames is \"caf\""},
      {"a zero balancer period", base + "[engine]\nexpert_parallel = true\n[eplb]\nperiod_steps = 0\n",
       config_errc::bad_value, 9, "eplb.period_steps", ""},
      {"a migration timeout with frames inside CAF messages",
       base + "[engine]\nexpert_parallel = true\nep_frames = \"caf\"\n[eplb]\nfetch_timeout_ms = 5000\n",
       config_errc::bad_value, 10, "eplb.fetch_timeout_ms", "engine.ep_frames is \"caf\""},
      {"no expert groups", base + "[engine]\nexpert_parallel = true\n[eplb]\nexpert_groups = 0\n",
       config_errc::bad_value, 9, "eplb.expert_groups", ""},
      {"a migration timeout below 100 ms", base + "[engine]\nexpert_parallel = true\n[eplb]\nfetch_timeout_ms = 50\n",
       config_errc::bad_value, 9, "eplb.fetch_timeout_ms", ""},
  };
  for (const bad_case& bc : cases) {
    CAPTURE(bc.what);
    const auto r = parse_node_config(bc.text, "bad.toml");
    REQUIRE_FALSE(r.has_value());
    const config_error& e = r.error();
    const std::string text = to_string(e);
    CAPTURE(text);
    CHECK(e.code == bc.code);
    CHECK(e.file == "bad.toml");
    CHECK(e.line == bc.line);
    CHECK(e.key == bc.key);
    CHECK(text.find(bc.message_part) != std::string::npos);
    if (bc.line > 0) {
      CHECK(e.column > 0);
      CHECK(text.starts_with("bad.toml:" + std::to_string(bc.line) + ":"));
    }
    if (!bc.key.empty()) CHECK(text.find("key '" + bc.key + "': ") != std::string::npos);
  }
}

TEST_CASE("node_config: to_string reads FILE:LINE:COL: key 'K': message") {
  const auto r = parse_node_config(base + "[engine]\nranks = 0\n", "x.toml");
  REQUIRE_FALSE(r.has_value());
  CHECK(to_string(r.error()) == "x.toml:7:9: key 'engine.ranks': must be ≥ 1, got 0");

  CHECK(to_string(config_error{config_errc::syntax, "a.toml", 3, 14, "", "expected '='"}) ==
        "a.toml:3:14: expected '='");
  CHECK(to_string(config_error{config_errc::missing_key, "a.toml", 0, 0, "node.name", "required key missing"}) ==
        "a.toml: key 'node.name': required key missing");
  CHECK(std::string(to_string(config_errc::unknown_key)) == "unknown_key");
  CHECK(std::string(to_string(role::storage)) == "storage");
  CHECK(std::string(to_string(log_level::warn)) == "warn");
}

TEST_CASE("node_config: unreadable files are io errors without a position") {
  const fs::path missing = source_dir() / "config/no-such-node.toml";
  const auto r = load_node_config(missing);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == config_errc::io);
  CHECK(r.error().line == 0);
  CHECK(to_string(r.error()) == missing.string() + ": cannot open: No such file or directory");

  const auto d = load_node_config(source_dir() / "config");
  REQUIRE_FALSE(d.has_value());
  CHECK(d.error().code == config_errc::io);
  CHECK(d.error().message.find("directory") != std::string::npos);
}

TEST_CASE("node_config: config/deepseek-colocated/ is deepseek-shape's ranks in one expert-parallel group of 6") {
  const node_config gw = load_sample("config/deepseek-colocated/gateway.toml");
  CHECK(gw.has_role(role::gateway));
  CHECK(gw.has_role(role::storage));
  int32_t ranks = 0;
  for (const char* n : {"node-a", "node-b", "node-c", "node-d"}) {
    CAPTURE(n);
    const node_config e = load_sample(std::string("config/deepseek-colocated/") + n + ".toml");
    CHECK(e.disagg_role == engine_role::both);
    CHECK(e.expert_parallel);
    CHECK(e.ep_group == "all");
    CHECK(e.ep_group_size == 6);
    CHECK(e.speculative == "fixed");
    ranks += static_cast<int32_t>(e.ranks);
  }
  CHECK(ranks == 6);
}
