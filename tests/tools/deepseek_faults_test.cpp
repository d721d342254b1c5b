// A lost process of an expert-parallel group in the DeepSeek-shaped sample cluster
// (config/deepseek-shape/: a prefill group of 2 ranks on 2 processes, a decode group of 4 ranks
// on 2 processes with DSpark): kill -9 or SIGSTOP of one process of either group under 30
// greedy streams fails no stream, and every stream's text is the offline engine's, token for
// token (nothing repeated or missing across the re-route); a process restarted with `shoal up
// --node` (kill -9) or resumed (SIGCONT) joins its group back at full size and the cluster
// serves exactly.
#include <doctest/doctest.h>

#include <chrono>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>

#include "tests/support/shape_cluster.hpp"

using namespace shoal;
using namespace std::chrono_literals;

namespace {

enum class fault { kill, stop };

// The group `victim` belongs to, and its full size.
struct group_of {
  std::string name;
  int ranks;
};
group_of group(const std::string& victim) { return victim.starts_with("prefill") ? group_of{"prefill", 2} : group_of{"decode", 4}; }

void lose_and_rejoin(const std::string& victim, fault f) {
  test::shape_cluster c;
  for (const auto& node : test::node_files) {  // debug logs: a failure's context
    const auto file = c.config_dir / (node + ".toml");
    test::write_text(file, std::regex_replace(test::read_text(file), std::regex("level = \"info\""), "level = \"debug\""));
  }
  c.start();
  const int streams = 30;
  const int32_t n = 24;
  std::vector<std::string> prompts;
  for (int i = 0; i < streams; ++i) prompts.push_back("stream number " + std::to_string(i) + " asks about the tides");
  std::vector<std::string> expected;
  for (const auto& p : prompts) expected.push_back(c.offline(p, n));

  const auto pids = test::cluster_pids(c.state_dir);
  REQUIRE(pids.contains(victim));
  const pid_t pid = pids.at(victim);
  auto post = [&](const std::string& path, const nlohmann::json& body, actors::http_call_options o) {
    return actors::http_call("127.0.0.1", c.http_port, "POST", path, body.dump(), o);
  };
  auto inject = [&] { return ::kill(pid, f == fault::kill ? SIGKILL : SIGSTOP) == 0; };
  struct resume_at_end {  // a stopped process is resumed even when a check below throws
    pid_t pid;
    ~resume_at_end() { ::kill(pid, SIGCONT); }
  } resume{pid};
  auto got = test::streams_with_fault(post, prompts, n, 1, inject);
  MESSAGE(victim << std::string(f == fault::kill ? " killed" : " stopped") << " after " << got.kill_at_s << " s, streams ended after "
                 << got.seconds << " s");
  const int failed = test::check_streams_exact(got, expected);
  CHECK(failed == 0);
  if (failed) {  // the ranks' counters: where the failed ones were
    std::string command;
    for (const auto& r : test::all_ranks)
      if (!r.starts_with(victim)) command += (command.empty() ? "stats " : "; stats ") + r;
    MESSAGE(c.shell(command) << test::log_tails(c.state_dir));
  }

  // Back: restarted with `shoal up --node` (refused while it runs), or resumed; the group is
  // whole again and serves exactly.
  std::string out;
  const std::vector<std::string> restart = {"up", "--config", c.config_dir.string(), "--state-dir", c.state_dir.string(),
                                            "--node", victim, "--timeout", "120"};
  if (f == fault::kill) {
    REQUIRE_MESSAGE(c.shoal(restart, out) == 0, out);
    CHECK(test::cluster_pids(c.state_dir).at(victim) != pid);
    CHECK(c.shoal(restart, out) == 1);
    CHECK_MESSAGE(out.find("shoal up --node " + victim + ": it is running already") != std::string::npos, out);
  } else {
    REQUIRE(::kill(pid, SIGCONT) == 0);
  }
  const auto g = group(victim);
  const std::string whole = "group '" + g.name + "' (" + std::to_string(g.ranks) + " ranks)";
  const auto deadline = std::chrono::steady_clock::now() + 90s;
  std::string eplb;
  for (;;) {
    eplb = c.shell("eplb " + g.name);
    const std::string nodes = c.shell("nodes");
    if (eplb.find(whole) != std::string::npos && nodes.find(victim) != std::string::npos) break;
    REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, "not whole again:\n" << eplb << nodes << test::log_tails(c.state_dir));
    std::this_thread::sleep_for(250ms);
  }
  for (int i = 0; i < 4; ++i) CHECK(c.complete(prompts[i], n) == expected[i]);
}

}  // namespace

TEST_CASE("deepseek shape faults: kill -9 of a decode group process under 30 streams fails none, the restarted process rejoins") {
  lose_and_rejoin("decode-b", fault::kill);
}

TEST_CASE("deepseek shape faults: SIGSTOP of a decode group process under 30 streams fails none, it rejoins after SIGCONT") {
  lose_and_rejoin("decode-b", fault::stop);
}

TEST_CASE("deepseek shape faults: kill -9 of a prefill group process under 30 streams fails none, the restarted process rejoins") {
  lose_and_rejoin("prefill-b", fault::kill);
}

TEST_CASE("deepseek shape faults: SIGSTOP of a prefill group process under 30 streams fails none, it rejoins after SIGCONT") {
  lose_and_rejoin("prefill-b", fault::stop);
}
