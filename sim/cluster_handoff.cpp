// The simulated engines' side of the protocol: submissions, the prefill side's handoff
// offers under runtime::handoff_leases (the engine actor's lease table), the decode side's
// imports (a reserved copy read over the modelled link, recomputed from its tokens when the
// read fails or is late), releases, cancels. The relays (cluster_relay.cpp) are runtime::relay.
#include "sim/cluster_run.hpp"

#include <algorithm>
#include <cmath>

namespace shoal::sim::detail {

void cluster::wake_group(int32_t group) {
  if (!groups_[static_cast<size_t>(group)].stepping) start_step(static_cast<size_t>(group));
}

// The engine stops and forgets request `id` (finished, cancelled, its sink gone, its lease
// ended taken): its blocks are freed whether it was running, waiting or lent.
void cluster::drop_request(rank_state& rk, int64_t id) {
  auto it = rk.reqs.find(id);
  if (it == rk.reqs.end()) return;
  rk.sched->finish(it->second.get());
  rk.leases.drop(request_id{id});
  rk.reqs.erase(it);
}

void cluster::submit_at(int64_t id, engine_id e, int64_t resume) {
  rank_state* rk = engine_at(e);
  if (!rk) {
    feed(id, [&](runtime::relay& r) {
      r.submit_failed(e, {runtime::relay_failure::host, 0, false, "engine unreachable"}, true);
    });
    return;
  }
  if (!live_.contains(id)) return;
  if (rk->leases.lent_out(request_id{id})) {  // a re-routed attempt of a request lent out here: that lease ends
    rk->leases.drop(request_id{id});
    end_lease(*rk, id, true);
  }
  if (rk->reqs.contains(id)) {
    feed(id, [&](runtime::relay& r) {
      r.submit_failed(e, {runtime::relay_failure::host, 0, false, "request is still running there"}, false);
    });
    return;
  }
  const sim_request& w = work_[static_cast<size_t>(id)];
  auto r = std::make_unique<runtime::request>();
  r->id = request_id{id};
  r->tokens = prompt_tokens(w, prof_.model.vocab_size);
  r->prompt_len = w.input_len;
  for (int64_t j = 0; j < resume; ++j) r->tokens.push_back(output_token(id, j, prof_.model.vocab_size));
  r->resumed = resume;  // the client has these: the rank prefills them and samples on
  r->params.max_tokens = static_cast<int32_t>(w.output_len);
  request_record& rec = records_[static_cast<size_t>(id)];
  ++rec.attempts;
  if (rk->prefill) rec.prefill_rank = rk->index;
  rk->sched->add(r.get());
  rk->reqs[id] = std::move(r);
  wake_group(rk->group);
}

// Prefill side, after a request's first token: offered to its relay under a lease, its
// caches pinned and its decoding paused until the lease ends.
void cluster::offer_handoff(int32_t gi, runtime::request& r) {
  rank_state& rk = ranks_[static_cast<size_t>(gi)];
  const int64_t id = r.id.value;
  const uint64_t lease = rk.leases.offer(r.id);
  later(2 * c_.faults.handoff_timeout_s,
        [this, gi, inc = rk.incarnation, id, lease] { lease_deadline(gi, inc, id, lease); });
  rk.sched->detach(&r);
  relay_client& rc = *live_.at(id);
  rc.offer = restarted(r);
  rc.offer_from = gi, rc.offer_incarnation = rk.incarnation, rc.offer_lease = lease, rc.offer_computed = r.computed();
  bool fresh = false;
  feed(id, [&](runtime::relay& m) { fresh = m.offered(ref(gi), r.output_len()); });
  if (!fresh) drop_request(rk, id);  // a stale attempt's offer: the relay cancels it
}

// Decode side: reserve the blocks and start the read (the answer goes back at once, as the
// engine actor's does); no room, a rank that is not that engine, or the id already here: refused.
void cluster::offer_at(int64_t id, engine_id d, uint64_t placement) {
  auto it = live_.find(id);
  if (it == live_.end() || !it->second->offer) return;
  relay_client& rc = *it->second;
  rank_state* dr = engine_at(d);
  auto copy = restarted(*rc.offer);
  if (!dr || dr->reqs.contains(id) || dr->imports.contains(id) || !dr->caches->adopt(*copy, rc.offer_computed)) {
    feed(id, [&](runtime::relay& m) { m.decode_refused(placement, d); });
    return;
  }
  const uint64_t epoch = ++import_epochs_;
  const double bytes = static_cast<double>(rc.offer_computed) * prof_.kv_bytes_per_token;
  double t = prof_.handoff_latency_s + bytes * 8 / (prof_.handoff_gbps * 1e9);
  bool ok = true;
  if (inject_) {
    ok = !inject_->fire(runtime::fault_point::kv_handoff);
    if (ok && inject_->fire(runtime::fault_point::kv_handoff_delay))
      t += 3 * c_.faults.handoff_timeout_s * inject_->uniform(runtime::fault_point::kv_handoff_delay);
    if (t > c_.faults.handoff_timeout_s) ok = false, t = c_.faults.handoff_timeout_s;  // given up at the deadline
  }
  const int32_t gi = global_of(d);
  dr->imports[id] = {std::move(copy), rc.offer_from, rc.offer_incarnation, rc.offer_lease, epoch};
  later(t, [this, gi, inc = dr->incarnation, id, epoch, ok] { read_done(gi, inc, id, epoch, ok); });
  if (ok && inject_ && inject_->fire(runtime::fault_point::message_dup))  // the completion delivered twice
    later(t + 0.5 * inject_->uniform(runtime::fault_point::message_dup),
          [this, gi, inc = dr->incarnation, id, epoch] { read_done(gi, inc, id, epoch, true); });
  feed(id, [&](runtime::relay& m) { m.decode_took(placement, d); });
}

// Decode side: the read of import `epoch` ended. Read whole (and its lender still that engine):
// the request decodes here from where the prefill engine left it; else it recomputes here
// from its tokens. Either way the lender is told its bytes are no longer read.
void cluster::read_done(int32_t gi, uint64_t incarnation, int64_t id, uint64_t epoch, bool ok) {
  if (reads_done_.contains(epoch)) {
    ++fo_.handoff_duplicates;
    return;
  }
  rank_state& d = ranks_[static_cast<size_t>(gi)];
  if (d.incarnation != incarnation || unreachable(d)) return;
  auto it = d.imports.find(id);
  if (it == d.imports.end() || it->second.epoch != epoch) return;  // cancelled meanwhile
  reads_done_.insert(epoch);
  import_state im = std::move(it->second);
  d.imports.erase(it);
  const rank_state& lender = ranks_[static_cast<size_t>(im.lender)];
  if (ok && lender.incarnation == im.lender_incarnation && !unreachable(lender)) {
    d.sched->add_running(im.copy.get());
  } else {
    ++fo_.handoff_failures;
    d.caches->release(*im.copy);
    im.copy = restarted(*im.copy);
    d.sched->add(im.copy.get());
  }
  d.reqs[id] = std::move(im.copy);
  release_lender(im, id);
  wake_group(d.group);
}

void cluster::release_lender(const import_state& im, int64_t id) {
  later(0, [this, gi = im.lender, inc = im.lender_incarnation, lease = im.lease, id] {
    rank_state& p = ranks_[static_cast<size_t>(gi)];
    if (p.incarnation != inc || unreachable(p)) return;
    if (p.leases.release(request_id{id}, lease)) end_lease(p, id, true);
  });
}

// Prefill side, from the relay: placed (wait for the decode engine's release) or not (decode here).
void cluster::placed_at(int64_t id, engine_id e, bool placed) {
  rank_state* rk = engine_at(e);
  if (!rk || !rk->reqs.contains(id)) return;
  const auto p = rk->leases.placed(request_id{id}, placed);
  if (p.ended) return end_lease(*rk, id, false);
  if (p.rearm)
    later(2 * c_.faults.handoff_timeout_s,
          [this, gi = global_of(e), inc = rk->incarnation, id, n = *p.rearm] { lease_deadline(gi, inc, id, n); });
}

void cluster::lease_deadline(int32_t gi, uint64_t incarnation, int64_t id, uint64_t number) {
  rank_state& rk = ranks_[static_cast<size_t>(gi)];
  if (rk.incarnation != incarnation) return;
  if (auto taken = rk.leases.expire(request_id{id}, number)) end_lease(rk, id, *taken);
}

// The lease of `id` ended (the table holds it no more): taken, the copy here goes; not
// taken, it decodes here.
void cluster::end_lease(rank_state& rk, int64_t id, bool taken) {
  if (taken) return drop_request(rk, id);
  auto it = rk.reqs.find(id);
  if (it == rk.reqs.end()) return;
  rk.sched->add_running(it->second.get());
  wake_group(rk.group);
}

void cluster::cancel_at(int64_t id, engine_id e) {
  rank_state* rk = engine_at(e);
  if (!rk) return;
  if (auto it = rk->imports.find(id); it != rk->imports.end()) {
    rk->caches->release(*it->second.copy);
    release_lender(it->second, id);
    rk->imports.erase(it);
  }
  drop_request(*rk, id);
}

}  // namespace shoal::sim::detail
