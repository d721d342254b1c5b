// Inside the cluster simulator: the one class a run is (see cluster_sim.hpp for the interface).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <span>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "runtime/placement/decode_placement.hpp"
#include "runtime/placement/prefill_balancer.hpp"
#include "runtime/placement/regroup.hpp"
#include "sim/cluster_state.hpp"

namespace shoal::sim::detail {

// One simulated run: the event loop (cluster_sim.cpp), CPU sharing and the engine pools
// (cluster_compute.cpp), the engines' side of the protocol (cluster_handoff.cpp: submit,
// handoff offers under runtime::handoff_leases, imports), each request's relay
// (cluster_relay.cpp: runtime::relay hosted in virtual time), node faults (cluster_faults.cpp)
// and the run's hash (cluster_hash.cpp). What is protocol is runtime's code; what is here is
// the event loop, the models of compute time, links and storage, and the engines' bookkeeping.
class cluster {
 public:
  cluster(const sim_config& c, const std::vector<sim_request>& work, const policy_pair& p);
  ~cluster();
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
  void start_step(size_t g);
  double plan_rank(rank_state& r, const pool_profile& pp, int64_t drafts, bool& drafting);
  void end_step(size_t g);
  void sampled(int32_t gi, runtime::request& r, double now, int64_t emitted);
  void add_drafts(rank_state& r, int64_t k);
  int64_t accepted_drafts(group_state& gs, int64_t k);

  // ---- the protocol's messages and timers: deferred calls, run in order at their time ----

  void later(double delay_s, std::function<void()> f);
  // An engine as the relays know it: its rank and the rank's incarnation.
  engine_id ref(int32_t global) const {
    return engine_id{static_cast<int64_t>(ranks_[static_cast<size_t>(global)].incarnation * ranks_.size()) + global};
  }
  // The rank behind `e` while it is that engine (up, same incarnation), else null.
  rank_state* engine_at(engine_id e);
  int32_t global_of(engine_id e) const { return static_cast<int32_t>(e.value % static_cast<int64_t>(ranks_.size())); }

  // ---- each request's relay (cluster_relay.cpp) ----

  class relay_client;
  void feed(int64_t id, const std::function<void(runtime::relay&)>& f);
  void route_answer(int64_t id, std::vector<engine_id> exclude);
  void decode_route_answer(int64_t id, uint64_t placement, std::vector<engine_id> refused);
  void client_token(int64_t id, int32_t token, int64_t cached_tokens, double now);
  void client_final(int64_t id, const runtime::request& r, double now);

  // ---- the engines' side (cluster_handoff.cpp) ----

  void submit_at(int64_t id, engine_id e, int64_t resume);
  void offer_handoff(int32_t gi, runtime::request& r);
  void offer_at(int64_t id, engine_id d, uint64_t placement);
  void placed_at(int64_t id, engine_id e, bool placed);
  void cancel_at(int64_t id, engine_id e);
  void lease_deadline(int32_t gi, uint64_t incarnation, int64_t id, uint64_t number);
  void end_lease(rank_state& rk, int64_t id, bool taken);
  void read_done(int32_t gi, uint64_t incarnation, int64_t id, uint64_t epoch, bool ok);
  void release_lender(const import_state& im, int64_t id);
  void drop_request(rank_state& rk, int64_t id);
  void wake_group(int32_t group);

  // ---- faults (sim/faults.hpp) ----

  void fault_start(size_t i);
  void fault_end(size_t i);
  void take_down(size_t g, bool crash);
  void wipe(size_t g);
  void bring_up(size_t g);
  void declare_down(size_t fault);
  void rank_fault_start(size_t fault);
  // Rank faults: rank `ri` (global) leaves its group, which re-forms without it; it is back.
  void take_down_rank(int32_t ri, bool crash);
  void bring_up_rank(int32_t ri);
  void reform(size_t g);
  runtime::group_view view_brought(const group_state& gs, int32_t ri, const std::vector<int32_t>& members,
                                   std::map<int32_t, std::set<int32_t>>& holds) const;
  std::vector<std::pair<int64_t, engine_id>> relays_on(const std::function<bool(int32_t)>& on) const;
  void reroute(const std::vector<std::pair<int64_t, engine_id>>& hit);
  void empty_rank(rank_state& rk);
  std::vector<int32_t> ranks_up(const group_state& gs) const;
  void delay_step(group_state& gs, size_t g, double until);
  // A rank no relay or balancer can reach: its group or its own process is down.
  bool unreachable(const rank_state& r) const { return groups_[static_cast<size_t>(r.group)].down || r.down; }
  static constexpr int64_t sim_experts = 256;  // routed experts per MoE layer (DeepSeek-V3's)
  static std::unique_ptr<runtime::request> restarted(const runtime::request& r);
  runtime::lease_bug planted_lease_bug() const {
    return c_.faults.planted == planted_bug::lease_never_expires ? runtime::lease_bug::never_expires
                                                                 : runtime::lease_bug::none;
  }
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
  int32_t processes_ = 0;                     // engine processes (cluster_sim.hpp: *_processes)
  mutable std::vector<int64_t> busy_groups_;  // share_rate's scratch: stepping groups per process
  std::unordered_map<int64_t, std::unique_ptr<relay_client>> live_;  // the requests' relays
  std::unordered_map<uint64_t, std::function<void()>> calls_;       // deferred calls by key
  uint64_t next_call_ = 0;
  uint64_t import_epochs_ = 0;
  std::unordered_set<uint64_t> reads_done_;  // imports whose read ended (a second delivery is a duplicate)
  std::vector<request_record> records_;
  event_queue events_;
  uint64_t seq_ = 0;
  pool_acc prefill_acc_, decode_acc_;
  std::map<int64_t, std::pair<double, double>> timeline_;
  std::vector<double> loads_, pool_loads_;
  std::vector<std::pair<int64_t, int64_t>> items_, decodes_;
  std::normal_distribution<double> normal_;
  std::uniform_real_distribution<double> uniform_;
  uint64_t handoffs_ = 0, kept_ = 0, spec_verified_ = 0, spec_accepted_ = 0;
  double last_arrival_ = 0;
  std::unique_ptr<runtime::fault_injector> inject_;  // faults on: the run's message faults
  fault_outcome fo_;
};

// One request's relay: the protocol's machine (runtime::relay) and its host, whose messages
// are deferred calls of the run.
class cluster::relay_client final : public runtime::relay_host {
 public:
  relay_client(cluster& c, int64_t id, runtime::relay_limits limits, runtime::relay_bug bug)
      : c_(c), id_(id), machine(limits, *this, bug) {}

  void encode_images() override {}
  void route(std::span<const engine_id> exclude) override;
  void submit(engine_id e, int64_t resume) override;
  void watch(engine_id e) override;
  void unwatch(engine_id) override {}  // the run tells a relay whose engine it was (take_down)
  void release_prefill() override;
  void release_decode() override {}    // the decode placement keeps no per-request state
  void retry_after(double seconds) override;
  void route_decode(uint64_t placement, std::span<const engine_id> refused) override;
  void offer_to(engine_id d, uint64_t placement) override;
  void tell_placed(engine_id e, bool placed) override;
  void cancel_at(engine_id e) override;
  void fail(const runtime::relay_error& err) override;

  // The offer being placed: the prefill rank's copy as it was offered, and its lease.
  std::unique_ptr<runtime::request> offer;
  int32_t offer_from = -1;
  uint64_t offer_incarnation = 0, offer_lease = 0;
  int64_t offer_computed = 0;  // positions in the prefill rank's cache

 private:
  cluster& c_;
  int64_t id_;

 public:
  runtime::relay machine;
};

}  // namespace shoal::sim::detail
