// Named fault points (BUGGIFY style): the places where the outside world can fail a request
// (a storage read or write, a full disk, a KV handoff read, an SWA slot fetch, a balancer's
// load report) ask `inject(point)` whether to fail now. Off
// unless a plan is installed, which production configs never do: then the question costs one
// atomic load. Tests and the simulator install a plan (a probability per point and a seed);
// each visit of a point draws from a counter-based generator over (seed, point, visit number),
// so a single-threaded run (the simulator) injects the same faults at the same visits for the
// same seed, and a multi-threaded process injects at the same rate.
//
// A plan as text (node config `[faults] plan`, env SHOAL_FAULTS, `shoal sim --faults`):
//   "seed=7,storage_read=0.01,kv_handoff=0.05"
// Unknown names, probabilities outside [0, 1] and malformed items are errors naming the item.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <expected>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace shoal::runtime {

enum class fault_point : uint8_t {
  // Reached in the daemons (and in the simulator where it has the same step):
  storage_read,      // storage/chunk_store: reading a chunk file fails (EIO)
  storage_write,     // storage/chunk_store: writing a chunk file fails (EIO)
  disk_full,         // storage/chunk_store: writing finds no space (ENOSPC); sim: the tier drops the write
  storage_corrupt,   // storage/chunk_store: bytes read are damaged before the crc check; sim: a stored chunk
  kv_handoff,        // runtime/cache_manager: a finished KV handoff read is failed (the decode side recomputes)
  swa_fetch,         // runtime/cache_manager: a fetched SWA slot is lost (bounded replay)
  balancer_message,  // actors/balancer_actors: an engine's load report to the decode balancer is dropped
  // Reached in the simulator only (a daemon's plan may not name them):
  kv_handoff_delay,  // a KV handoff read completes late (past the timeout: given up)
  message_dup,       // a handoff completion is delivered twice
  count_
};
inline constexpr size_t fault_point_count = static_cast<size_t>(fault_point::count_);

const char* fault_point_name(fault_point p);
// False for the points only the simulator reaches.
bool fault_point_in_daemons(fault_point p);
std::optional<fault_point> fault_point_named(std::string_view name);

struct fault_plan {
  uint64_t seed = 0;
  std::array<double, fault_point_count> probability{};  // per point; 0: never

  bool any() const;
  double& operator[](fault_point p) { return probability[static_cast<size_t>(p)]; }
  double operator[](fault_point p) const { return probability[static_cast<size_t>(p)]; }
  // "seed=N,point=p,..." (spaces allowed around items; "" is the empty plan). `daemon`: a
  // point the daemons never reach is an error (it would be accepted and do nothing).
  static std::expected<fault_plan, std::string> parse(std::string_view text, bool daemon = false);
  std::string to_string() const;  // parse(to_string()) gives the plan back
};

class fault_injector {
 public:
  explicit fault_injector(fault_plan plan);
  // Whether visit n of point `p` fails: uniform(seed, p, n) < probability[p].
  bool fire(fault_point p);
  // The same draw without counting a visit of `p`: a value in [0, 1) for choosing among
  // outcomes once a point fired (how long a delay, which chunk), from the same stream.
  double uniform(fault_point p);
  uint64_t visits(fault_point p) const { return visits_[static_cast<size_t>(p)].load(std::memory_order_relaxed); }
  uint64_t fired(fault_point p) const { return fired_[static_cast<size_t>(p)].load(std::memory_order_relaxed); }
  const fault_plan& plan() const { return plan_; }

 private:
  double draw(fault_point p, uint64_t n) const;
  fault_plan plan_;
  std::array<std::atomic<uint64_t>, fault_point_count> visits_{}, fired_{}, draws_{};
};

// The process's injector: none until install_faults (tests, shoald with a `[faults]` plan or
// SHOAL_FAULTS). install_faults replaces it; an empty plan removes it.
void install_faults(const fault_plan& plan);
fault_injector* process_faults();
// True when the process's plan fails this visit of `p` (always false without a plan).
inline bool inject(fault_point p) {
  fault_injector* f = process_faults();
  return f != nullptr && f->fire(p);
}

}  // namespace shoal::runtime
