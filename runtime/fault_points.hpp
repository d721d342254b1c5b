// Named fault points (BUGGIFY style): the places where the outside world can fail a request
// (a storage read or write, a full disk, a KV handoff read, an SWA slot fetch, an EP exchange,
// a balancer message, a node agent's heartbeat) ask `inject(point)` whether to fail now. Off
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
  storage_read,      // a chunk read on a storage node fails (I/O error)
  storage_write,     // a chunk write fails (I/O error)
  disk_full,         // a chunk write finds no space
  storage_corrupt,   // a stored chunk's bytes are damaged after its checksum was taken
  kv_handoff,        // a KV handoff read fails (the decode side recomputes)
  kv_handoff_delay,  // a KV handoff read completes late
  swa_fetch,         // an SWA slot fetch fails (bounded replay)
  ep_exchange,       // an EP dispatch/combine frame is delayed
  balancer_message,  // a load report to a balancer is dropped
  heartbeat,         // a node agent's heartbeat is dropped
  message_dup,       // a message is delivered twice
  count_
};
inline constexpr size_t fault_point_count = static_cast<size_t>(fault_point::count_);

const char* fault_point_name(fault_point p);
std::optional<fault_point> fault_point_named(std::string_view name);

struct fault_plan {
  uint64_t seed = 0;
  std::array<double, fault_point_count> probability{};  // per point; 0: never

  bool any() const;
  double& operator[](fault_point p) { return probability[static_cast<size_t>(p)]; }
  double operator[](fault_point p) const { return probability[static_cast<size_t>(p)]; }
  // "seed=N,point=p,..." (spaces allowed around items; "" is the empty plan).
  static std::expected<fault_plan, std::string> parse(std::string_view text);
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
