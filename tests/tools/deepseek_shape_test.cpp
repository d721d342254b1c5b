// DeepSeek's serving shape as `shoal up` starts it from the sample config/deepseek-shape/
// (gateway + SWA directory + storage tier on one node, a prefill expert-parallel group of 2
// ranks on 2 processes, a decode expert-parallel group of 4 ranks on 2 processes with DSpark;
// the test rewrites only ports (dropping the fixed metrics ports), the model path, the storage directory, the cache size and the
// prefill policy): 20 greedy requests, some sharing prefixes and some read back from the
// storage tier, equal the offline engine token for token; the shell shows both groups' EPLB,
// the balancers' placements on every group's ranks and DSpark's counts on the decode ranks.
// A node whose group disagrees (its declared size) is refused at join, naming itself and the
// field, and the group it tried to join keeps serving.
#include <doctest/doctest.h>

#include <chrono>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/shape_cluster.hpp"

using namespace shoal;
using namespace std::chrono_literals;
using nlohmann::json;
using test::completion_body;
using test::read_text;
using test::write_text;
namespace fs = std::filesystem;

using test::shape_cluster;

TEST_CASE("deepseek shape: prefill and decode expert-parallel groups with DSpark equal the offline engine, "
          "the shell shows both groups, a disagreeing node is refused at join") {
  shape_cluster c;
  c.start();
  // 20 requests: 8 distinct prompts and 8 sharing a long system prefix, four at a time; then
  // 2 long prompts each sent twice in a row: the prefill balancer alternates, so the second
  // send lands on the rank that did not compute it, which reads the prefix from the storage
  // tier (after the first one's write-back).
  const std::string prefix =
    "You are the assistant of a shipping company. Answer briefly and cite the rule number of the handbook "
    "that applies; never invent a rule. ";
  std::vector<std::string> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back("Plain question number " + std::to_string(i) + " about tides");
  for (int i = 0; i < 8; ++i) prompts.push_back(prefix + "Question " + std::to_string(i) + ": where is my parcel?");
  std::vector<std::string> got(prompts.size());
  for (size_t i = 0; i < prompts.size(); i += 4) {
    std::vector<std::thread> clients;
    for (size_t j = i; j < i + 4; ++j) clients.emplace_back([&, j] { got[j] = c.complete(prompts[j], 12); });
    for (auto& t : clients) t.join();
  }
  for (int k = 0; k < 2; ++k) {
    const std::string p = "A long letter number " + std::to_string(k) + " to the harbour master, about the berths, "
                          "the cranes, the pilots and the tides of the coming spring season";
    for (int twice = 0; twice < 2; ++twice) {
      prompts.push_back(p);
      got.push_back(c.complete(p, 12));
      c.wait_written_back();  // the first send's blocks are in the storage tier
    }
  }
  REQUIRE(prompts.size() == 20);
  for (size_t i = 0; i < prompts.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i] == c.offline(prompts[i], 12));
  }

  const std::vector<std::string> prefill = {"prefill-a/rank0", "prefill-b/rank0"};
  const std::vector<std::string> decode = {"decode-a/rank0", "decode-a/rank1", "decode-b/rank0", "decode-b/rank1"};
  // Every request was handed off; the decode ranks verified and accepted MTP drafts.
  CHECK(c.stat_sum(prefill, "handoffs_placed") == static_cast<int64_t>(prompts.size()));
  CHECK(c.stat_sum(decode, "handoffs_taken") == static_cast<int64_t>(prompts.size()));
  CHECK(c.stat_sum(decode, "spec_verified") > 0);
  const std::string d0 = c.shell("stats decode-a/rank0");
  CHECK_MESSAGE(d0.find("spec_accepted=") != std::string::npos, d0);
  // Decode ranks fit their decode steps (the decode balancer's weights once all four have one).
  CHECK(c.stat_sum(decode, "decode_cost_model_samples") > 0);
  // Some prefixes came from the storage tier.
  CHECK(c.stat_sum(prefill, "remote_hit_tokens") > 0);

  const std::string eplb = c.shell("eplb");
  CHECK_MESSAGE(eplb.find("group 'prefill' (2 ranks)") != std::string::npos, eplb);
  CHECK_MESSAGE(eplb.find("group 'decode' (4 ranks)") != std::string::npos, eplb);
  const std::string balancers = c.shell("balancers");
  CHECK_MESSAGE(balancers.find("decode_balancer: policy=decode_balancer") != std::string::npos, balancers);
  CHECK_MESSAGE(balancers.find(" weights=") != std::string::npos, balancers);
  for (const auto& r : {"prefill-a/0", "prefill-b/0", "decode-a/0", "decode-a/1", "decode-b/0", "decode-b/1"})
    CHECK_MESSAGE(balancers.find(std::string("  ") + r + ":") != std::string::npos, balancers);

  // A third decode node declaring a group of 2 is refused at join and exits; the group serves on.
  std::string text = c.sample(3);
  const uint16_t port = test::free_port();
  text = std::regex_replace(text, std::regex("name = \"decode-a\""), "name = \"decode-c\"");
  text = std::regex_replace(text, std::regex("127\\.0\\.0\\.1:" + std::to_string(c.ports["decode-a"])),
                            "127.0.0.1:" + std::to_string(port));
  text = std::regex_replace(text, std::regex("ep_group_size = 4"), "ep_group_size = 2");
  write_text(c.dir.path / "decode-c.toml", text);
  test::child_process p({SHOAL_SHOALD_BIN, "--config", (c.dir.path / "decode-c.toml").string()},
                        c.dir.path / "decode-c.out", c.dir.path / "decode-c.err");
  auto code = p.wait_exit(120s);
  REQUIRE(code);
  CHECK(*code != 0);
  const std::string log = read_text(c.dir.path / "decode-c.out") + read_text(c.dir.path / "decode-c.err");
  CHECK_MESSAGE(log.find("node 'decode-c' cannot join expert-parallel group 'decode'") != std::string::npos, log);
  CHECK_MESSAGE(log.find("engine.ep_group_size is 2") != std::string::npos, log);
  CHECK(c.shell("eplb decode").find("group 'decode' (4 ranks)") != std::string::npos);
  CHECK(c.complete(prompts[0], 12) == got[0]);
}
