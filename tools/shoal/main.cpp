// `shoal`: the command-line front of the project. Subcommands: mkmodel (write a preset
// checkpoint), logits (last-position logits of a token list, for the reference check),
// generate (offline generation through the engine), bench (benchmarks). Each subcommand
// lives in its own file; this one only wires CLI11.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>

#include "kernels/cpu/isa.hpp"
#include "tools/allocator.hpp"
#include "tools/shoal/commands.hpp"

int main(int argc, char** argv) {
  if (!std::getenv("SHOAL_DEFAULT_MALLOC")) shoal::tools::tune_allocator();
  if (auto isa = shoal::kernels::select_isa_from_env(); !isa) {
    std::fprintf(stderr, "shoal: %s\n", isa.error().c_str());
    return 2;
  }
  CLI::App app{"shoal: distributed inference runtime for DeepSeek-style MoE models"};
  app.require_subcommand(1);
  shoal::tools::add_model_commands(app);
  shoal::tools::add_generate_command(app);
  shoal::tools::add_bench_commands(app);
  shoal::tools::add_shell_command(app);
  shoal::tools::add_cluster_commands(app);
  shoal::tools::add_sim_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return shoal::tools::exit_code();
}
