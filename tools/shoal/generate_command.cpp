// `shoal generate`: offline generation through the engine (filled in with the engine).
#include <CLI/CLI.hpp>

#include "tools/shoal/commands.hpp"

namespace shoal::tools {

void add_generate_command(CLI::App& app) {}

}  // namespace shoal::tools
