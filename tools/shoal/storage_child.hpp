// A storage cluster in a child process for the benches: 12 (or `nodes`) storage node actors
// on temp directories under `parent_dir`, published over the middleman. Fork it before the
// parent starts an actor system or threads of its own; the child removes its directories and
// exits when the parent closes the control pipe (or exits).
#pragma once

#include <cstdint>
#include <string>
#include <sys/types.h>

namespace caf {
class actor_system;
class actor_system_config;
}

namespace shoal::actors {
struct membership;
}

namespace shoal::tools {

struct storage_child_options {
  int nodes = 12;
  std::string parent_dir = "/tmp";
  bool fsync = false;
  uint64_t capacity_bytes = 16ull << 30;  // per node
  double gc_high_watermark = 0.9, gc_low_watermark = 0.7;
};

struct storage_child {
  pid_t pid = -1;
  int ctl = -1;      // the parent's end: closing it (or exiting) tells the child to clean up and go
  int port_fd = -1;  // the child writes its published port here once it is up
  uint16_t port = 0;
  std::string dir;
};

storage_child fork_storage_child(const storage_child_options& o);
// Blocks until the child published its members actor (throws when it failed to start).
void wait_port(storage_child& c);
void stop_storage_child(storage_child& c);
// The child's membership (one node, "bench", holding every storage actor), asked over the
// middleman of `sys` (throws on failure).
actors::membership storage_members(caf::actor_system& sys, const storage_child& c);
// CAF settings every bench process uses (message types, middleman, scheduler policy).
void configure_bench_system(caf::actor_system_config& cfg);

}  // namespace shoal::tools
