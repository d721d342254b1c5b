// `shoald --config FILE.toml`: the per-node daemon. It reads the node config, loads the model
// (gateway: tokenizer and chat template; engine: the weights), starts the node agent on
// node.listen, the node's roles (tools/shoald/node.hpp), joins the cluster through the
// seeds, prints "shoald: listening on HOST:PORT" and serves until SIGTERM/SIGINT, which
// drains. Exit codes: 0 clean stop, 1 runtime failure (model, listen, join), 2 usage/config.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <csignal>
#include <cstdlib>
#include <cstdio>

#include <pthread.h>

#include "kernels/cpu/isa.hpp"
#include "tools/allocator.hpp"
#include "runtime/config/node_config.hpp"
#include "tools/shoald/log.hpp"
#include "tools/shoald/node.hpp"

namespace {

using namespace shoal;
constexpr int exit_usage = 2;

}  // namespace

int main(int argc, char** argv) {
  tools::tune_allocator();
  CLI::App app{"shoald: one shoal node"};
  std::string config_path, state_dir;
  app.add_option("--config", config_path, "node config file (TOML)")->required();
  app.add_option("--state-dir", state_dir,
                 "where the node keeps what it learns (fitted step-cost models); overrides node.state_dir");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : exit_usage;
  }

  auto cfg = runtime::load_node_config(config_path);
  if (!cfg) {
    fmt::print(stderr, "shoald: {}\n", runtime::to_string(cfg.error()));
    return exit_usage;
  }
  if (!state_dir.empty()) cfg->state_dir = std::filesystem::absolute(state_dir);
  if (auto isa = kernels::select_isa_from_env(); !isa) {
    fmt::print(stderr, "shoald: {}\n", isa.error());
    return exit_usage;
  }
  tools::shoald::logger log;
  if (auto msg = log.open(cfg->level, cfg->log_file ? cfg->log_file->string() : ""); !msg.empty()) {
    fmt::print(stderr, "shoald: {}: key 'log.file': {}\n", config_path, msg);
    return exit_usage;
  }
  log.info("cpu kernels: {}", kernels::isa_summary());
  // Fault injection (tests only): the config's [faults] plan, or SHOAL_FAULTS over it.
  runtime::fault_plan faults = cfg->faults;
  if (const char* env = std::getenv("SHOAL_FAULTS"); env && *env) {
    auto p = runtime::fault_plan::parse(env, true);
    if (!p) {
      fmt::print(stderr, "shoald: SHOAL_FAULTS: {}\n", p.error());
      return exit_usage;
    }
    faults = *p;
  }
  if (faults.any()) {
    runtime::install_faults(faults);
    log.warn("fault injection is ON ({}): for tests only", faults.to_string());
  }
  // Block the stop signals before any thread exists, so every thread inherits the mask and
  // the main thread's sigwait is the only receiver. A client that leaves mid-stream must not
  // kill the daemon with SIGPIPE.
  sigset_t set = tools::shoald::stop_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  return tools::shoald::run_node(*cfg, log);
}
