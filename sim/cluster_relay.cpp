// Each simulated request's relay: runtime::relay, the protocol the gateway's relay actor runs,
// hosted in virtual time. Its messages to balancers and engines are deferred calls (answered
// at the same virtual time, in order); what the balancers answer comes from the same
// runtime::prefill_balancer and decode_placement the gateway's balancer actors use.
#include "sim/cluster_run.hpp"

#include <algorithm>

namespace shoal::sim::detail {

void cluster::relay_client::route(std::span<const engine_id> exclude) {
  c_.later(0, [&c = c_, id = id_, ex = std::vector<engine_id>(exclude.begin(), exclude.end())]() mutable {
    c.route_answer(id, std::move(ex));
  });
}

void cluster::relay_client::submit(engine_id e, int64_t resume) {
  c_.later(0, [&c = c_, id = id_, e, resume] { c.submit_at(id, e, resume); });
}

// The decode engine that took the request: the run's records.
void cluster::relay_client::watch(engine_id e) {
  rank_state& d = c_.ranks_[static_cast<size_t>(c_.global_of(e))];
  ++d.placed;
  ++c_.handoffs_;
  c_.records_[static_cast<size_t>(id_)].decode_rank = d.index;
}

void cluster::relay_client::release_prefill() { c_.balancer_->done(request_id{id_}, c_.clock_.now_s()); }

void cluster::relay_client::retry_after(double seconds) {
  c_.later(seconds, [&c = c_, id = id_] { c.feed(id, [](runtime::relay& r) { r.retry_due(); }); });
}

void cluster::relay_client::route_decode(uint64_t placement, std::span<const engine_id> refused) {
  c_.later(0, [&c = c_, id = id_, placement, ex = std::vector<engine_id>(refused.begin(), refused.end())]() mutable {
    c.decode_route_answer(id, placement, std::move(ex));
  });
}

void cluster::relay_client::offer_to(engine_id d, uint64_t placement) {
  c_.later(0, [&c = c_, id = id_, d, placement] { c.offer_at(id, d, placement); });
}

void cluster::relay_client::tell_placed(engine_id e, bool placed) {
  if (!placed) ++c_.kept_;
  c_.later(0, [&c = c_, id = id_, e, placed] { c.placed_at(id, e, placed); });
}

void cluster::relay_client::cancel_at(engine_id e) {
  c_.later(0, [&c = c_, id = id_, e] { c.cancel_at(id, e); });
}

void cluster::relay_client::fail(const runtime::relay_error& err) {
  request_record& rec = c_.records_[static_cast<size_t>(id_)];
  rec.error = err.message;
  c_.fo_.errors.push_back("request " + std::to_string(id_) + ": " + rec.error);
}

// -- the run's side of the relays ---------------------------------------------------------

void cluster::later(double delay_s, std::function<void()> f) {
  const uint64_t key = next_call_++;
  calls_.emplace(key, std::move(f));
  push(clock_.now_s() + delay_s, ev::call, static_cast<int64_t>(key));
}

rank_state* cluster::engine_at(engine_id e) {
  rank_state& rk = ranks_[static_cast<size_t>(global_of(e))];
  if (rk.incarnation != static_cast<uint64_t>(e.value / static_cast<int64_t>(ranks_.size()))) return nullptr;
  if (unreachable(rk)) return nullptr;
  return &rk;
}

// One input to request `id`'s relay (none when it is over); a relay that is done goes.
void cluster::feed(int64_t id, const std::function<void(runtime::relay&)>& f) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  f(it->second->machine);
  if (it->second->machine.done()) live_.erase(it);
}

// The prefill balancer's answer: an engine up and not excluded, or none.
void cluster::route_answer(int64_t id, std::vector<engine_id> exclude) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  std::vector<engine_id> excluded;  // the balancer's ids (pool indices) of the excluded engines
  for (engine_id e : exclude)
    if (rank_state* rk = engine_at(e); rk && rk->prefill) excluded.push_back(engine_id{rk->index});
  const sim_request& w = work_[static_cast<size_t>(id)];
  const auto prompt = prompt_tokens(w, prof_.model.vocab_size);
  runtime::prefill_request pr{request_id{id}, w.input_len, runtime::chain_keys(prompt, static_cast<int>(prof_.model.block_size))};
  auto placed = balancer_->place(pr, clock_.now_s(), excluded);
  if (!placed) {
    feed(id, [](runtime::relay& r) {
      r.route_failed({runtime::relay_failure::host, 0, false, "no prefill engine is up"}, true);
    });
    return;
  }
  const int32_t gi = static_cast<int32_t>(placed->value);  // prefill ranks come first
  if (unreachable(prefill_rank(placed->value))) ++fo_.placed_on_dead;
  feed(id, [&](runtime::relay& r) { r.routed(ref(gi)); });
}

// The decode balancer's answer: a decode rank up, not refused before, with room in the view
// the placement policy takes (running and waiting requests, KV held and on its way).
void cluster::decode_route_answer(int64_t id, uint64_t placement, std::vector<engine_id> refused) {
  auto it = live_.find(id);
  if (it == live_.end() || !it->second->offer) return;
  const runtime::request& o = *it->second->offer;
  const int64_t context = o.num_tokens();
  runtime::decode_ask ask{context, o.params.max_tokens - o.output_len(), prefill_rank(0).caches->blocks_for(context) + 1};
  std::vector<runtime::decode_candidate> cands;
  for (int64_t i = 0; i < c_.decode_ranks; ++i) {
    rank_state& d = decode_rank(i);
    const int32_t gi = static_cast<int32_t>(c_.prefill_ranks + i);
    if (unreachable(d) && c_.faults.planted != planted_bug::place_on_dead) continue;
    if (std::ranges::find(refused, ref(gi)) != refused.end()) continue;
    int64_t kv = d.importing_kv();
    for (const runtime::request* q : d.sched->running_requests()) kv += q->computed();
    cands.push_back({engine_id{i}, static_cast<int64_t>(d.sched->running() + d.sched->waiting() + d.imports.size()), kv,
                     d.caches->pool().num_free(), false});
  }
  auto chosen = decode_policy_->choose(ask, cands, {});
  if (!chosen) {
    feed(id, [&](runtime::relay& r) { r.decode_route_failed(placement); });
    return;
  }
  const int32_t gi = static_cast<int32_t>(c_.prefill_ranks + chosen->value);
  if (unreachable(decode_rank(chosen->value))) ++fo_.placed_on_dead;
  feed(id, [&](runtime::relay& r) { r.decode_routed(placement, ref(gi)); });
}

// The client's stream: each token must be the next one it expects, once.
void cluster::client_token(int64_t id, int32_t token, int64_t cached_tokens, double now) {
  request_record& rec = records_[static_cast<size_t>(id)];
  if (token != output_token(id, rec.output, prof_.model.vocab_size)) ++fo_.wrong_outputs;
  if (++rec.output == 1) rec.first_token_s = now, rec.cached_tokens = cached_tokens;
}

void cluster::client_final(int64_t id, const runtime::request& r, double now) {
  request_record& rec = records_[static_cast<size_t>(id)];
  if (rec.finish_s >= 0) ++fo_.duplicates;  // finished once already
  rec.finish_s = now;
  rec.preemptions += r.preemptions;
}

}  // namespace shoal::sim::detail
