// Step planning: decodes, prefill chunks, admissions, preemption. See scheduler.hpp.
#include "runtime/core/scheduler.hpp"

#include <algorithm>
#include <limits>

#include "kernels/assert.hpp"

namespace shoal::runtime {

scheduler::scheduler(const scheduler_config& config, cache_manager& caches)
    : config_(config), caches_(caches) {}

void scheduler::add(request* r) {
  r->status = request_status::waiting;
  if (r->resumed == 0) {
    waiting_.push_back(r);
    return;
  }
  // A re-routed request is mid-stream, as a preempted one is: ahead of every request that has
  // no output yet, behind those that do (in their order).
  auto fresh = std::find_if(waiting_.begin(), waiting_.end(), [](const request* w) { return w->output_len() == 0; });
  waiting_.insert(fresh, r);
}

scheduler::view scheduler::view_of(const request* r, const std::vector<planned_item>& in_flight) const {
  view v{r->computed(), r->num_tokens()};
  for (const auto& it : in_flight)
    if (it.req == r) {  // as if it completed with none of its drafts accepted (refit fits the rest)
      v.computed = it.base + it.n_tokens - it.drafts;
      if (v.computed == r->num_tokens()) v.tokens += 1;  // its step samples one more token
    }
  return v;
}

int64_t scheduler::chunk_for(const request* r, const view& v, int64_t budget, double time_left) const {
  int64_t remaining = v.tokens - v.computed;
  int64_t n = std::min(remaining, budget);
  if (remaining > 1 && config_.max_chunk > 0) n = std::min(n, config_.max_chunk);
  if (remaining > 1 && config_.cost && config_.step_time_budget_s > 0) {
    if (time_left <= 0) return 0;
    n = std::min(n, config_.cost->largest_chunk(v.computed, time_left, n, remaining));
  }
  return std::max<int64_t>(n, 0);
}

void scheduler::preempt(request* r, step_plan& plan) {
  for (auto it = plan.items.begin(); it != plan.items.end(); ++it)
    if (it->req == r) {
      caches_.give_back(it->new_blocks);
      plan.tokens -= it->n_tokens;
      plan.items.erase(it);
      break;
    }
  running_.erase(std::find(running_.begin(), running_.end(), r));
  caches_.release(*r);
  caches_.count_preemption();
  r->preemptions++;
  r->status = request_status::waiting;
  waiting_.push_front(r);  // resumes first: recompute from its tokens
}

// Requests whose remote read ended go back to the head of the queue, in the order they left it.
void scheduler::collect_remote() {
  std::vector<request*> ready = caches_.poll_remote();
  for (auto it = ready.rbegin(); it != ready.rend(); ++it) {
    request* r = *it;
    std::erase(remote_waiting_, r);
    r->status = request_status::waiting;
    waiting_.push_front(r);
  }
}

void scheduler::add_importing(request* r) {
  r->status = request_status::waiting_for_remote_kv;
  importing_.push_back(r);
}

void scheduler::add_running(request* r) {
  r->status = request_status::running;
  running_.push_back(r);
}

// Imported requests run from where the prefill engine stopped; failed ones recompute first.
void scheduler::collect_imports() {
  for (auto [r, ok] : caches_.poll_imports()) {
    std::erase(importing_, r);
    imports_over_.push_back(r->id);
    if (ok) {
      r->status = request_status::running;
      running_.push_back(r);
    } else {
      r->status = request_status::waiting;
      waiting_.push_front(r);
    }
  }
}

void scheduler::detach(request* r) {
  std::erase(running_, r);
  r->status = request_status::handing_off;
}

void scheduler::resume(request* r) {
  SHOAL_ASSERT(r->status == request_status::handing_off);
  r->status = request_status::running;
  running_.push_back(r);
}

step_plan scheduler::plan(const std::vector<planned_item>& in_flight) {
  collect_remote();
  collect_imports();
  step_plan out;
  const bool async = !in_flight.empty();
  int64_t budget = config_.token_budget;
  double time_left = config_.step_time_budget_s > 0 ? config_.step_time_budget_s
                                                    : std::numeric_limits<double>::infinity();
  auto predict = [&](const view& v, int64_t n) {
    return config_.cost ? config_.cost->predict(n, v.computed) : 0.0;
  };
  // Running requests, oldest first; preemption takes the newest.
  for (size_t i = 0; i < running_.size();) {
    request* r = running_[i];
    view v = view_of(r, in_flight);
    int64_t n = chunk_for(r, v, budget, time_left);
    if (n == 0) {
      ++i;
      continue;
    }
    int64_t need = caches_.blocks_for(v.computed + n) - static_cast<int64_t>(r->blocks.size());
    while (need > caches_.pool().num_free()) {
      if (async) {
        for (auto& it : out.items) caches_.give_back(it.new_blocks);
        return {{}, 0, true};
      }
      request* victim = running_.back();
      preempt(victim, out);
      if (victim == r) break;
    }
    if (r->status != request_status::running) continue;  // r itself was preempted
    out.items.push_back({r, n, caches_.take_blocks(need), -1});
    out.tokens += n;
    budget -= n;
    time_left -= predict(v, n);
    ++i;
  }
  while (!waiting_.empty() && budget > 0 && static_cast<int64_t>(running_.size()) < config_.max_running)
    if (!try_admit(waiting_.front(), out, budget, time_left)) break;
  return out;
}

bool scheduler::try_admit(request* r, step_plan& plan, int64_t& budget, double& time_left) {
  if (caches_.try_start_remote(*r)) {  // waits off the queue; the next ones may go ahead
    waiting_.pop_front();
    r->status = request_status::waiting_for_remote_kv;
    remote_waiting_.push_back(r);
    return true;
  }
  if (!caches_.can_admit(*r)) return false;
  caches_.admit(*r);
  view v{r->computed(), r->num_tokens()};
  int64_t n = chunk_for(r, v, budget, time_left);
  int64_t need = caches_.blocks_for(v.computed + std::max<int64_t>(n, 1)) - static_cast<int64_t>(r->blocks.size());
  if (n == 0 || need > caches_.pool().num_free()) {
    caches_.release(*r);  // not now: leave it waiting with nothing held
    return false;
  }
  waiting_.pop_front();
  r->status = request_status::running;
  running_.push_back(r);
  plan.items.push_back({r, n, caches_.take_blocks(need), -1});
  plan.tokens += n;
  budget -= n;
  if (config_.cost) time_left -= config_.cost->predict(n, v.computed);
  return true;
}

void scheduler::finish(request* r) {
  if (auto it = std::find(running_.begin(), running_.end(), r); it != running_.end()) {
    running_.erase(it);
    caches_.release(*r);
  } else if (auto w = std::find(waiting_.begin(), waiting_.end(), r); w != waiting_.end()) {
    waiting_.erase(w);
  } else if (auto rw = std::find(remote_waiting_.begin(), remote_waiting_.end(), r); rw != remote_waiting_.end()) {
    remote_waiting_.erase(rw);
    caches_.abandon_remote(*r);
  } else if (auto im = std::find(importing_.begin(), importing_.end(), r); im != importing_.end()) {
    importing_.erase(im);
    caches_.abandon_import(*r);
  } else if (r->status == request_status::handing_off) {
    caches_.release(*r);
  }
  r->status = request_status::finished;
}

void scheduler::prune(step_plan& plan) {
  std::erase_if(plan.items, [&](planned_item& it) {
    if (it.req->status == request_status::running) return false;
    caches_.give_back(it.new_blocks);
    plan.tokens -= it.n_tokens;
    return true;
  });
}

void scheduler::refit(step_plan& plan) {
  collect_remote();
  collect_imports();
  prune(plan);
  double time_left = config_.step_time_budget_s > 0 ? config_.step_time_budget_s
                                                    : std::numeric_limits<double>::infinity();
  for (auto it = plan.items.begin(); it != plan.items.end();) {
    request* r = it->req;
    const int64_t remaining = r->num_tokens() - r->computed();
    if (remaining <= 0) {
      caches_.give_back(it->new_blocks);
      plan.tokens -= it->n_tokens;
      it = plan.items.erase(it);
      continue;
    }
    if (it->n_tokens > remaining) plan.tokens -= it->n_tokens - remaining, it->n_tokens = remaining;
    const int64_t need = caches_.blocks_for(r->computed() + it->n_tokens) - static_cast<int64_t>(r->blocks.size());
    while (static_cast<int64_t>(it->new_blocks.size()) > std::max<int64_t>(need, 0)) {
      caches_.give_back({it->new_blocks.back()});
      it->new_blocks.pop_back();
    }
    if (need > static_cast<int64_t>(it->new_blocks.size())) {
      const int64_t more = need - static_cast<int64_t>(it->new_blocks.size());
      if (more > caches_.pool().num_free()) {
        discard(plan);
        plan = {{}, 0, true};
        return;
      }
      for (block_id b : caches_.take_blocks(more)) it->new_blocks.push_back(b);
    }
    if (config_.cost) time_left -= config_.cost->predict(it->n_tokens, r->computed());
    ++it;
  }
  int64_t budget = config_.token_budget - plan.tokens;
  while (!waiting_.empty() && budget > 0 && static_cast<int64_t>(running_.size()) < config_.max_running)
    if (!try_admit(waiting_.front(), plan, budget, time_left)) break;
}

void scheduler::discard(step_plan& plan) {
  for (auto& it : plan.items) caches_.give_back(it.new_blocks);
  plan.items.clear();
  plan.tokens = 0;
}

}  // namespace shoal::runtime
