// The simulated cluster's prefill → decode handoffs: placement, the transfer, timeouts.
#include "sim/cluster_run.hpp"

#include <algorithm>
#include <cmath>

namespace shoal::sim::detail {

void cluster::hand_off(rank_state& from, runtime::request& r) {
  r.handed_off = true;
  live_.at(r.id.value).want_handoff = false;
  balancer_->done(r.id, clock_.now_s());
  const int64_t context = r.num_tokens();
  runtime::decode_ask ask{context, r.params.max_tokens - r.output_len(), from.caches->blocks_for(context) + 1};
  std::vector<runtime::decode_candidate> cands;
  for (int64_t i = 0; i < c_.decode_ranks; ++i) {
    rank_state& d = decode_rank(i);
    int64_t kv = d.pending_kv;
    for (const runtime::request* q : d.sched->running_requests()) kv += q->computed();
    if (groups_[static_cast<size_t>(d.group)].down && c_.faults.planted != planted_bug::place_on_dead) continue;
    cands.push_back({engine_id{i}, static_cast<int64_t>(d.sched->running() + d.sched->waiting()) + d.pending, kv,
                     d.caches->pool().num_free(), false});
  }
  auto chosen = decode_policy_->choose(ask, cands, {});
  live& l = live_.at(r.id.value);
  if (chosen && groups_[static_cast<size_t>(decode_rank(chosen->value).group)].down) {
    ++fo_.placed_on_dead;  // (planted bug only) nobody answers there: it decodes here
    ++kept_;
    return;
  }
  if (chosen) {
    rank_state& d = decode_rank(chosen->value);
    auto copy = restarted(r);  // its caches come with the handoff (adopt)
    if (d.caches->adopt(*copy, r.computed())) {
      from.sched->detach(&r);
      ++d.pending;
      d.pending_kv += context;
      ++d.placed;
      l.moving = std::move(copy);
      l.to_rank = static_cast<int32_t>(chosen->value);
      records_[static_cast<size_t>(r.id.value)].decode_rank = l.to_rank;
      const double bytes = static_cast<double>(r.computed()) * prof_.kv_bytes_per_token;
      double t = prof_.handoff_latency_s + bytes * 8 / (prof_.handoff_gbps * 1e9);
      const uint64_t epoch = ++l.handoff_epoch;
      bool failed = false;
      if (inject_) {
        failed = inject_->fire(runtime::fault_point::kv_handoff);
        if (!failed && inject_->fire(runtime::fault_point::kv_handoff_delay))
          t += 3 * c_.faults.handoff_timeout_s * inject_->uniform(runtime::fault_point::kv_handoff_delay);
        failed = failed || t > c_.faults.handoff_timeout_s;  // too late: given up at the deadline
      }
      const double now = clock_.now_s();
      if (failed) {
        push(now + c_.faults.handoff_timeout_s, ev::handoff_timeout, r.id.value, epoch);
      } else {
        push(now + t, ev::handoff_done, r.id.value, epoch);
        if (inject_ && inject_->fire(runtime::fault_point::message_dup))  // delivered twice
          push(now + t + 0.5 * inject_->uniform(runtime::fault_point::message_dup), ev::handoff_done, r.id.value, epoch);
      }
      ++handoffs_;
      return;
    }
  }
  ++kept_;  // no decode rank has room: it decodes here
}

void cluster::handoff_done(int64_t id, uint64_t epoch) {
  auto it = live_.find(id);
  if (it == live_.end() || it->second.handoff_epoch != epoch) return;  // stale: the request moved on
  live& l = it->second;
  if (!l.moving) {  // this handoff completed already: a duplicate delivery, ignored
    ++fo_.handoff_duplicates;
    return;
  }
  rank_state& from = prefill_rank(l.rank);
  from.sched->finish(l.req.get());
  rank_state& d = decode_rank(l.to_rank);
  --d.pending;
  d.pending_kv -= l.moving->num_tokens();
  d.sched->add_running(l.moving.get());
  l.req = std::move(l.moving);
  l.rank = static_cast<int32_t>(c_.prefill_ranks + l.to_rank);
  if (!groups_[static_cast<size_t>(d.group)].stepping) start_step(static_cast<size_t>(d.group));
}

// The decode side of a failed handoff recomputes from the tokens it was given.
void cluster::recompute_on_decode(int64_t id) {
  live& l = live_.at(id);
  rank_state& d = decode_rank(l.to_rank);
  l.req = restarted(*l.moving);
  l.moving.reset();
  l.rank = static_cast<int32_t>(c_.prefill_ranks + l.to_rank);
  d.sched->add(l.req.get());
}

void cluster::handoff_timeout(int64_t id, uint64_t epoch) {
  auto it = live_.find(id);
  if (it == live_.end() || it->second.handoff_epoch != epoch || !it->second.moving) return;
  live& l = it->second;
  ++l.handoff_epoch;  // a completion arriving after the deadline is stale
  ++fo_.handoff_failures;
  rank_state& from = prefill_rank(l.rank);
  rank_state& d = decode_rank(l.to_rank);
  --d.pending;
  d.pending_kv -= l.moving->num_tokens();
  from.sched->finish(l.req.get());  // the prefill side's lease ends: unpinned
  d.caches->release(*l.moving);     // the reservation goes, and it recomputes there
  recompute_on_decode(id);
  if (!groups_[static_cast<size_t>(d.group)].stepping) start_step(static_cast<size_t>(d.group));
}

void cluster::park_deadline(int64_t id, uint64_t epoch) {
  auto it = live_.find(id);
  if (it == live_.end() || it->second.rank >= 0 || it->second.park_epoch != epoch) return;
  std::erase(parked_, id);
  fail(id, "no prefill engine up for " + std::to_string(static_cast<int64_t>(c_.faults.request_timeout_s)) + " s");
}

}  // namespace shoal::sim::detail
