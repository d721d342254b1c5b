// The SWA-cache tier across machines with real daemons (ISSUE 9 acceptance 3): a gateway, a
// storage node, an SWA directory node and two shoal_flash engine nodes in exact SWA mode
// (colocated role, the storage cluster (12 storage node actors in one process: a block's
// 10 + 2 chunks) as their block tier, SWA slots over libfabric
// tcp;ofi_rxm). A conversation whose first turn ran on engine-a continues on engine-b:
// its blocks come from storage, its window slot from engine-a's store through the
// directory, and the output equals the colocated engine's exactly. Then engine-a (the
// holder) is killed: the next such request on engine-b completes with the colocated
// engine's text (recomputed instead of restored) within a bound. Then the directory node is
// killed and restarted, engine-a restarted empty: the directory is rebuilt from engine-b's
// full report and engine-a's requests hit engine-b's slots again.
#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/http_client.hpp"
#include "runtime/engine/engine_setup.hpp"
#include "tests/support/cluster.hpp"
#include "tests/support/tiny_models.hpp"
#include "tools/shoald/engine_options.hpp"

using namespace shoal;
using namespace std::chrono_literals;
using nlohmann::json;
using test::read_text;
using test::write_text;
namespace fs = std::filesystem;

namespace {

struct swa_cluster : test::cli_cluster {
  uint16_t seed_port = 0, http_port = 0;
  std::map<std::string, fs::path> configs;
  std::optional<runtime::loaded_model> model;

  swa_cluster() {
    test::generated_model(model_dir, "tiny", 9);
    json c = json::parse(read_text(model_dir / "config.json"));
    c["swa_mode"] = "exact";
    write_text(model_dir / "config.json", c.dump(2));
    auto m = runtime::load_model_dir(model_dir.string(), false);
    REQUIRE(m);
    model = std::move(*m);
    seed_port = test::free_port();
    http_port = test::free_port();
    shell_port = seed_port;
    add("gateway", "[\"gateway\"]", "[gateway]\nlisten = \"127.0.0.1:" + std::to_string(http_port) + "\"\n", false, true);
    add("directory", "[\"directory\"]", "", true, false);
    add("storage", "[\"storage\"]",
        "[storage]\ndir = \"" + (dir.path / "chunks").string() + "\"\nnodes = 12\ncapacity_mib = 16\nfsync = \"never\"\n", true,
        false);
    for (const char* e : {"engine-a", "engine-b"})
      add(e, "[\"engine\"]",
          "[engine]\ncache_mib = 32\nkv_storage = true\ntransport = \"tcp;ofi_rxm\"\nswa_slots = 64\n"
          "swa_timeout_ms = 3000\n",
          true, true);
  }

  void add(const std::string& name, const std::string& roles, const std::string& section, bool seeded, bool model) {
    fs::path p = config_dir / (name + ".toml");
    write_text(p, test::node_config_text(name, name == "gateway" ? seed_port : test::free_port(), roles,
                                         model ? model_dir : fs::path(), section, seeded ? seed_port : 0));
    configs[name] = p;
  }

  // A counter of `shoal shell -c swa` for one engine node ("rank0: ... KEY=N").
  int64_t swa_stat(const std::string& node, const std::string& key) {
    std::string out = shell("swa");
    std::smatch m;
    REQUIRE_MESSAGE(std::regex_search(out, m, std::regex(node + "/swa_store:[^\\n]*\\n  rank0:[^\\n]* " + key + "=(\\d+)")),
                    out);
    return std::stoll(m[1]);
  }

  // Greedy completion of token ids; the text and the cached tokens.
  std::pair<std::string, int64_t> complete(const std::vector<int32_t>& prompt, int max_tokens) {
    json body = {{"model", "model"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0},
                 {"ignore_eos", true}};
    auto r = actors::http_call("127.0.0.1", http_port, "POST", "/v1/completions", body.dump());
    REQUIRE_MESSAGE(r, r.error());
    REQUIRE_MESSAGE(r->status == 200, r->body);
    json j = json::parse(r->body);
    return {j["choices"][0]["text"].get<std::string>(), j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>()};
  }
};

std::vector<int32_t> tokens(size_t n, uint32_t seed, int32_t bos) {
  auto t = test::random_tokens(n, seed, 250);
  t.insert(t.begin(), bos);
  return t;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST_CASE("SWA tier cluster: a slot from another node's store restores the window exactly, holder killed, directory restarted") {
  swa_cluster c;
  std::string out;
  REQUIRE_MESSAGE(c.shoal({"up", "--config", c.config_dir.string(), "--state-dir", c.state_dir.string(), "--timeout",
                           "120"},
                          out) == 0,
                  out);
  c.up = true;
  const int32_t bos = c.model->tokenizer->bos_id();
  const int n = 8;
  auto p = tokens(80, 1, bos), q = tokens(80, 2, bos);
  // The second turns go past the exact decoder tail, so their hits reach the first turns' slots.
  auto p2 = concat(p, test::random_tokens(60, 3, 250)), q2 = concat(q, test::random_tokens(60, 4, 250));

  // The colocated engine (the daemon's config) running the same requests in the same order
  // on one engine: its own slots restore the windows the cluster fetches.
  runtime::engine colocated(c.model->weights, tools::shoald::engine_config_for(c.model->weights->config));
  runtime::engine cold(c.model->weights, tools::shoald::engine_config_for(c.model->weights->config));
  auto run = [&](runtime::engine& e, const std::vector<int32_t>& prompt) {
    runtime::sampling_params sp;
    sp.max_tokens = n;
    sp.ignore_eos = true;
    REQUIRE(e.add_request(prompt, sp));
    auto done = e.run_to_completion();
    REQUIRE(done.size() == 1);
    return std::pair{test::as_json_text(c.model->tokenizer->decode(done[0].output)), done[0].cached_tokens};
  };
  auto ref_p = run(colocated, p), ref_q = run(colocated, q), ref_p2 = run(colocated, p2);
  auto ref_p2_again = run(colocated, p2);
  auto ref_q2 = run(cold, q2);  // after the holder died: no slot anywhere, recomputed
  REQUIRE(ref_p2.second > 0);
  REQUIRE(colocated.stats().cache.swa_restores >= 2);

  // 1. p and q run on engine-a (an idle cluster routes to the first engine by name).
  CHECK(c.complete(p, n).first == ref_p.first);
  CHECK(c.complete(q, n).first == ref_q.first);
  CHECK(c.swa_stat("engine-a", "restores") == 0);
  std::this_thread::sleep_for(2s);  // blocks written to storage, slots reported to the directory
  std::string swa = c.shell("swa");
  CHECK_MESSAGE(std::regex_search(swa, std::regex("engine-a: [1-9][0-9]* slot\\(s\\) registered")), swa);

  // 2. engine-a drains (its store still serves): p2 runs on engine-b and fetches p's slot.
  c.shell("drain engine-a");
  std::this_thread::sleep_for(1s);
  auto got = c.complete(p2, n);
  CHECK(got.first == ref_p2.first);
  CHECK(got.second == ref_p2.second);
  CHECK(c.swa_stat("engine-b", "fetches") == 1);
  CHECK(c.swa_stat("engine-b", "restores") == 1);
  CHECK(c.swa_stat("engine-b", "fetch_failures") == 0);

  // 3. The holder is killed: q2 on engine-b finds no slot (or a dead holder) and recomputes.
  auto pids = test::cluster_pids(c.state_dir);
  REQUIRE(kill(pids.at("engine-a"), SIGKILL) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  got = c.complete(q2, n);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(got.first == ref_q2.first);
  CHECK(took < 15.0);  // the slot timeout (3 s) plus the computation, never a hang
  MESSAGE("q2 after the holder died: " << took << " s");
  CHECK(c.swa_stat("engine-b", "fetches") == 1);

  // 4. The directory dies and comes back; engine-a comes back empty. engine-b's full report
  // rebuilds the directory, and engine-a fetches engine-b's slot (engine-b drains, its store
  // still serving: the prefill balancer would otherwise send p2 where its prefix is cached).
  REQUIRE(kill(pids.at("directory"), SIGKILL) == 0);
  std::this_thread::sleep_for(3s);
  std::vector<std::unique_ptr<test::child_process>> restarted;  // killed when the test ends
  for (const char* name : {"directory", "engine-a"})
    restarted.push_back(std::make_unique<test::child_process>(
      std::vector<std::string>{SHOAL_SHOALD_BIN, "--config", c.configs.at(name).string()},
      c.dir.path / (std::string(name) + ".restart.out"), c.dir.path / (std::string(name) + ".restart.err")));
  bool rebuilt = false;
  for (int i = 0; i < 60 && !rebuilt; ++i) {
    std::this_thread::sleep_for(500ms);
    std::string s;
    test::run_shoal(c.dir.path, {"shell", "--connect=127.0.0.1:" + std::to_string(c.seed_port), "-c", "swa"}, s);
    rebuilt = std::regex_search(s, std::regex("engine-b: [1-9][0-9]* slot\\(s\\) registered")) &&
              s.find("engine-a/swa_store") != std::string::npos;
  }
  REQUIRE_MESSAGE(rebuilt, c.shell("swa"));
  c.shell("drain engine-b");
  std::this_thread::sleep_for(1s);
  got = c.complete(p2, n);
  CHECK(got.first == ref_p2_again.first);
  CHECK(got.second == ref_p2_again.second);
  CHECK(c.swa_stat("engine-a", "fetches") == 1);
  CHECK(c.swa_stat("engine-a", "restores") == 1);
}
