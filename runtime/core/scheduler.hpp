// Continuous batching under a token budget. Each step is planned as a list of items
// (request, tokens to compute, blocks to attach): running decodes first, then prefill
// chunks of running requests, then admissions in arrival order. The chunk of a prefill is
// the largest that fits the remaining token budget and — when a fitted cost model and a
// step time budget are set — the remaining time. When blocks run out the newest running
// request is preempted (blocks released, recomputed later), so the oldest always progress.
// A request whose prefix the remote tier may extend first waits for that read off the step
// loop (cache_manager::try_start_remote) and is admitted when it is done or timed out.
// Planning may run while the previous step is still computing (async scheduling): it then
// reads in-flight requests as if that step had completed and never preempts.
#pragma once

#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "runtime/core/cache_manager.hpp"
#include "runtime/core/cost_model.hpp"
#include "runtime/core/request.hpp"

namespace shoal::runtime {

struct scheduler_config {
  int64_t token_budget = 32768;     // tokens per step
  int64_t max_running = 64;         // running sequences
  int64_t max_chunk = 0;            // 0 = no cap beyond the budget
  double step_time_budget_s = 0.0;  // 0 = token budget only
  std::optional<cost_model> cost;   // used with step_time_budget_s
};

struct planned_item {
  request* req = nullptr;
  int64_t n_tokens = 0;               // positions [base, base + n) of the request
  std::vector<block_id> new_blocks;   // attached at dispatch
  int64_t base = -1;                  // request's computed position, set at dispatch
  int64_t drafts = 0;                 // speculative drafts verified after its next token (in n_tokens)
};

struct step_plan {
  std::vector<planned_item> items;
  int64_t tokens = 0;
  bool needs_sync = false;  // blocks ran out while a step was in flight: plan again after it
};

class scheduler {
 public:
  scheduler(const scheduler_config& config, cache_manager& caches);
  // A step-cost model from now on (fitted while serving): chunks sized to `step_budget_s`.
  void set_cost(cost_model cost, double step_budget_s) {
    config_.cost = std::move(cost);
    config_.step_time_budget_s = step_budget_s;
  }

  // Queues a request. One re-routed with output its client has (request::resumed) waits ahead
  // of the requests without output: its stream is stalled until it runs.
  void add(request* r);
  // Handoff, decode side: r's cache is being read (cache_manager::start_import); it runs as
  // soon as the reads end intact, else it recomputes from its tokens.
  void add_importing(request* r);
  // Handoff, decode side, when the cache is already in place (cache_manager::adopt): r runs
  // from its next token at once.
  void add_running(request* r);
  // Handoff, prefill side: r leaves the running set with its caches kept (handing_off) /
  // comes back to it when no decode engine took it.
  void detach(request* r);
  void resume(request* r);
  // Plans the next step. `in_flight`: requests of the step being computed now, with their
  // token counts (their positions advance by that much; those with logits get one token; a
  // speculative item's drafts count as rejected, refit adds what was accepted).
  step_plan plan(const std::vector<planned_item>& in_flight);
  // Removes a finished (or aborted) request from the running set and frees its caches.
  void finish(request* r);
  // Drops items of requests that finished meanwhile, returning their new blocks.
  void prune(step_plan& plan);
  // A plan made from the in-flight view, fitted to what that step did once it completed:
  // requests no longer running leave it, each item's chunk and new blocks match its request
  // now (a speculative step that accepted fewer drafts than it verified needs fewer; when more
  // blocks are needed than the pool has, needs_sync), and waiting requests are admitted into
  // what is left of the token budget (those that arrived while the step computed).
  void refit(step_plan& plan);
  // Gives back every new block of `plan` (a plan that will not run).
  void discard(step_plan& plan);

  size_t waiting() const { return waiting_.size(); }
  size_t waiting_for_remote() const { return remote_waiting_.size(); }
  size_t remote_reads_out() const { return caches_.remote_reads_out(); }
  size_t importing() const { return caches_.imports_out(); }
  // Requests whose handoff reads ended (either way) since the last call.
  std::vector<request_id> take_imports_over() { return std::exchange(imports_over_, {}); }
  size_t running() const { return running_.size(); }
  const std::vector<request*>& running_requests() const { return running_; }
  const std::deque<request*>& waiting_requests() const { return waiting_; }

 private:
  struct view {  // a request's positions as of the end of the in-flight step
    int64_t computed = 0, tokens = 0;
  };
  view view_of(const request* r, const std::vector<planned_item>& in_flight) const;
  int64_t chunk_for(const request* r, const view& v, int64_t budget, double time_left) const;
  void preempt(request* r, step_plan& plan);
  bool try_admit(request* r, step_plan& plan, int64_t& budget, double& time_left);

  scheduler_config config_;
  cache_manager& caches_;
  void collect_remote();
  void collect_imports();

  std::deque<request*> waiting_;
  std::vector<request*> running_;
  std::vector<request*> remote_waiting_;  // start order
  std::vector<request*> importing_;
  std::vector<request_id> imports_over_;
};

}  // namespace shoal::runtime
