// The sample cluster config/deepseek-shape/ as `shoal up` starts it in a test: ports, model,
// storage directory, cache size and prefill policy rewritten (the fixed metrics ports dropped);
// the offline engine's text to compare with; the shell's counters summed over ranks.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/http_client.hpp"
#include "runtime/engine/engine_setup.hpp"
#include "tests/support/cluster.hpp"
#include "tools/shoald/engine_options.hpp"

namespace shoal::test {

inline const std::vector<std::string> node_files = {"gateway", "prefill-a", "prefill-b", "decode-a", "decode-b"};

inline const std::vector<std::string> all_ranks = {"prefill-a/rank0", "prefill-b/rank0", "decode-a/rank0",
                                            "decode-a/rank1",  "decode-b/rank0",  "decode-b/rank1"};

struct shape_cluster : cli_cluster {
  std::map<std::string, uint16_t> ports;
  uint16_t http_port = 0;
  std::optional<runtime::loaded_model> model;

  shape_cluster() {
    model = generated_model(model_dir, "v3-tiny", 35);
    http_port = free_port();
    for (const auto& n : node_files) ports[n] = free_port();
    for (size_t i = 0; i < node_files.size(); ++i) write_text(config_dir / (node_files[i] + ".toml"), sample(i));
    shell_port = ports["gateway"];
  }

  // Sample node i with this test's ports (no metrics port), model, storage directory and a smaller cache;
  // prefill requests alternate between the two prefill ranks (a repeated prompt then reaches
  // the rank that did not compute it, which reads its prefix from the storage tier).
  std::string sample(size_t i) const {
    std::string text = read_text(std::filesystem::path(SHOAL_SOURCE_DIR) / "config" / "deepseek-shape" / (node_files[i] + ".toml"));
    REQUIRE(!text.empty());
    for (size_t j = 0; j < node_files.size(); ++j)
      text = std::regex_replace(text, std::regex("127\\.0\\.0\\.1:730" + std::to_string(j)),
                                "127.0.0.1:" + std::to_string(ports.at(node_files[j])));
    text = std::regex_replace(text, std::regex("127\\.0\\.0\\.1:8000"), "127.0.0.1:" + std::to_string(http_port));
    text = std::regex_replace(text, std::regex("metrics_listen = \"[^\"]*\"\n"), "");  // fixed ports; not read here
    text = std::regex_replace(text, std::regex("\\.\\./\\.\\./models/small"), model_dir.string());
    text = std::regex_replace(text, std::regex("\\.\\./\\.\\./\\.shoal/deepseek-shape-chunks"),
                              (dir.path / "chunks").string());
    text = std::regex_replace(text, std::regex("cache_mib = 256"), "cache_mib = 32");
    text = std::regex_replace(text, std::regex("capacity_mib = 256"), "capacity_mib = 32");
    text = std::regex_replace(text, std::regex("prefill_policy = \"tiered\""), "prefill_policy = \"round_robin\"");
    return text;
  }

  std::string complete(const std::string& prompt, int max_tokens) const {
    auto r = actors::http_call("127.0.0.1", http_port, "POST", "/v1/completions",
                               completion_body(prompt, max_tokens, false).dump(), {});
    REQUIRE_MESSAGE(r, r.error());
    REQUIRE_MESSAGE(r->status == 200, r->body);
    return nlohmann::json::parse(r->body)["choices"][0]["text"].get<std::string>();
  }

  // The offline engine's greedy text (role both, no expert parallelism, no speculation).
  std::string offline(const std::string& prompt, int max_tokens) const {
    runtime::engine local(model->weights, tools::shoald::engine_config_for(model->weights->config,
                                                                           tools::shoald::default_cache_mib,
                                                                           model::kv_dtype::bf16));
    runtime::sampling_params p;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    auto id = local.add_request(runtime::encode_prompt(*model->tokenizer, prompt), p);
    REQUIRE_MESSAGE(id, (id ? "" : id.error().message));
    auto done = local.run_to_completion();
    REQUIRE(done.size() == 1);
    return as_json_text(model->tokenizer->decode(done[0].output));
  }

  // Until every block the engine ranks queued for the storage tier is written there: 12 chunk
  // puts each (10 + 2 erasure coding over the 12 storage node actors).
  void wait_written_back() {
    std::string command = "storage";
    for (const auto& r : all_ranks) command += "; stats " + r;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (;;) {
      const std::string out = shell(command);
      const int64_t queued = sum_of(out, "remote_stored"), puts = sum_of(out, "puts");
      if (queued > 0 && puts >= 12 * queued) return;
      REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline,
                      "blocks queued for storage " << queued << ", chunk puts " << puts << "\n" << out);
    }
  }

  // Sum of every " KEY=N" in `text`.
  static int64_t sum_of(const std::string& text, const std::string& key) {
    int64_t sum = 0;
    const std::regex re(" " + key + "=(\\d+)");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it)
      sum += std::stoll((*it)[1]);
    return sum;
  }

  // Sum of "KEY=N" over the given ranks' shell stats.
  int64_t stat_sum(const std::vector<std::string>& ranks, const std::string& key) {
    std::string command;
    for (const auto& r : ranks) command += (command.empty() ? "stats " : "; stats ") + r;
    return sum_of(shell(command), key);
  }
};

}  // namespace shoal::test
