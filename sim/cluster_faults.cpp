// The simulated cluster's node faults (sim/faults.hpp): crashes, stalls, restarts, re-routing.
#include "sim/cluster_run.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

namespace shoal::sim::detail {

void cluster::fault_start(size_t i) {
  const fault_event& f = fo_.schedule[i];
  const double now = clock_.now_s();
  switch (f.kind) {
    case fault_kind::crash:
      take_down(static_cast<size_t>(f.group), true);
      push(now + f.duration_s, ev::fault_end, static_cast<int64_t>(i));
      break;
    case fault_kind::partition:
      take_down(static_cast<size_t>(f.group), false);
      push(now + f.duration_s, ev::fault_end, static_cast<int64_t>(i));
      break;
    case fault_kind::hang: {
      group_state& gs = groups_[static_cast<size_t>(f.group)];
      gs.hung_until = std::max(gs.hung_until, now + f.duration_s);
      if (gs.stepping) {  // the step in flight ends that much later
        gs.step_end_s += f.duration_s;
        push(gs.step_end_s, ev::step_end, f.group, ++gs.epoch);
      }
      if (f.duration_s > c_.faults.detect_s) {  // heartbeats stop: declared down, back when it wakes
        push(now + c_.faults.detect_s, ev::declare_down, static_cast<int64_t>(i));
        push(now + f.duration_s, ev::fault_end, static_cast<int64_t>(i));
      }
      break;
    }
    case fault_kind::slow:
      groups_[static_cast<size_t>(f.group)].slow *= f.factor;
      push(now + f.duration_s, ev::fault_end, static_cast<int64_t>(i));
      break;
    case fault_kind::disk_full:
      if (storage_) storage_->full_until = std::max(storage_->full_until, now + f.duration_s);
      break;
    case fault_kind::corrupt:
      if (storage_) storage_->damage(static_cast<int64_t>(f.factor));
      break;
    case fault_kind::rank_crash:
    case fault_kind::rank_hang: rank_fault_start(i); break;
  }
}

// One process of an expert-parallel group crashes or hangs. Its group's lockstep step waits
// for it: a crash is seen at once (a CAF down message), a hang at the heartbeat timeout, and
// the group re-forms without it then. A fault that would leave its group with no rank is
// skipped (the node faults cover a whole group going).
void cluster::rank_fault_start(size_t i) {
  fault_event& f = fo_.schedule[i];
  group_state& gs = groups_[static_cast<size_t>(f.group)];
  const int32_t ri = gs.ranks[static_cast<size_t>(f.rank)];
  const bool member = std::ranges::find(gs.members, ri) != gs.members.end();
  if (!member || gs.members.size() < 2) {
    f.skipped = true;
    return;
  }
  const double now = clock_.now_s();
  if (f.kind == fault_kind::rank_crash) {
    take_down_rank(ri, true);
    push(now + f.duration_s, ev::fault_end, static_cast<int64_t>(i));
    return;
  }
  const double stalled = std::min(f.duration_s, c_.faults.detect_s);  // the exchange waits that long
  gs.hung_until = std::max(gs.hung_until, now + stalled);
  delay_step(gs, static_cast<size_t>(f.group), gs.hung_until);
  if (f.duration_s > c_.faults.detect_s) {
    push(now + c_.faults.detect_s, ev::declare_down, static_cast<int64_t>(i));
    push(now + f.duration_s, ev::fault_end, static_cast<int64_t>(i));
  }
}

void cluster::declare_down(size_t i) {
  const fault_event& f = fo_.schedule[i];
  if (f.kind == fault_kind::rank_hang)
    take_down_rank(groups_[static_cast<size_t>(f.group)].ranks[static_cast<size_t>(f.rank)], false);
  else
    take_down(static_cast<size_t>(f.group), false);
}

// The step in flight of group g ends no sooner than `until` plus what it had left.
void cluster::delay_step(group_state& gs, size_t g, double until) {
  if (!gs.stepping) return;
  const double now = clock_.now_s();
  if (shared_cores(gs) > 0) {
    advance_shared(gs, now);
    gs.compute_from = std::max(gs.compute_from, until);
    reschedule_shared(gs, now);
    return;
  }
  gs.step_end_s = std::max(gs.step_end_s, now) + std::max(0.0, until - now);
  push(gs.step_end_s, ev::step_end, static_cast<int64_t>(g), ++gs.epoch);
}

// Rank ri leaves its group: out of the balancers' views, its requests re-routed by their
// relays, its leases and imports gone (crash: a new engine when it restarts). The survivors'
// step in flight is recomputed after the group re-forms over them.
void cluster::take_down_rank(int32_t ri, bool crash) {
  rank_state& rk = ranks_[static_cast<size_t>(ri)];
  const auto g = static_cast<size_t>(rk.group);
  if (rk.down++ > 0 || groups_[g].down) {
    if (crash) fresh_engine(rk), ++rk.incarnation, rk.ran_on.clear();
    return;
  }
  ++fo_.rank_losses;
  if (rk.prefill) balancer_->remove_engine(engine_id{rk.index});
  const auto hit = relays_on([ri](int32_t on) { return on == ri; });
  empty_rank(rk);
  rk.ran = groups_[g].placement;  // a resumed process brings it back (stale by then)
  rk.ran_on = groups_[g].placed_on;
  if (crash) fresh_engine(rk), ++rk.incarnation, rk.ran_on.clear();
  reform(g);
  reroute(hit);
}

// Rank ri is back (restarted, awake): its group grows back over it at the next re-formation.
void cluster::bring_up_rank(int32_t ri) {
  rank_state& rk = ranks_[static_cast<size_t>(ri)];
  if (rk.down == 0 || --rk.down > 0) return;
  const auto g = static_cast<size_t>(rk.group);
  if (groups_[g].down) return;  // the group's own restart brings it back
  ++fo_.rejoins;
  if (rk.prefill) balancer_->add_engine(engine_id{rk.index}, prof_.prefill.step, rk.group);
  reform(g);
  if (!groups_[g].stepping) start_step(g);
}

// What rank ri brings to a re-formation over `members`: the placement it ran renumbered to
// the members (group_view), and its process's experts in memory added to `holds` (per process).
runtime::group_view cluster::view_brought(const group_state& gs, int32_t ri, const std::vector<int32_t>& members,
                                          std::map<int32_t, std::set<int32_t>>& holds) const {
  const rank_state& rk = ranks_[static_cast<size_t>(ri)];
  const bool survivor = std::ranges::find(gs.placed_on, ri) != gs.placed_on.end();
  const runtime::ep_placement& ran = survivor ? gs.placement : rk.ran;
  const std::vector<int32_t>& on = survivor ? gs.placed_on : rk.ran_on;
  if (on.empty()) return runtime::fresh_view(1);
  std::vector<int32_t> moved;
  for (int32_t old : on) {
    auto it = std::ranges::find(members, old);
    moved.push_back(it == members.end() ? -1 : static_cast<int32_t>(it - members.begin()));
  }
  const auto mine = ran.experts_of(0, static_cast<int32_t>(std::ranges::find(on, ri) - on.begin()));
  holds[rk.process].insert(mine.begin(), mine.end());
  return runtime::view_of(ran, moved, static_cast<int32_t>(members.size()));
}

// Group g agrees on its ranks up and places the experts over them by the daemons' own rule
// (runtime::regroup_placement over the views its members bring; the planted bug keeps the old
// placement), reading the experts a rank lacks: its steps wait c_.faults.reform_s.
void cluster::reform(size_t g) {
  group_state& gs = groups_[g];
  gs.members = ranks_up(gs);
  const bool keep = c_.faults.planted == planted_bug::route_to_lost && gs.members.size() < gs.placed_on.size();
  if (!keep && !gs.members.empty()) {
    std::map<int32_t, std::set<int32_t>> holds;  // process → experts in memory
    std::vector<runtime::group_view> views;
    for (int32_t ri : gs.members) views.push_back(view_brought(gs, ri, gs.members, holds));
    for (size_t i = 0; i < views.size(); ++i) {
      const auto& held = holds[ranks_[static_cast<size_t>(gs.members[i])].process];
      views[i].holds = {std::vector<int32_t>(held.begin(), held.end())};
    }
    auto placed = runtime::regroup_placement(1, sim_experts, static_cast<int32_t>(gs.members.size()), views);
    if (!placed) {
      fo_.regroup_errors.push_back("group " + std::to_string(g) + ": " + placed.error());
      placed = runtime::regroup_result{runtime::ep_placement::contiguous(1, sim_experts, static_cast<int32_t>(gs.members.size()))};
    }
    fo_.experts_replaced += placed->orphans + placed->moved_to_new;
    const bool joins = std::ranges::any_of(gs.members, [&](int32_t ri) { return std::ranges::find(gs.placed_on, ri) == gs.placed_on.end(); });
    for (size_t i = 0; i < gs.members.size() && !joins; ++i)  // with no rank joining, survivors keep what they ran
      if (auto at = std::ranges::find(gs.placed_on, gs.members[i]); at != gs.placed_on.end())
        for (int32_t e : gs.placement.experts_of(0, static_cast<int32_t>(at - gs.placed_on.begin())))
          fo_.survivor_moves += !placed->placement.holds(0, static_cast<int32_t>(i), e);
    gs.placement = std::move(placed->placement);
    gs.placed_on = gs.members;
  }
  gs.reformed_at = clock_.now_s() + c_.faults.reform_s;
  delay_step(gs, g, gs.reformed_at);
}

void cluster::fault_end(size_t i) {
  const fault_event& f = fo_.schedule[i];
  switch (f.kind) {
    case fault_kind::crash:  // restarted (its engines were emptied at the crash)
    case fault_kind::partition:
    case fault_kind::hang: bring_up(static_cast<size_t>(f.group)); break;
    case fault_kind::slow: groups_[static_cast<size_t>(f.group)].slow /= f.factor; break;
    case fault_kind::rank_crash:
    case fault_kind::rank_hang:
      if (!f.skipped) bring_up_rank(groups_[static_cast<size_t>(f.group)].ranks[static_cast<size_t>(f.rank)]);
      break;
    default: break;
  }
}

// Group g goes down (crash: its engines lose everything and restart as new engines; partition
// or a hang past the heartbeat timeout: cut off, written off by the cluster). Its step in
// flight is lost; the balancers stop placing there; its engines' requests, leases and imports
// go; each relay whose engine was there hears it went down (a CAF down message) and re-routes.
// What follows for handoffs is the protocol's: a lender that went quiet fails the reads of its
// bytes (the decode side recomputes), a decode engine that went quiet lets its lender's lease
// run out.
void cluster::take_down(size_t g, bool crash) {
  group_state& gs = groups_[g];
  if (gs.down++ > 0) {
    if (crash) wipe(g);  // crashed while cut off: its caches go too
    return;
  }
  if (gs.stepping) gs.stepping = false, ++gs.epoch;
  for (int32_t ri : gs.ranks)  // a rank down on its own left the views already
    if (const rank_state& r = ranks_[static_cast<size_t>(ri)]; r.prefill && !r.down)
      balancer_->remove_engine(engine_id{r.index});
  const auto hit = relays_on([&](int32_t ri) { return static_cast<size_t>(ranks_[static_cast<size_t>(ri)].group) == g; });
  for (int32_t ri : gs.ranks) empty_rank(ranks_[static_cast<size_t>(ri)]);
  if (crash) wipe(g);
  reroute(hit);
}

// The live requests whose engine is on a rank `on` names (relay id, engine), in id order.
std::vector<std::pair<int64_t, engine_id>> cluster::relays_on(const std::function<bool(int32_t)>& on) const {
  std::vector<std::pair<int64_t, engine_id>> hit;
  for (const auto& [id, rc] : live_) {
    const engine_id e = rc->machine.engine();
    if (e.valid() && on(global_of(e))) hit.emplace_back(id, e);
  }
  std::sort(hit.begin(), hit.end());  // the map's order is not the run's
  return hit;
}

// Each relay hears its engine went down (a CAF down message) and re-routes.
void cluster::reroute(const std::vector<std::pair<int64_t, engine_id>>& hit) {
  for (const auto& [id, e] : hit) {
    ++fo_.rerouted;
    feed(id, [e](runtime::relay& r) { r.engine_down(e); });
  }
}

// A rank that went down: its requests, imports, leases and step plan go.
void cluster::empty_rank(rank_state& rk) {
  std::vector<int64_t> held;
  for (const auto& [id, r] : rk.reqs) held.push_back(id);
  for (int64_t id : held) drop_request(rk, id);
  for (auto& [id, im] : rk.imports) rk.caches->release(*im.copy);
  rk.imports.clear();
  rk.leases = runtime::handoff_leases(planted_lease_bug());
  rk.plan = {}, rk.load = 0;
}

// The ranks of group g not down on their own, in order.
std::vector<int32_t> cluster::ranks_up(const group_state& gs) const {
  std::vector<int32_t> up;
  for (int32_t ri : gs.ranks)
    if (!ranks_[static_cast<size_t>(ri)].down) up.push_back(ri);
  return up;
}

void cluster::wipe(size_t g) {
  if (storage_) storage_->fail_group(g);
  for (int32_t ri : groups_[g].ranks) {
    rank_state& rk = ranks_[static_cast<size_t>(ri)];
    fresh_engine(rk);
    ++rk.incarnation;  // the restarted process is another engine to the relays
    rk.ran_on.clear();  // and brings no placement, holds no expert
  }
}

// Group g is back (restarted, healed, awake): in the balancers' views again (relays waiting
// for any engine find it at their next try).
void cluster::bring_up(size_t g) {
  group_state& gs = groups_[g];
  if (gs.down == 0 || --gs.down > 0) return;
  for (int32_t ri : gs.ranks) {
    const rank_state& r = ranks_[static_cast<size_t>(ri)];
    if (r.prefill && !r.down) balancer_->add_engine(engine_id{r.index}, prof_.prefill.step, r.group);
  }
  if (ranks_up(gs) != gs.members) reform(g);  // a rank left or came back while the group was down
  if (!gs.stepping) start_step(g);
}

// A copy of r that computes again from its tokens (prompt and the outputs so far).
std::unique_ptr<runtime::request> cluster::restarted(const runtime::request& r) {
  auto c = std::make_unique<runtime::request>();
  c->id = r.id;
  c->tokens = r.tokens;
  c->prompt_len = r.prompt_len;
  c->resumed = r.resumed;
  c->params = r.params;
  c->cached_tokens = r.cached_tokens;
  c->handed_off = r.handed_off;
  return c;
}

// The invariants, once the run is over.
fault_outcome cluster::check_faults() {
  fault_outcome o = std::move(fo_);
  if (storage_) o.wrong_blocks = storage_->wrong_blocks, o.damaged_caught = storage_->damaged_caught,
                o.dropped_writes = storage_->dropped_writes;
  std::vector<int64_t> lost;
  for (const auto& r : records_) {
    if (r.finish_s >= 0 && r.output == work_[static_cast<size_t>(r.id)].output_len) ++o.completed;
    else if (r.finish_s >= 0) ++o.wrong_outputs;  // finished short or long
    else if (!r.error.empty()) ++o.errored;
    else lost.push_back(r.id);
  }
  o.lost = static_cast<int64_t>(lost.size());
  auto fail = [&](std::string v) { o.violations.push_back(std::move(v)); };
  if (!lost.empty()) {
    std::string ids;
    for (size_t i = 0; i < lost.size() && i < 8; ++i) ids += (i ? ", " : "") + std::to_string(lost[i]);
    fail(std::to_string(lost.size()) + " requests lost (neither completed nor failed): " + ids + (lost.size() > 8 ? ", ..." : ""));
  }
  if (o.wrong_blocks > 0) fail(std::to_string(o.wrong_blocks) + " damaged blocks served as good");
  if (o.placed_on_dead > 0) fail(std::to_string(o.placed_on_dead) + " placements on a node that was down");
  if (o.duplicates > 0) fail(std::to_string(o.duplicates) + " requests finished twice");
  if (o.wrong_outputs > 0) fail(std::to_string(o.wrong_outputs) + " outputs differ from the expected tokens");
  for (size_t g = 0; g < groups_.size(); ++g) {
    const group_state& gs = groups_[g];
    if (gs.down) fail("group " + std::to_string(g) + " still down at the end");
    if (gs.members.size() != gs.ranks.size() || gs.placed_on != gs.ranks)
      fail("group " + std::to_string(g) + " has " + std::to_string(gs.members.size()) + " of its " +
           std::to_string(gs.ranks.size()) + " ranks at the end");
  }
  if (o.routed_to_lost > 0)
    fail(std::to_string(o.routed_to_lost) + " steps routed tokens to the experts of a rank lost from its group");
  if (o.survivor_moves > 0)
    fail(std::to_string(o.survivor_moves) + " experts moved off a surviving rank when its group re-formed");
  for (const auto& e : o.regroup_errors) fail("a re-formation's placement was refused: " + e);
  for (const rank_state& r : ranks_) {
    o.leaked_blocks += r.caches->pool().num_blocks() - r.caches->pool().num_free();
    if (!r.imports.empty()) fail("a decode rank still reads " + std::to_string(r.imports.size()) + " handoffs at the end");
    if (r.leases.size() > 0) fail("a prefill rank still holds " + std::to_string(r.leases.size()) + " leases at the end");
  }
  if (o.leaked_blocks > 0) fail(std::to_string(o.leaked_blocks) + " blocks still held at the end");
  const auto views = balancer_->engines();
  if (static_cast<int64_t>(views.size()) != c_.prefill_ranks)
    fail("the prefill balancer sees " + std::to_string(views.size()) + " of " + std::to_string(c_.prefill_ranks) + " engines");
  for (const auto& v : views)
    if (v.in_flight != 0) fail("the prefill balancer counts requests in flight on engine " + std::to_string(v.engine.value));
  if (!live_.empty()) fail(std::to_string(live_.size()) + " requests still live when the events ran out");
  return o;
}

}  // namespace shoal::sim::detail
