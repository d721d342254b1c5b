// The engine under expert parallelism: the lockstep step of the group, a failed exchange,
// the group and placement changes, and lending this process's experts to its peers.
#include "runtime/engine/engine.hpp"

#include <chrono>
#include <limits>

#include "kernels/assert.hpp"
#include "runtime/ep/expert_residency.hpp"

namespace shoal::runtime {

// One lockstep step: plan → forward with the EP hook (or no forward) → join the slots it did
// not use → complete (engine_config::ep).
std::vector<token_event> engine::step_ep() {
  // A new group agrees its placement first (every rank, before its first step).
  if (ep_->needs_agreement()) {
    auto agreed = ep_->agree_group(config_.experts ? config_.experts->resident_set() : expert_residency::expert_set{});
    if (!agreed) return fail_step(agreed.error().message);
    stats_.regroup_orphans = agreed->orphans;
    stats_.regroup_moved_to_new = agreed->moved_to_new;
    ep_notice("placement agreed: epoch " + std::to_string(agreed->placement.epoch()) + ", " +
              std::to_string(agreed->orphans) + " expert(s) placed anew, " + std::to_string(agreed->moved_to_new) +
              " given to ranks back");
  }
  step_plan p = plan_now();
  stalled_ = p.items.empty() && has_work();
  // This placement's experts (and an offered one's) in memory before any of them is computed.
  // While the experts it gains are read from their holders, the rank steps on the current
  // placement without advertising the offered one as ready.
  const std::pair want{ep_->placement(), ep_->offered()};
  if (config_.experts && held_for_ != want) {
    auto experts = expert_residency::experts_for(*want.first, ep_->layout().rank, want.second.get());
    // A placement being adopted is held once its experts are in memory (fetched, or read from
    // the checkpoint on the residency's thread); until then the rank steps on the current one.
    // The group's first placement has no current one: the rank waits for it, without the
    // residency's lock (its peers' exchanges wait for this rank meanwhile).
    if (!want.second && held_for_.first != want.first &&
        !config_.experts->wait_ready(experts, config_.ep->ready_timeout)) {
      if (!p.items.empty()) dispatch(std::move(p));
      return fail_step("EP rank " + std::to_string(ep_->layout().rank) + ": placement epoch " +
                       std::to_string(want.first->epoch()) + " not in memory after " +
                       std::to_string(config_.ep->ready_timeout.count()) + " ms: " + config_.experts->not_ready(experts));
    }
    if (config_.experts->ready(experts)) {
      if (auto held = config_.experts->hold(this, experts); !held) {
        // This rank cannot compute its experts: its requests fail (its peers' exchanges with
        // it time out).
        if (!p.items.empty()) dispatch(std::move(p));
        return fail_step("EP rank " + std::to_string(ep_->layout().rank) + ": " + held.error());
      }
      // A switch means every rank was ready: every read of this process's lent experts ended.
      if (held_for_.first && want.first->epoch() > held_for_.first->epoch())
        config_.experts->end_loans(want.first->epoch());
      held_for_ = want;
    }
  }
  if (want.second && (!config_.experts || held_for_ == want)) ep_->mark_ready();  // (again, once ready)
  // Whether complete() will draft (the group runs the draft passes when any rank does).
  ep_->begin_step(!p.items.empty() && drafts_wanted());
  if (!p.items.empty()) {
    dispatch(std::move(p));
    try {
      launch();  // (without async scheduling the pass runs here)
      plan_ahead();
      wait_done();
    } catch (const ep_error& e) {  // the step was abandoned by the exchange
      drop_planned();
      return fail_step(e.what());
    }
  }
  if (!flight_) {
    if (auto joined = ep_->end_step(); !joined) return fail_step(joined.error());
    ++stats_.steps;
    step_succeeded();
    return {};
  }
  // Completion drafts the next step's tokens through the MTP slots of this same lockstep step
  // (ep_moe_exchange::set_draft_depth); a draft that fails leaves its requests without drafts
  // and abandons the step (draft()). The main pass's results hold either way: every exchange
  // they needed completed.
  std::vector<token_event> events = complete();
  if (planned_) sched_.prune(*planned_);  // requests that just finished give their blocks back
  if (ep_->in_step()) {
    if (auto joined = ep_->end_step(); !joined) {
      step_failed(joined.error());
      return events;
    }
  }
  step_succeeded();
  return events;
}

void engine::ep_notice(const std::string& what) const {
  if (config_.ep && config_.ep->notice)
    config_.ep->notice("EP rank " + std::to_string(ep_->layout().rank) + "/" + std::to_string(ep_->layout().size) +
                       " (step " + std::to_string(ep_->steps_started()) + "): " + what);
}

void engine::step_failed(const std::string& why) {
  last_error_ = why;
  ++stats_.failed_steps;
  if (failing_since_ != 0) {
    const uint64_t run = stats_.failed_steps - failing_since_ + 1;
    if (run >= 8 && (run & (run - 1)) == 0)  // 8, 16, 32, ... in a row: still failing, and why
      ep_notice(std::to_string(run) + " steps failed in a row, the last: " + why);
    return;
  }
  failing_since_ = stats_.failed_steps;
  ep_notice("step failed: " + why);
}

void engine::step_succeeded() {
  if (failing_since_ == 0) return;
  ep_notice("steps succeed again, after " + std::to_string(stats_.failed_steps - failing_since_ + 1) + " failed");
  failing_since_ = 0;
}

// The step's forward pass did not finish: its requests' caches are partly written past
// `computed`, and nothing of it was committed (no token sampled, no prefix-cache registration,
// no SWA snapshot, no draft made). A request whose positions can be computed again over what
// the pass wrote stays, to be recomputed by the group the rank adopts next (a lost rank's
// group re-forms), once a group: deepseek_v3's caches are written by position; a shoal_flash
// run no longer than the ring's slack beyond the window (a decode step, drafts included) left
// the window's entries in its ring. The others (a longer prefill chunk of shoal_flash, or a
// second failure in the same group) end with an error (blocks freed) for their relays to
// place again.
std::vector<token_event> engine::fail_step(const std::string& why) {
  step_failed(why);
  std::vector<token_event> events;
  if (!flight_) return events;
  const model::model_config& mc = weights_->config;
  const int64_t slack = mc.is_flash() ? caches_.ring_tokens() - mc.window() : std::numeric_limits<int64_t>::max();
  bool kept = false;
  for (auto& item : flight_->plan.items) {
    request* r = item.req;
    if (may_recompute_ && item.n_tokens <= slack) {
      if (mc.is_flash()) r->spec.ring_written = std::max(r->spec.ring_written, item.base + item.n_tokens);
      kept = true;
      continue;
    }
    r->finish = finish_reason::error;
    sched_.finish(r);
    events.push_back({r->id, -1, true, finish_reason::error, {}});
  }
  if (kept) ++stats_.recomputed_steps;
  may_recompute_ = false;
  flight_.reset();
  return events;
}

result<void> engine::offer_placement(std::shared_ptr<const ep_placement> next,
                                                         const std::vector<expert_part>& sources) {
  SHOAL_ASSERT(ep_ && !flight_);
  if (auto offered = ep_->offer(next); !offered) return offered;
  if (!config_.experts || !config_.ep->bulk || sources.empty()) return {};
  // This rank's share: what it computes under the offered placement (the residency skips
  // what the process holds or is reading already).
  const auto mine = expert_residency::experts_for(*next, ep_->layout().rank);
  std::vector<expert_part> wanted;
  for (const expert_part& part : sources)
    if (part.slot >= 0 && part.slot < static_cast<int32_t>(mine.size()) &&
        std::binary_search(mine[part.slot].begin(), mine[part.slot].end(), part.expert))
      wanted.push_back(part);
  return config_.experts->fetch(next->epoch(), wanted, config_.ep->bulk, config_.ep->fetch_timeout);
}

result<engine::lend_job> engine::prepare_lend(uint64_t epoch, std::vector<std::pair<int32_t, int32_t>> experts,
                                             std::chrono::milliseconds lease) const {
  if (!config_.experts) return fail(errc::unavailable, "this engine holds every expert (no partitioned weights to lend)");
  if (!config_.ep || !config_.ep->bulk)
    return fail(errc::unavailable,
                "this engine has no bulk transport for expert weights (engine.ep_frames = \"caf\")");
  return [residency = config_.experts, bulk = config_.ep->bulk, epoch, experts = std::move(experts), lease] {
    return residency->lend(epoch, experts, *bulk, lease);
  };
}

result<std::vector<expert_part>> engine::lend_experts(
    uint64_t epoch, const std::vector<std::pair<int32_t, int32_t>>& experts, std::chrono::milliseconds lease) {
  auto job = prepare_lend(epoch, experts, lease);
  if (!job) return std::unexpected(job.error());
  return (*job)();
}

void engine::set_ep_group(ep_layout layout, std::shared_ptr<expert_transport> transport, std::vector<int32_t> moved) {
  SHOAL_ASSERT(ep_ && !flight_);
  config_.ep->layout = layout;
  config_.ep->transport = transport;
  ep_->reconfigure(layout, std::move(transport), std::move(moved));
  may_recompute_ = true;
  ep_notice("adopted a group of " + std::to_string(layout.size) + " rank(s)");
  if (config_.experts) {
    config_.experts->drop_fetches();  // an offered plan was dropped with the old group
    config_.experts->defer_drops();   // the process's other ranks may take over what this one drops
  }
}
}  // namespace shoal::runtime
