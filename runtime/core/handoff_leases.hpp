// The prefill side of a handoff (DISAGG.md) as a plain state machine: a request offered to
// the relay after its first token is lent under a lease, its caches pinned, until
//  - the relay says it was not placed (the prefill engine decodes it: not taken),
//  - the decode engine that took it says its reads are over (taken), or
//  - the lease's deadline passes: taken when it was placed (the decode engine went quiet;
//    a late read fails its checksum), not taken when the relay never answered.
// Each lease has numbers: the offer's (a decode engine's release names it, so a release for
// an earlier lease of the same id is stale) and the current deadline's (re-armed when placed).
// The engine actor hosts it (its timers are CAF messages); the simulator hosts the same one
// in virtual time.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>

#include "runtime/base/ids.hpp"

namespace shoal::runtime {

// Test-only switch that breaks the leases on purpose (the simulator's fault campaign must
// catch it, tests/sim). Never set outside tests.
enum class lease_bug : uint8_t {
  none,
  never_expires,  // a lease placed on a decode engine that then goes quiet is never ended
};

class handoff_leases {
 public:
  explicit handoff_leases(lease_bug bug = lease_bug::none) : bug_(bug) {}

  // Lends `id`; returns the lease's number (its offer names it): arm a deadline with it.
  uint64_t offer(request_id id);

  // The relay's answer. Not placed: the lease ends, not taken (ended = true). Placed: the
  // lease waits for the decode engine's release; arm a deadline with `rearm`. Neither when
  // no unplaced lease of `id` is open (a late or repeated answer).
  struct placement {
    bool ended = false;
    std::optional<uint64_t> rearm;
  };
  placement placed(request_id id, bool placed);

  // The decode engine's release of lease `offer`: true when it ends the lease (taken).
  bool release(request_id id, uint64_t offer);

  // Deadline `number` of `id` passed: the lease ends, taken when it had been placed;
  // nullopt when that deadline is no longer current.
  std::optional<bool> expire(request_id id, uint64_t number);

  // The request is dropped (cancelled, its engine reset): its lease goes without an outcome.
  void drop(request_id id) { leases_.erase(id); }
  bool contains(request_id id) const { return leases_.contains(id); }
  // An open lease of `id` that the relay placed (the decode engine has the request).
  bool lent_out(request_id id) const {
    auto it = leases_.find(id);
    return it != leases_.end() && it->second.placed;
  }
  size_t size() const { return leases_.size(); }

 private:
  struct lease {
    uint64_t offer = 0;   // its number in the offer
    uint64_t number = 0;  // the current deadline's
    bool placed = false;
  };
  std::unordered_map<request_id, lease> leases_;
  uint64_t numbers_ = 0;
  lease_bug bug_;
};

}  // namespace shoal::runtime
