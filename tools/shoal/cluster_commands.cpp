// `shoal up --config DIR|FILE` and `shoal down`: a local multi-process cluster. up starts one
// shoald per node config (nodes without seeds first), each in its own session with its log
// in the state directory, waits until every node listens and the first node's agent knows
// them all, and records the pids; down sends SIGTERM (nodes drain), then SIGKILL after a
// timeout, and removes the record.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/cluster_tls.hpp"
#include "actors/interfaces.hpp"
#include "runtime/config/node_config.hpp"
#include "tools/shoal/commands.hpp"

extern char** environ;

namespace shoal::tools {

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

struct node_entry {
  fs::path file;
  runtime::node_config config;
  pid_t pid = -1;
  fs::path log;
};

fs::path self_dir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::current_path() : exe.parent_path();
}

// A zombie still answers kill(pid, 0): a child of this process that exited is reaped, and a
// node whose parent has not reaped it (`shoal up` exited; an init that reaps late) is dead by
// its /proc state.
bool alive(pid_t pid) {
  if (pid <= 0) return false;
  waitpid(pid, nullptr, WNOHANG);
  if (kill(pid, 0) != 0) return false;
  const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || (stat[paren + 2] != 'Z' && stat[paren + 2] != 'X');
}

std::vector<std::pair<pid_t, std::string>> read_state(const fs::path& state) {
  std::vector<std::pair<pid_t, std::string>> out;
  std::ifstream f(state);
  pid_t pid;
  std::string name;
  while (f >> pid >> name) out.emplace_back(pid, name);
  return out;
}

// The node configs of `path` (a .toml file or a directory of them), seedless nodes first.
std::optional<std::vector<node_entry>> load_nodes(const fs::path& path) {
  std::vector<fs::path> files;
  if (fs::is_directory(path)) {
    for (const auto& e : fs::directory_iterator(path))
      if (e.path().extension() == ".toml") files.push_back(e.path());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  if (files.empty()) {
    fmt::print(stderr, "shoal up: no *.toml node config in {}\n", path.string());
    return std::nullopt;
  }
  std::vector<node_entry> nodes;
  for (const auto& f : files) {
    auto c = runtime::load_node_config(f);
    if (!c) {
      fmt::print(stderr, "shoal up: {}\n", runtime::to_string(c.error()));
      return std::nullopt;
    }
    nodes.push_back({f, std::move(*c), -1, {}});
  }
  std::stable_sort(nodes.begin(), nodes.end(), [](const node_entry& a, const node_entry& b) {
    return a.config.seeds.empty() && !b.config.seeds.empty();
  });
  return nodes;
}

bool start_node(node_entry& n, const fs::path& shoald, const fs::path& state_dir) {
  n.log = state_dir / (n.config.name + ".log");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, n.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);  // survives the shell that ran `shoal up`
  // The nodes keep what they learn (fitted step-cost models) in the cluster's state directory.
  std::string bin = shoald.string(), flag = "--config", cfg = fs::absolute(n.file).string(), sflag = "--state-dir",
              state = fs::absolute(state_dir).string();
  char* argv[] = {bin.data(), flag.data(), cfg.data(), sflag.data(), state.data(), nullptr};
  int rc = posix_spawn(&n.pid, bin.c_str(), &fa, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    fmt::print(stderr, "shoal up: cannot start {}: {}\n", bin, std::strerror(rc));
    return false;
  }
  return true;
}

// Waits for the node's "shoald: listening on" line; false when it exits or times out.
bool wait_listening(node_entry& n, clock_type::time_point deadline) {
  while (clock_type::now() < deadline) {
    if (read_text(n.log).find("shoald: listening on ") != std::string::npos) return true;
    int st = 0;
    if (waitpid(n.pid, &st, WNOHANG) == n.pid) {
      n.pid = -1;
      return false;
    }
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

// Until the first node's agent lists `expected` nodes (or the deadline passes).
bool wait_membership(const node_entry& first, size_t expected, clock_type::time_point deadline) {
  caf::actor_system_config cfg;
  cfg.load<caf::io::middleman>();
  actors::add_message_types(cfg);
  // A cluster with TLS: this process presents the first node's credential.
  const runtime::node_config& nc = first.config;
  if (nc.tls_certificate && nc.tls_key && nc.tls_ca_file)
    actors::use_tls(cfg, {nc.tls_certificate->string(), nc.tls_key->string(), nc.tls_ca_file->string()});
  caf::actor_system sys{cfg};
  bool complete = false;
  std::string host = first.config.listen.host;
  uint16_t port = first.config.listen.port;
  if (port == 0) return true;  // an OS-chosen port cannot be looked up from here
  if (auto agent = actors::connect_agent(sys, host, port, 10s)) {
    caf::scoped_actor self{sys};
    while (!complete && clock_type::now() < deadline) {
      self->request(*agent, 5s, members_atom_v)
        .receive([&](const actors::membership& m) { complete = m.nodes.size() >= expected; },
                 [&](caf::error&) {});
      if (!complete) std::this_thread::sleep_for(100ms);
    }
  }
  return complete;
}

void stop_all(const std::vector<std::pair<pid_t, std::string>>& nodes, std::chrono::seconds timeout) {
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it)
    if (alive(it->first)) kill(it->first, SIGTERM);
  auto deadline = clock_type::now() + timeout;
  for (const auto& [pid, name] : nodes) {
    while (alive(pid) && clock_type::now() < deadline) {
      waitpid(pid, nullptr, WNOHANG);
      std::this_thread::sleep_for(50ms);
    }
    if (alive(pid)) {
      fmt::print(stderr, "shoal down: {} (pid {}) did not stop within {} s: killed\n", name, pid, timeout.count());
      kill(pid, SIGKILL);
    } else {
      fmt::print("stopped {} (pid {})\n", name, pid);
    }
  }
}

}  // namespace

std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string recorded_cluster(const fs::path& state_dir) {
  bool running = false;
  for (const auto& [pid, name] : read_state(state_dir / "cluster.pids")) running = running || alive(pid);
  if (!running) return "";
  std::string addr = read_text(state_dir / "cluster.connect");
  while (!addr.empty() && (addr.back() == '\n' || addr.back() == ' ')) addr.pop_back();
  return addr;
}

int cluster_up(const fs::path& config, const fs::path& state_dir, int timeout_s) {
  fs::path state = state_dir / "cluster.pids";
  for (const auto& [pid, name] : read_state(state))
    if (alive(pid)) {
      fmt::print(stderr, "shoal up: a cluster is already up ({} is pid {}); run `shoal down` first\n", name, pid);
      return 1;
    }
  auto nodes = load_nodes(config);
  if (!nodes) return 2;
  fs::create_directories(state_dir);
  fs::path shoald = self_dir() / "shoald";
  auto deadline = clock_type::now() + std::chrono::seconds(timeout_s);
  std::vector<std::pair<pid_t, std::string>> started;
  auto abort_up = [&](const node_entry& n, const std::string& why) {
    fmt::print(stderr, "shoal up: node '{}' {}; its log ({}):\n{}\n", n.config.name, why, n.log.string(),
               read_text(n.log));
    stop_all(started, 10s);
    return 1;
  };
  for (auto& n : *nodes) {
    if (!start_node(n, shoald, state_dir)) return abort_up(n, "could not start");
    started.emplace_back(n.pid, n.config.name);
    std::ofstream(state, std::ios::app) << n.pid << ' ' << n.config.name << '\n';
    if (!wait_listening(n, deadline)) return abort_up(n, "did not come up");
    fmt::print("started {} (pid {}), log {}\n", n.config.name, n.pid, n.log.string());
  }
  if (!wait_membership(nodes->front(), nodes->size(), deadline))
    return abort_up(nodes->front(), "does not see every node");
  // `shoal shell` without --connect reaches the cluster through the first node (it knows every node).
  std::ofstream(state_dir / "cluster.connect", std::ios::trunc) << runtime::to_string(nodes->front().config.listen) << '\n';
  for (const auto& n : *nodes)
    if (n.config.http_listen)
      fmt::print("cluster up: {} node(s); OpenAI API at http://{}/v1 ; shell: shoal shell --connect {}\n",
                 nodes->size(), runtime::to_string(*n.config.http_listen), runtime::to_string(n.config.listen));
  return 0;
}

std::map<std::string, int> cluster_pids(const fs::path& state_dir) {
  std::map<std::string, int> out;
  for (const auto& [pid, name] : read_state(state_dir / "cluster.pids")) out[name] = pid;
  return out;
}

int cluster_start_node(const fs::path& config, const fs::path& state_dir, const std::string& name, int timeout_s) {
  fs::path state = state_dir / "cluster.pids";
  auto recorded = read_state(state);
  for (const auto& [pid, n] : recorded)
    if (n == name && alive(pid)) {
      fmt::print(stderr, "shoal up --node {}: it is running already (pid {})\n", name, pid);
      return 1;
    }
  if (recorded_cluster(state_dir).empty()) {
    fmt::print(stderr, "shoal up --node {}: no running cluster recorded in {} (start it with shoal up)\n", name,
               state_dir.string());
    return 1;
  }
  auto nodes = load_nodes(config);
  if (!nodes) return 2;
  auto it = std::find_if(nodes->begin(), nodes->end(), [&](const node_entry& n) { return n.config.name == name; });
  if (it == nodes->end()) {
    fmt::print(stderr, "shoal up --node {}: no node of that name in {}\n", name, config.string());
    return 2;
  }
  if (!start_node(*it, self_dir() / "shoald", state_dir)) return 1;
  std::erase_if(recorded, [&](const auto& e) { return e.second == name; });
  recorded.emplace_back(it->pid, name);
  {
    std::ofstream f(state, std::ios::trunc);
    for (const auto& [pid, n] : recorded) f << pid << ' ' << n << '\n';
  }
  if (!wait_listening(*it, clock_type::now() + std::chrono::seconds(timeout_s))) {
    fmt::print(stderr, "shoal up --node {}: it did not come up; its log ({}):\n{}\n", name, it->log.string(),
               read_text(it->log));
    return 1;
  }
  fmt::print("started {} (pid {}), log {}\n", name, it->pid, it->log.string());
  return 0;
}

int cluster_down(const fs::path& state_dir, int timeout_s) {
  fs::path state = state_dir / "cluster.pids";
  auto nodes = read_state(state);
  if (nodes.empty()) {
    fmt::print("shoal down: no cluster recorded in {}\n", state.string());
    return 0;
  }
  stop_all(nodes, std::chrono::seconds(timeout_s));
  std::error_code ec;
  fs::remove(state, ec);
  fs::remove(state_dir / "cluster.connect", ec);
  return 0;
}

void add_cluster_commands(CLI::App& app) {
  static std::string config = "config/local-3node", state_dir = ".shoal", node;
  static int up_timeout = 300, down_timeout = 60;
  auto* up = app.add_subcommand("up", "start a local multi-process cluster (one shoald per node config)");
  up->add_option("--config", config, "a node config (.toml) or a directory of them")->capture_default_str();
  up->add_option("--state-dir", state_dir, "where node logs and the pid record go")->capture_default_str();
  up->add_option("--timeout", up_timeout, "seconds to wait for every node")->capture_default_str();
  up->add_option("--node", node, "start only this node of the config in the running cluster (a restart after it died)");
  up->callback([] {
    set_exit_code(node.empty() ? cluster_up(config, state_dir, up_timeout)
                               : cluster_start_node(config, state_dir, node, up_timeout));
  });
  auto* down = app.add_subcommand("down", "stop the cluster `shoal up` started (SIGTERM: nodes drain)");
  down->add_option("--state-dir", state_dir, "the state directory given to `shoal up`")->capture_default_str();
  down->add_option("--timeout", down_timeout, "seconds before SIGKILL")->capture_default_str();
  down->callback([] { set_exit_code(cluster_down(state_dir, down_timeout)); });
}

}  // namespace shoal::tools
