// One shoald node at run time: the actor system, the node agent, the roles it runs (engine
// ranks, gateway + router) and the drain on SIGTERM. run_node returns the exit code.
#pragma once

#include <csignal>

#include "runtime/config/node_config.hpp"
#include "tools/shoald/log.hpp"

namespace shoal::tools::shoald {

// SIGTERM and SIGINT: blocked in every thread, received by the main thread's sigwait.
sigset_t stop_signals();

int run_node(const runtime::node_config& cfg, logger& log);

}  // namespace shoal::tools::shoald
