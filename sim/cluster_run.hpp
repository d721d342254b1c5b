// Inside the cluster simulator: the one class a run is (see cluster_sim.hpp for the interface).
#pragma once

#include <map>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/placement/decode_placement.hpp"
#include "runtime/placement/prefill_balancer.hpp"
#include "sim/cluster_state.hpp"

namespace shoal::sim::detail {

// One simulated run: the event loop (cluster_sim.cpp), CPU sharing and the engine pools
// (cluster_compute.cpp), the handoff model (cluster_handoff.cpp), node faults
// (cluster_faults.cpp) and the run's hash (cluster_hash.cpp).
class cluster {
 public:
  cluster(const sim_config& c, const std::vector<sim_request>& work, const policy_pair& p);
  sim_result run();

 private:
  void push(double t, ev kind, int64_t a, uint64_t epoch = 0) { events_.push({t, seq_++, kind, a, epoch}); }

  int64_t shared_cores(const group_state& gs) const;
  bool shares_with(const group_state& gs, const group_state& o) const;
  double share_rate(const group_state& gs) const;
  void advance_shared(const group_state& gs, double now);
  void reschedule_shared(const group_state& gs, double now);
  void build_pool(bool prefill, int64_t n, int64_t ep);
  void fresh_engine(rank_state& r);

  rank_state& prefill_rank(int64_t index) { return ranks_[static_cast<size_t>(index)]; }
  rank_state& decode_rank(int64_t index) { return ranks_[static_cast<size_t>(c_.prefill_ranks + index)]; }

  void arrive(size_t i);
  void route(int64_t id);
  void start_step(size_t g);
  void end_step(size_t g);
  void finished(rank_state& rk, runtime::request& r, double now);
  void hand_off(rank_state& from, runtime::request& r);
  void handoff_done(int64_t id, uint64_t epoch);

  // ---- faults (sim/faults.hpp) ----

  void fault_start(size_t i);
  void fault_end(size_t i);
  void take_down(size_t g, bool crash);
  void wipe(size_t g);
  void bring_up(size_t g);
  void reroute(int64_t id, const char* why);
  static std::unique_ptr<runtime::request> restarted(const runtime::request& r);
  void recompute_on_decode(int64_t id);
  void handoff_timeout(int64_t id, uint64_t epoch);
  void park_deadline(int64_t id, uint64_t epoch);
  void fail(int64_t id, std::string why);
  fault_outcome check_faults();
  uint64_t hash(const sim_result& out) const;
  const sim_config& c_;
  const profile& prof_;
  const std::vector<sim_request>& work_;
  policy_pair policy_;
  std::unique_ptr<runtime::decode_placement> decode_policy_;
  std::unique_ptr<runtime::prefill_balancer> balancer_;
  sim_clock clock_;
  std::shared_ptr<sim_storage> storage_;
  std::vector<rank_state> ranks_;
  std::vector<group_state> groups_;
  std::unordered_map<int64_t, live> live_;
  std::vector<request_record> records_;
  event_queue events_;
  uint64_t seq_ = 0;
  pool_acc prefill_acc_, decode_acc_;
  std::map<int64_t, std::pair<double, double>> timeline_;
  std::vector<double> loads_, pool_loads_;
  std::vector<std::pair<int64_t, int64_t>> items_;
  std::normal_distribution<double> normal_;
  uint64_t handoffs_ = 0, kept_ = 0;
  double last_arrival_ = 0;
  std::unique_ptr<runtime::fault_injector> inject_;  // faults on: the run's message faults
  fault_outcome fo_;
  std::vector<int64_t> parked_;                      // requests waiting for any prefill engine
};

}  // namespace shoal::sim::detail
