// The benches' storage cluster child process (see storage_child.hpp).
#include "tools/shoal/storage_child.hpp"

#include <fmt/core.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/interfaces.hpp"
#include "actors/storage_node_actor.hpp"
#include "storage/chunk_file.hpp"

namespace shoal::tools {

namespace {

// The child: its own actor system with the middleman, the storage nodes on temp dirs, and a
// published actor that answers members_atom with them. Never returns.
[[noreturn]] void run_storage_child(int port_fd, int ctl_fd, const std::string& dir, const storage_child_options& o) {
  int rc = 0;
  {
    caf::actor_system_config cfg;
    configure_bench_system(cfg);
    caf::actor_system sys{cfg};
    actors::node_info info;
    info.name = "bench";
    info.host = "127.0.0.1";
    info.roles = {"storage"};
    for (int i = 0; i < o.nodes; ++i) {
      actors::storage_node_config c;
      c.store.root = dir + "/" + std::to_string(i);
      c.store.capacity_bytes = o.capacity_bytes;
      c.store.max_chunk_bytes = 64ull << 20;
      c.store.gc_high_watermark = o.gc_high_watermark;
      c.store.gc_low_watermark = o.gc_low_watermark;
      c.store.sync = o.fsync ? storage::sync_policy::always : storage::sync_policy::never;
      c.store.now_ms = [] {
        return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
      };
      auto a = actors::spawn_storage_node(sys, c);
      if (!a) {
        fmt::print(stderr, "storage child: {}\n", a.error());
        uint16_t zero = 0;
        storage::write_all(port_fd, std::as_bytes(std::span(&zero, 1)));
        std::_Exit(1);
      }
      info.storage.push_back(caf::actor_cast<caf::actor>(a->actor));
      info.storage_ports.push_back(a->bulk_port);
    }
    actors::membership m;
    m.version = 1;
    m.nodes.push_back(info);
    auto members = sys.spawn([m](caf::event_based_actor*) -> caf::behavior {
      return {[m](members_atom) { return m; }};
    });
    auto port = sys.middleman().publish(members, 0, "127.0.0.1", true);
    uint16_t p = port ? *port : 0;
    if (!port) fmt::print(stderr, "storage child: publish: {}\n", sys.render(port.error()));
    storage::write_all(port_fd, std::as_bytes(std::span(&p, 1)));
    ::close(port_fd);
    for (char c;;) {
      ssize_t r = ::read(ctl_fd, &c, 1);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
    }
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    rc = port ? 0 : 1;
    std::_Exit(rc);  // before ~actor_system: CAF's teardown can block with remote peers
  }
}

}  // namespace

storage_child fork_storage_child(const storage_child_options& o) {
  storage_child c;
  std::string tmpl = o.parent_dir + "/shoal-bench-storage-XXXXXX";
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp in " + o.parent_dir + ": " + std::string(strerror(errno)));
  c.dir = tmpl;
  int port_pipe[2], ctl_pipe[2];
  if (::pipe(port_pipe) < 0 || ::pipe(ctl_pipe) < 0) throw std::runtime_error("pipe: " + std::string(strerror(errno)));
  std::fflush(stdout);
  std::fflush(stderr);
  c.pid = ::fork();
  if (c.pid < 0) throw std::runtime_error("fork: " + std::string(strerror(errno)));
  if (c.pid == 0) {
    // Only its own pipe ends: an inherited control pipe of an earlier child would keep that
    // child from ever seeing its parent go.
    for (int fd = 3; fd < 4096; ++fd)
      if (fd != port_pipe[1] && fd != ctl_pipe[0]) ::close(fd);
    run_storage_child(port_pipe[1], ctl_pipe[0], c.dir, o);
  }
  ::close(port_pipe[1]);
  ::close(ctl_pipe[0]);
  c.ctl = ctl_pipe[1];
  ::fcntl(c.ctl, F_SETFD, FD_CLOEXEC);
  // The port is read later, after the parent's own measurements (the child starts meanwhile).
  c.port_fd = port_pipe[0];
  return c;
}

void wait_port(storage_child& c) {
  uint16_t p = 0;
  bool ok = storage::read_all(c.port_fd, std::as_writable_bytes(std::span(&p, 1))) == 0;
  ::close(c.port_fd);
  c.port_fd = -1;
  if (!ok || p == 0) throw std::runtime_error("storage child failed to start");
  c.port = p;
}

void stop_storage_child(storage_child& c) {
  if (c.pid <= 0) return;
  ::close(c.ctl);  // EOF: the child removes its dirs and exits
  int status = 0;
  for (int i = 0; i < 100; ++i) {  // up to 10 s
    if (::waitpid(c.pid, &status, WNOHANG) == c.pid) {
      c.pid = -1;
      break;
    }
    ::usleep(100'000);
  }
  if (c.pid > 0) {
    ::kill(c.pid, SIGKILL);
    ::waitpid(c.pid, &status, 0);
    c.pid = -1;
  }
  std::error_code ec;
  std::filesystem::remove_all(c.dir, ec);
}


actors::membership storage_members(caf::actor_system& sys, const storage_child& c) {
  using namespace std::chrono_literals;
  auto members = sys.middleman().remote_actor("127.0.0.1", c.port);
  if (!members) throw std::runtime_error("remote_actor: " + sys.render(members.error()));
  actors::membership m;
  caf::scoped_actor self{sys};
  std::string err = "no reply";
  self->request(*members, 10s, members_atom_v)
    .receive([&](actors::membership& got) { m = std::move(got); err.clear(); },
             [&](caf::error& e) { err = sys.render(e); });
  if (!err.empty()) throw std::runtime_error("members: " + err);
  return m;
}

void configure_bench_system(caf::actor_system_config& cfg) {
  cfg.load<caf::io::middleman>();
  actors::add_message_types(cfg);
  // A shared queue whose idle workers wait on a condition variable: the work-stealing default
  // parks idle workers in 10 ms sleeps, which a storage round trip then waits out.
  cfg.set("scheduler.policy", caf::atom("sharing"));
}

}  // namespace shoal::tools
