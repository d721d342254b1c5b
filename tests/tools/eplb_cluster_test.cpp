// The expert-parallel balancer live in a cluster (issue: EP for real, acceptance 2): a gateway
// and two engine processes of 2 ranks each, the 4 ranks one EP group, on a checkpoint whose
// routing favours experts 0-3 (`mkmodel --hot-experts 4`: the gate bias of every MoE layer
// raised for them, all on rank 0 under contiguous blocks). Greedy outputs equal the offline
// engine's before, during (an `eplb rebalance` from the shell while streams run) and after
// the migration; the slowest rank / mean of the pairs the ranks compute drops; each process
// holds only its ranks' experts, and the experts a process gains come from the other's memory.
// Frames of 1 KiB and more and the migrating experts travel over libfabric, read from the
// sender's registered memory (engine.transport = "auto": shm, both processes being on this
// host).
#include <doctest/doctest.h>

#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/http_client.hpp"
#include "model/forward.hpp"
#include "model/generate.hpp"
#include "runtime/serve/chat_template.hpp"
#include "runtime/engine/engine_setup.hpp"
#include "tests/support/cluster.hpp"
#include "tools/shoald/engine_options.hpp"

using namespace shoal;
using namespace std::chrono_literals;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string node_text(const std::string& name, uint16_t port, const std::string& roles, const fs::path& model_dir,
                      const std::string& sections, uint16_t seed_port, uint16_t metrics_port) {
  std::string t = test::node_config_text(name, port, roles, model_dir, sections, seed_port);
  if (metrics_port)  // into [node], after its first line
    t.insert(t.find('\n') + 1, "metrics_listen = \"127.0.0.1:" + std::to_string(metrics_port) + "\"\n");
  return t;
}

// "pairs computed per rank: a b c d" of the shell's `eplb`.
std::vector<double> pairs_of(const std::string& eplb) {
  std::smatch m;
  std::vector<double> out;
  if (!std::regex_search(eplb, m, std::regex("pairs computed per rank:([0-9 ]+)\n"))) return out;
  std::istringstream in(m[1].str());
  for (double x; in >> x;) out.push_back(x);
  return out;
}

double imbalance(const std::vector<double>& before, const std::vector<double>& after) {
  REQUIRE(before.size() == after.size());
  double mean = 0, top = 0;
  for (size_t r = 0; r < after.size(); ++r) {
    mean += (after[r] - before[r]) / static_cast<double>(after.size());
    top = std::max(top, after[r] - before[r]);
  }
  REQUIRE(mean > 0);
  return top / mean;
}

double metric(uint16_t port, const std::string& series) {
  auto r = actors::http_call("127.0.0.1", port, "GET", "/metrics", "");
  REQUIRE_MESSAGE(r, r.error());
  std::smatch m;
  REQUIRE_MESSAGE(std::regex_search(r->body, m, std::regex(series + " ([0-9.e+-]+)\\n")), series << "\n" << r->body);
  return std::stod(m[1]);
}

}  // namespace

TEST_CASE("eplb cluster: a 4-rank group across 2 processes rebalances live under skewed routing, outputs unchanged") {
  test::cli_cluster c;
  model::generate_options gen;
  gen.preset = "tiny";
  gen.seed = 11;
  gen.hot_experts = 4;
  gen.out_dir = c.model_dir.string();
  REQUIRE(model::generate_checkpoint(gen));
  auto model = runtime::load_model_dir(c.model_dir.string(), false);
  REQUIRE(model);
  const int64_t E = model->weights->config.n_routed_experts, slots = model::moe_slot_count(model->weights->config);

  const uint16_t gw = test::free_port(), http = test::free_port(), a = test::free_port(), b = test::free_port();
  const uint16_t metrics_a = test::free_port(), metrics_b = test::free_port();
  c.shell_port = gw;
  test::write_text(c.config_dir / "gateway.toml",
                   node_text("gateway", gw, "[\"gateway\"]", c.model_dir,
                             "[gateway]\nlisten = \"127.0.0.1:" + std::to_string(http) + "\"\n", 0, 0));
  // Plans only when asked (period far away); reports every 200 ms.
  const std::string engine =
    "[engine]\nranks = 2\nexpert_parallel = true\ncache_mib = 64\nep_bulk_min_bytes = 1024\ntransport = \"auto\"\n\n"
    "[eplb]\npreset = \"decode\"\nperiod_steps = 100000000\nwindow_steps = 1000\ninterval_ms = 200\n";
  test::write_text(c.config_dir / "engine-a.toml", node_text("engine-a", a, "[\"engine\"]", c.model_dir, engine, gw, metrics_a));
  test::write_text(c.config_dir / "engine-b.toml", node_text("engine-b", b, "[\"engine\"]", c.model_dir, engine, gw, metrics_b));
  c.start();

  const int32_t n = 24;
  std::vector<std::string> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back("prompt " + std::to_string(i) + " about experts and load");
  std::vector<std::string> expected(prompts.size());
  {
    runtime::engine local(model->weights, tools::shoald::engine_config_for(model->weights->config));
    runtime::sampling_params p;
    p.max_tokens = n;
    p.ignore_eos = true;
    std::map<int64_t, size_t> index;
    for (size_t i = 0; i < prompts.size(); ++i)
      index[local.add_request(runtime::encode_prompt(*model->tokenizer, prompts[i]), p)->value] = i;
    for (auto& done : local.run_to_completion())
      expected[index.at(done.id.value)] = test::as_json_text(model->tokenizer->decode(done.output));
  }
  // All prompts at once (streamed or not); each text checked against the offline engine's.
  auto serve_all = [&](bool stream, const std::function<void()>& meanwhile = {}) {
    std::vector<std::string> texts(prompts.size()), errors(prompts.size());
    std::vector<std::thread> clients;
    for (size_t i = 0; i < prompts.size(); ++i)
      clients.emplace_back([&, i] {
        auto r = actors::http_call("127.0.0.1", http, "POST", "/v1/completions",
                                   test::completion_body(prompts[i], n, stream).dump(), {});
        if (!r) return void(errors[i] = r.error());
        if (r->status != 200) return void(errors[i] = r->body);
        bool done = false;
        texts[i] = stream ? test::stream_text(r->body, false, done, &errors[i])
                          : json::parse(r->body)["choices"][0]["text"].get<std::string>();
      });
    if (meanwhile) meanwhile();
    for (auto& t : clients) t.join();
    for (size_t i = 0; i < prompts.size(); ++i) {
      CAPTURE(i);
      CHECK(errors[i] == "");
      CHECK(texts[i] == expected[i]);
    }
  };

  // Before: contiguous blocks, epoch 0.
  serve_all(false);
  std::string status;
  for (int i = 0; i < 50 && pairs_of(status).size() != 4; ++i) {  // the leader's first round
    std::this_thread::sleep_for(200ms);
    status = c.shell("eplb");
  }
  INFO(status);
  REQUIRE(pairs_of(status).size() == 4);
  CHECK(status.find("placement epoch 0") != std::string::npos);
  CHECK(status.find("last plan: none yet") != std::string::npos);
  const std::vector<double> before = pairs_of(status);
  const double skewed = imbalance(std::vector<double>(4, 0.0), before);
  auto bytes_read = [&](uint16_t port, const char* source) {
    return metric(port, std::string("shoal_ep_expert_bytes_read_total\\{source=\"") + source + "\"\\}");
  };
  const double checkpoint_before = bytes_read(metrics_a, "checkpoint") + bytes_read(metrics_b, "checkpoint");
  CHECK(checkpoint_before > 0);  // the group's start: each process read its ranks' experts

  // During: a rebalance asked for while 8 streams run.
  serve_all(true, [&] {
    std::this_thread::sleep_for(300ms);
    std::string asked = c.shell("eplb rebalance");
    CHECK(asked.find("rebalance asked") != std::string::npos);
  });
  // The ranks adopt the plan at their next steps: serve until the switch shows.
  for (int i = 0; i < 20 && status.find("placement epoch 1") == std::string::npos; ++i) {
    serve_all(false);
    std::this_thread::sleep_for(300ms);
    status = c.shell("eplb");
  }
  INFO(status);
  REQUIRE(status.find("placement epoch 1") != std::string::npos);
  CHECK(status.find("last plan: epoch 1") != std::string::npos);
  CHECK(status.find("expert weights moved") != std::string::npos);
  std::this_thread::sleep_for(500ms);  // a report round after the last requests
  const std::vector<double> mid = pairs_of(c.shell("eplb"));

  // After: the same skew spread over the replicas.
  serve_all(false);
  std::this_thread::sleep_for(500ms);
  status = c.shell("eplb");
  const std::vector<double> after = pairs_of(status);
  const double balanced = imbalance(mid, after);
  MESSAGE("slowest rank / mean of the pairs computed: " << skewed << " before, " << balanced << " after");
  CHECK(skewed > 1.5);
  CHECK(balanced < skewed);
  CHECK(balanced < 1.4);

  // The shell shows each rank's share and each process's memory: its resident set and the
  // routed experts it holds (fewer than the model's).
  std::smatch mem;
  REQUIRE(std::regex_search(status, mem, std::regex("memory per process: [^\n]*RSS ([0-9.]+) MB, routed experts ([0-9]+) "
                                                     "held \\([0-9.]+ MB\\); [^\n]*RSS ([0-9.]+) MB, routed experts "
                                                     "([0-9]+) held")));
  MESSAGE(mem[0].str());
  CHECK(std::stod(mem[1]) > 0);
  CHECK(std::stoll(mem[2]) < slots * E);
  CHECK(std::stoll(mem[4]) < slots * E);
  CHECK(std::regex_search(status, std::regex("experts computed per rank \\(redundant copies included\\): [0-9]+ [0-9]+ [0-9]+ [0-9]+\n")));
  CHECK(metric(metrics_a, "process_resident_memory_bytes") > 0);
  // Each process holds only its two ranks' experts, and every expert is held somewhere.
  const double held_a = metric(metrics_a, "shoal_engine_experts_resident\\{actor=\"node\"\\}");
  const double held_b = metric(metrics_b, "shoal_engine_experts_resident\\{actor=\"node\"\\}");
  CHECK(held_a < static_cast<double>(slots * E));
  CHECK(held_b < static_cast<double>(slots * E));
  CHECK(held_a + held_b >= static_cast<double>(slots * E));
  CHECK(held_a + held_b <= static_cast<double>(slots * (E + 4)));  // + one redundant copy per rank
  // The experts each process gained came from the other's memory over libfabric, none from
  // the checkpoint.
  CHECK(bytes_read(metrics_a, "holder") + bytes_read(metrics_b, "holder") > 0);
  CHECK(bytes_read(metrics_a, "checkpoint") + bytes_read(metrics_b, "checkpoint") == checkpoint_before);
  CHECK(metric(metrics_a, "shoal_ep_expert_read_failures_total\\{actor=\"node\"\\}") == 0);
  CHECK(std::regex_search(status, std::regex("expert weights read: [0-9.]+ MB from holders over the transport")));
  CHECK(status.find("expert weights read: 0.0 MB from holders") == std::string::npos);
  // Both processes on this host: every range read went through shm, none through tcp.
  for (uint16_t m : {metrics_a, metrics_b}) {
    CHECK(metric(m, "shoal_transport_reads_total\\{path=\"shm\"\\}") > 0);
    CHECK(metric(m, "shoal_transport_reads_total\\{path=\"network\"\\}") == 0);
  }
  // The frames of 1 KiB and more went over libfabric.
  CHECK(metric(metrics_a, "shoal_ep_frames_sent_total\\{path=\"bulk\"\\}") > 0);
  CHECK(metric(metrics_b, "shoal_ep_frames_sent_total\\{path=\"bulk\"\\}") > 0);
  CHECK(metric(metrics_a, "shoal_ep_frames_sent_total\\{path=\"inline\"\\}") > 0);
}
