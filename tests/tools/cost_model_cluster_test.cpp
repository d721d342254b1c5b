// The step-cost model on by default: a node with no cost-model file anywhere (its state
// directory empty, no engine.cost_model) fits one from its first prefill steps, says so in
// the shell's stats (source, samples, fit error), the prefill balancer weighs the engine by it
// (shell balancers), and keeps it in the state directory; started
// again, it reads the kept file instead of fitting. Outputs equal the offline engine's
// throughout (chunk sizes never change a batch-invariant engine's tokens).
#include <doctest/doctest.h>

#include <chrono>
#include <regex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "actors/http_client.hpp"
#include "runtime/engine/engine_setup.hpp"
#include "tests/support/cluster.hpp"
#include "tools/shoald/engine_options.hpp"

using namespace shoal;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string stat_field(const std::string& stats, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(stats, m, std::regex(" " + key + "=(\"[^\"]*\"|\\S+)"))) return "";
  return m[1];
}

}  // namespace

TEST_CASE("step-cost model by default: fitted from the first prefill steps, kept in the state directory, read back "
          "on restart") {
  test::cli_cluster c;
  auto model = test::generated_model(c.model_dir, "v3-tiny", 9);
  c.shell_port = test::free_port();
  const uint16_t http = test::free_port();
  test::write_text(c.config_dir / "node.toml",
                   test::node_config_text("solo", c.shell_port, "[\"gateway\", \"engine\"]", c.model_dir,
                                          "[engine]\nranks = 1\ncache_mib = 32\n\n[gateway]\nlisten = \"127.0.0.1:" +
                                            std::to_string(http) + "\"\n",
                                          0));
  c.start();
  CHECK(stat_field(c.shell("stats solo/rank0"), "cost_model") == "none");

  auto offline = [&](const std::string& prompt) {
    runtime::engine e(model.weights, tools::shoald::engine_config_for(model.weights->config,
                                                                      tools::shoald::default_cache_mib,
                                                                      model::kv_dtype::bf16));
    runtime::sampling_params p;
    p.max_tokens = 3;
    p.ignore_eos = true;
    REQUIRE(e.add_request(runtime::encode_prompt(*model.tokenizer, prompt), p));
    return test::as_json_text(model.tokenizer->decode(e.run_to_completion()[0].output));
  };
  auto complete = [&](const std::string& prompt) {
    auto r = actors::http_call("127.0.0.1", http, "POST", "/v1/completions",
                               test::completion_body(prompt, 3, false).dump(), {});
    REQUIRE_MESSAGE(r, r.error());
    REQUIRE_MESSAGE(r->status == 200, r->body);
    return json::parse(r->body)["choices"][0]["text"].get<std::string>();
  };
  // Prompts of many lengths, some on a shared prefix: prefill steps of varied (n, p).
  const std::string shared = "The harbour master keeps a ledger of every ship, its cargo, its crew and its berth; ";
  std::string stats;
  for (int i = 0; i < 40; ++i) {
    std::string prompt = (i % 3 == 0 ? shared : std::string()) + "entry " + std::to_string(i) + ":";
    for (int w = 0; w < i % 7; ++w) prompt += " and the tide table of week " + std::to_string(w);
    CHECK(complete(prompt) == offline(prompt));
    stats = c.shell("stats solo/rank0");
    if (stat_field(stats, "cost_model") == "fitted") break;
  }
  REQUIRE_MESSAGE(stat_field(stats, "cost_model") == "fitted", stats);
  CHECK(std::stoll(stat_field(stats, "cost_model_samples")) >= 16);
  CHECK(!stat_field(stats, "cost_model_rms_error_pct").empty());
  size_t kept = 0;
  for (const auto& f : fs::directory_iterator(c.state_dir / "cost-models"))
    kept += f.path().extension() == ".json" && f.path().filename().string().starts_with("cost-");
  CHECK(kept == 1);
  // The prefill balancer weighs the engine by the same model. It polls the engines' stats every
  // 2 s in another process, so the shell is asked again until it says so (at most 10 s).
  std::string bal;
  for (int i = 0; i < 40 && bal.find("the engines' own: 1 of 1") == std::string::npos; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(250));
    bal = c.shell("balancers");
  }
  CHECK_MESSAGE(bal.find("cost_models=the engines' own: 1 of 1") != std::string::npos, bal);

  // Started again on the same state directory: the kept model, no new fit.
  test::cluster_down(c.dir.path, c.state_dir);
  c.up = false;
  c.start();
  stats = c.shell("stats solo/rank0");
  CHECK_MESSAGE(stat_field(stats, "cost_model") == "file", stats);
  CHECK(stat_field(stats, "cost_model_detail").find((c.state_dir / "cost-models").string()) != std::string::npos);
  CHECK(complete("entry after the restart:") == offline("entry after the restart:"));
}
