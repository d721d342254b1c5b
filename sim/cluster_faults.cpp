// The simulated cluster's node faults (sim/faults.hpp): crashes, stalls, restarts, re-routing.
#include "sim/cluster_run.hpp"

#include <algorithm>
#include <cmath>

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
  }
}

void cluster::fault_end(size_t i) {
  const fault_event& f = fo_.schedule[i];
  switch (f.kind) {
    case fault_kind::crash:  // restarted (its engines were emptied at the crash)
    case fault_kind::partition:
    case fault_kind::hang: bring_up(static_cast<size_t>(f.group)); break;
    case fault_kind::slow: groups_[static_cast<size_t>(f.group)].slow /= f.factor; break;
    default: break;
  }
}

// Group g goes down (crash: its engines lose everything; partition or a hang past the
// heartbeat timeout: cut off from the cluster, caches kept). Its step in flight is lost; the
// balancers stop placing there; its requests are re-routed by the relay, and handoffs that
// touch it end as DISAGG.md says (the decode side dead: re-route; the prefill side dead
// while the decode side reads: the decode side recomputes from the tokens it was given).
void cluster::take_down(size_t g, bool crash) {
  group_state& gs = groups_[g];
  if (gs.down++ > 0) {
    if (crash) wipe(g);  // crashed while cut off: its caches go too
    return;
  }
  if (gs.stepping) gs.stepping = false, ++gs.epoch;
  for (int32_t ri : gs.ranks)
    if (ranks_[static_cast<size_t>(ri)].prefill) balancer_->remove_engine(engine_id{ranks_[static_cast<size_t>(ri)].index});
  auto in_group = [&](int32_t global) { return global >= 0 && static_cast<size_t>(ranks_[static_cast<size_t>(global)].group) == g; };
  std::vector<int64_t> hit;
  for (const auto& [id, l] : live_)
    if (in_group(l.rank) || (l.moving && in_group(static_cast<int32_t>(c_.prefill_ranks + l.to_rank)))) hit.push_back(id);
  std::sort(hit.begin(), hit.end());  // the map's order is not the run's
  std::vector<size_t> wake;
  for (int64_t id : hit) {
    live& l = live_.at(id);
    if (c_.faults.planted == planted_bug::lose_on_crash && crash) {
      live_.erase(id);  // planted bug: dropped, neither finished nor failed
      continue;
    }
    if (l.moving) {
      rank_state& from = ranks_[static_cast<size_t>(l.rank)];
      rank_state& d = decode_rank(l.to_rank);
      ++l.handoff_epoch;  // its completion or timeout in flight is stale now
      --d.pending;
      d.pending_kv -= l.moving->num_tokens();
      from.sched->finish(l.req.get());  // the prefill side unpins
      d.caches->release(*l.moving);     // the decode side's reservation goes
      if (in_group(static_cast<int32_t>(c_.prefill_ranks + l.to_rank))) {
        l.moving.reset();
        reroute(id, "decode engine down during the handoff");
      } else {
        ++fo_.handoff_failures;
        recompute_on_decode(id);
        wake.push_back(static_cast<size_t>(d.group));
      }
    } else {
      ranks_[static_cast<size_t>(l.rank)].sched->finish(l.req.get());
      reroute(id, crash ? "engine crashed" : "engine unreachable");
    }
  }
  for (int32_t ri : gs.ranks) ranks_[static_cast<size_t>(ri)].plan = {}, ranks_[static_cast<size_t>(ri)].load = 0;
  if (crash) wipe(g);
  for (size_t w : wake)
    if (!groups_[w].stepping) start_step(w);
}

void cluster::wipe(size_t g) {
  if (storage_) storage_->fail_group(g);
  for (int32_t ri : groups_[g].ranks) fresh_engine(ranks_[static_cast<size_t>(ri)]);
}

// Group g is back (restarted, healed, awake): in the balancers' views again, and the
// requests parked for want of any prefill engine go out.
void cluster::bring_up(size_t g) {
  group_state& gs = groups_[g];
  if (gs.down == 0 || --gs.down > 0) return;
  for (int32_t ri : gs.ranks) {
    const rank_state& r = ranks_[static_cast<size_t>(ri)];
    if (r.prefill) balancer_->add_engine(engine_id{r.index}, prof_.prefill.step, r.group);
  }
  std::vector<int64_t> parked = std::exchange(parked_, {});
  for (int64_t id : parked)
    if (auto it = live_.find(id); it != live_.end() && it->second.rank < 0) route(id);
  if (!gs.stepping) start_step(g);
}

// The relay sends request `id` again (its tokens so far: those streamed are not repeated),
// or fails it with a clear error after max_attempts placements.
void cluster::reroute(int64_t id, const char* why) {
  live& l = live_.at(id);
  ++fo_.rerouted;
  const request_record& rec = records_[static_cast<size_t>(id)];
  balancer_->done(request_id{id}, clock_.now_s());
  if (rec.attempts >= c_.faults.max_attempts) {
    fail(id, "lost its engine " + std::to_string(rec.attempts) + " times (last: " + why + ")");
    return;
  }
  l.req = restarted(*l.req);
  l.to_rank = -1;
  route(id);
}

// A copy of r that computes again from its tokens (prompt and the outputs so far).
std::unique_ptr<runtime::request> cluster::restarted(const runtime::request& r) {
  auto c = std::make_unique<runtime::request>();
  c->id = r.id;
  c->tokens = r.tokens;
  c->prompt_len = r.prompt_len;
  c->params = r.params;
  c->cached_tokens = r.cached_tokens;
  c->handed_off = r.handed_off;
  return c;
}

void cluster::fail(int64_t id, std::string why) {
  request_record& rec = records_[static_cast<size_t>(id)];
  rec.error = std::move(why);
  fo_.errors.push_back("request " + std::to_string(id) + ": " + rec.error);
  live_.erase(id);
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
  for (size_t g = 0; g < groups_.size(); ++g)
    if (groups_[g].down) fail("group " + std::to_string(g) + " still down at the end");
  for (const rank_state& r : ranks_) {
    o.leaked_blocks += r.caches->pool().num_blocks() - r.caches->pool().num_free();
    if (r.pending != 0 || r.pending_kv != 0) fail("a decode rank still expects handoffs at the end");
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
