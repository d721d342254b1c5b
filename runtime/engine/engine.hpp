// The engine of one data-parallel replica: model weights, caches, scheduler, sampler, and the
// step loop. step() plans, runs the forward pass, samples and returns token events. With
// async scheduling the forward pass runs on a compute thread and the next step is planned
// while it runs, so the compute thread waits only for the (measured) exposed overhead.
// As one rank of an expert-parallel group (engine_config::ep) every step() is one lockstep
// step of the group, also when this engine has nothing to run.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <expected>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "model/backend.hpp"
#include "model/tokenizer.hpp"
#include "model/weights.hpp"
#include "runtime/core/cache_manager.hpp"
#include "runtime/vision/embedding_cache.hpp"
#include "runtime/ep/expert_migration.hpp"
#include "runtime/ep/expert_parallel.hpp"
#include "runtime/core/handoff.hpp"
#include "runtime/engine/engine_stats.hpp"
#include "runtime/engine/forward_worker.hpp"
#include "runtime/base/error.hpp"
#include "runtime/base/transport.hpp"
#include "runtime/core/scheduler.hpp"
#include "runtime/core/token_event.hpp"
#include "runtime/core/speculative.hpp"

namespace shoal::runtime {
class expert_residency;  // runtime/ep/expert_residency.hpp
}  // namespace shoal::runtime

namespace shoal::runtime {

class token_vocab;
struct compiled_grammar;

struct engine_config {
  // The compute backend (engine.device, model/backend.hpp): made by name over the engine's
  // weights unless one is given (engines of a process may share one).
  std::string device = "cpu";
  std::shared_ptr<model::compute_backend> backend;
  // prefill: after a request's first token its cache is offered to a decode engine
  // (take_handoffs); decode and both: runs requests to the end (decode also takes handoffs).
  engine_role role = engine_role::both;
  // Bulk bytes of handoffs (required for role prefill; needed to take handoffs).
  std::shared_ptr<transport> bulk;
  std::chrono::milliseconds handoff_read_timeout{5000};
  cache_config cache;
  scheduler_config sched;
  bool batch_invariant = false;
  bool naive_prefill = false;   // naive (expanded) MLA for multi-token chunks
  bool async_scheduling = true;
  bool capture_logits = false;  // copy each sampled position's logits into its event (tests)
  int64_t image_cache_bytes = 64 << 20;  // image-embedding cache (encoder rows by image hash)
  // Expert parallelism: this engine is rank `ep->layout.rank` of an EP group. A step is
  // dispatched, computed and completed within one step() call (a failed exchange fails the
  // step that ran it, and the lockstep step number is exactly steps_started()); with
  // async_scheduling the forward pass runs on the compute thread while the next step is
  // planned, and that plan is fitted and dispatched by the next step() call.
  struct ep_config {
    ep_layout layout;
    std::shared_ptr<expert_transport> transport;
    ep_frame_limits limits;
    int64_t load_window_steps = 1'000;  // steps the routed-load statistics cover
    // With `experts`: expert weights move between processes over this (expert_migration.hpp);
    // null: a rank reads the experts it gains from the checkpoint.
    std::shared_ptr<runtime::transport> bulk;
    std::chrono::milliseconds fetch_timeout{60'000};  // one expert's read from its holder
    // A rank with no experts to compute with yet (the group's first placement) waits this
    // long for them, then fails the step naming what is missing (the reads go on).
    std::chrono::milliseconds ready_timeout{10'000};
    // The group's events for the node log, on the engine's thread: a group adopted, its
    // placement agreed, the first failed step after good ones (with why), 8, 16, 32, ... failed
    // in a row, and the first good step after failed ones. Null: none.
    std::function<void(const std::string&)> notice;
  };
  std::optional<ep_config> ep;
  // With ep: the process's routed experts in memory, when its weights were loaded without
  // them (expert_residency.hpp). Before each lockstep step the engine holds the experts of
  // its current layout (read from the checkpoint when the layout changed). Null: the weights
  // hold every expert.
  std::shared_ptr<expert_residency> experts;
  // DSpark speculative decoding (MTP drafts verified each step). Needs a model with MTP
  // modules and a config that passes validate(spec, max_backtrack(model, cache)); not with role
  // prefill (node_config refuses it), nor self_draft under expert parallelism. With
  // async_scheduling the next step is planned while this one computes as if no draft were
  // accepted; once it completed, the plan is fitted to the accepted count (scheduler::refit)
  // and the drafts (made by the MTP after acceptance) are added: only that part is exposed.
  // Under expert parallelism the draft passes are part of each lockstep step (set_draft_depth).
  spec_config spec;
  // The step-cost model: `cost_source` says where sched.cost came from (a file's path, for
  // stats). Without sched.cost and with cost_fit.enabled, the engine fits one from its own
  // steps (runtime::cost_fitter) and from then on sizes prefill chunks to cost_fit.step_budget_s;
  // `fitted` is called once with the model (shoald keeps it in its state directory).
  std::string cost_source;
  struct cost_fit_config {
    bool enabled = false;
    int64_t min_samples = 16;
    double step_budget_s = 0.05;
    std::function<void(const cost_model&)> fitted;
    // Also fit decode steps (stats().decode_cost, the decode balancer's weights) from
    // 4 × min_samples decode-only steps, whatever sizes the prefill chunks.
    bool decode = false;
  };
  cost_fit_config cost_fit;
};

struct completion {
  request_id id;
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
  std::string text;            // detokenised output (when the engine has a tokenizer)
  finish_reason reason = finish_reason::none;
  int64_t cached_tokens = 0;
};

class engine {
 public:
  engine(std::shared_ptr<const model::model_weights> weights, const engine_config& config,
         std::shared_ptr<const model::tokenizer> tok = nullptr);
  ~engine();
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  // Validates and queues a request. seq_seed: the seed of its sampling stream (defaults to
  // params.seed, else the request id).
  // cls: the storage TTL class of the blocks it writes back. Stop strings need the engine's
  // tokenizer (refused without one): the engine detokenises as it samples and finishes a
  // request at the first match.
  // images: the prompt's (check_prompt_images); their encoder rows replace the placeholder
  // tokens' embeddings, computed when a step first reaches them (or from the embedding cache).
  // Images whose rows a vision-encoder worker holds (prompt_image::rows, their length checked
  // here) are read with engine_config::bulk first: the request waits for those reads outside
  // the scheduler (counted in waiting_for_remote), and an image whose read fails is encoded
  // here. Without a transport the rows are not read and the engine encodes.
  // id: the caller's (the gateway's in a cluster): events, handoffs and stats carry it
  // unchanged. Refused with errc::duplicate while this engine still holds a request `id`
  // (until forget()); errc::invalid_argument names what is wrong with the request.
  // resumed: output tokens the client already has (a request re-routed from a failed engine):
  // the engine prefills prompt ++ resumed and samples from output position resumed.size() on,
  // as the first engine would have (the sampler is counter-based; grammar, stop strings,
  // penalties and max_tokens count them), and emits only what follows. Fewer than max_tokens.
  std::expected<request_id, error> add_request(request_id id, std::vector<int32_t> prompt,
                                               const sampling_params& params, traffic_class cls = traffic_class::chat,
                                               std::vector<prompt_image> images = {},
                                               std::span<const int32_t> resumed = {});
  // The same with the next id this engine has not seen (for callers that do not number
  // their requests: the offline runner, benches).
  std::expected<request_id, error> add_request(std::vector<int32_t> prompt, const sampling_params& params,
                                               traffic_class cls = traffic_class::chat,
                                               std::vector<prompt_image> images = {}) {
    return add_request(request_id(next_id_), std::move(prompt), params, cls, std::move(images));
  }
  bool abort(request_id id);

  // Handoff, prefill side: requests that sampled their first token since the last call, their
  // caches pinned for a decode engine to read (the first token's event was already returned).
  std::vector<handoff_state> take_handoffs();
  // A decode engine took `id` (it finishes here as handed_off and its caches are released) or
  // refused / failed to (it continues here, colocated). False for an unknown id.
  bool handoff_done(request_id id, bool taken);
  // Handoff, decode side: validates `s` (it comes from another process), reserves blocks and
  // starts reading its cache; the request then continues exactly as on the prefill engine (a
  // failed read recomputes it from its tokens), under its id s.id. Errors: errc::no_room
  // (nothing reserved: ask another engine), errc::duplicate, errc::unavailable (no transport)
  // or errc::invalid_argument naming what is wrong with `s`.
  std::expected<request_id, error> add_handoff(const handoff_state& s);
  // Handoff, decode side: requests whose reads are over since the last call (imported, or
  // failed and queued to recompute): their prefill engines' leases can end.
  std::vector<request_id> take_imports_over() { return sched_.take_imports_over(); }
  // Free blocks a decode engine needs to take `s` (its cache and one block to decode into).
  int64_t handoff_blocks_needed(const handoff_state& s) const { return caches_.blocks_for(s.computed) + 1; }
  engine_role role() const { return config_.role; }
  // One step. In EP mode always one lockstep step of the group (an empty one when nothing is
  // planned). When the group's exchange fails (ep_error: peer lost, timeout, bad frame) every
  // request of the step finishes with finish_reason::error (an event each, token −1), its
  // blocks are freed and nothing of the step is registered in the prefix cache; the engine
  // stays usable and last_error() says what happened.
  std::vector<token_event> step();
  bool has_work() const;
  // The last step() planned nothing and nothing computes, though work is queued: every
  // request waits for the remote tier, or for blocks those waits hold (has_work() stays true
  // while a read the engine gave up on still holds pool blocks). The caller should
  // step again a little later instead of at once.
  bool stalled() const { return stalled_; }
  // Runs until every queued request finished; returns completions in request order. Not for
  // EP ranks: the group steps together, so each rank calls step() in lockstep instead.
  std::vector<completion> run_to_completion();
  completion result(request_id id) const;
  // Prompt tokens request `id` got from the prefix cache at its last admission.
  int64_t cached_tokens(request_id id) const { return requests_.at(id.value)->cached_tokens; }
  void forget(request_id id);

  engine_stats stats() const;
  // shoal_flash: the SWA slot store this engine saves into (the machine's when configured).
  const std::shared_ptr<swa_store>& slot_store() const { return caches_.swa().store(); }
  // Seconds of the last (≤ 1024) SWA slot fetches from other machines, oldest first.
  std::vector<double> swa_fetch_seconds() const { return caches_.swa_fetch_seconds(); }
  // EP: lockstep steps begun since the last group change (the actor layer compares it with
  // the group's step number); without EP, completed steps.
  uint64_t steps_started() const;
  bool expert_parallel() const { return ep_ != nullptr; }
  // EP, between steps: a new group (the survivors after a loss, or with a rank back). The
  // step counter restarts at 0. moved[o]: this rank's new rank for rank o of its previous
  // group (−1: gone); empty: this rank brings no placement. The group agrees its placement
  // before its first step (ep_moe_exchange::agree_group): survivors keep their experts.
  void set_ep_group(ep_layout layout, std::shared_ptr<expert_transport> transport, std::vector<int32_t> moved = {});
  // EP, between steps: the group's next expert placement (the balancer's plan, offered to
  // every rank), with where the experts this rank gains can be read (their holders' lent
  // descriptions, expert_migration.hpp). The engine keeps stepping on the current placement
  // while those reads run; once they ended it holds the experts of both placements (reading
  // from the checkpoint what no holder described or what failed to arrive), then the group
  // switches in band at a step boundary (expert_parallel.hpp). An error when one is still
  // being adopted or it does not fit; a description that does not fit this model is an
  // error too, but the offer stands (those experts come from the checkpoint). Codes:
  // ep_moe_exchange::offer's, then expert_residency::fetch's.
  runtime::result<void> offer_placement(std::shared_ptr<const ep_placement> next,
                                        const std::vector<expert_part>& sources = {});
  // EP with partitioned weights and a bulk transport, between steps or not: describes the
  // experts (slot, expert) this process holds for placement `epoch`'s migration.
  runtime::result<std::vector<expert_part>> lend_experts(
      uint64_t epoch, const std::vector<std::pair<int32_t, int32_t>>& experts, std::chrono::milliseconds lease);
  // The same as a job for another thread (registering and checksumming the lent weights
  // takes time proportional to their bytes; the residency is thread-safe): an error at once
  // when this engine cannot lend (errc::unavailable); the job's are expert_residency::lend's.
  using lend_job = std::function<runtime::result<std::vector<expert_part>>()>;
  runtime::result<lend_job> prepare_lend(uint64_t epoch, std::vector<std::pair<int32_t, int32_t>> experts,
                                         std::chrono::milliseconds lease) const;
  // EP: the exchange's placement, load window and counters (null without EP).
  const ep_moe_exchange* expert_exchange() const { return ep_.get(); }
  // EP with partitioned weights: the process's routed experts (null otherwise).
  const expert_residency* expert_residency_of() const { return config_.experts.get(); }
  // The error of the last failed step ("" when none failed yet).
  const std::string& last_error() const { return last_error_; }
  const model::model_config& config() const { return weights_->config; }
  model::compute_backend& backend() const { return *backend_; }
  const model::tokenizer* tokenizer() const { return tok_.get(); }

 private:
  struct in_flight_step {
    step_plan plan;
    std::vector<model::forward_item> items;
    std::vector<std::vector<model::input_rows>> inputs;  // per item: image rows of its run
    std::vector<embedding_cache::rows> rows;             // keeps those rows alive
    std::vector<std::vector<int32_t>> verify_tokens;     // per item: t_c ++ drafts (speculation)
    model::forward_output output;
    double forward_s = 0;  // the forward pass's seconds (exchanges included)
    double started = 0;    // when it was dispatched
    bool verifies = false; // spec_mode::automatic: this step verified drafts (and will draft)
  };
  void learn_cost(const in_flight_step& f);  // cost_fit: one step's sample
  static std::optional<cost_model> sample_cost(cost_fitter& fitter, cost_stats& stats, int64_t needed, const char* what,
                                               int64_t n, int64_t p, double seconds);
  int64_t decode_fit_samples() const { return 4 * config_.cost_fit.min_samples; }
  embedding_cache::rows image_rows(const prompt_image& im);
  // Encoder rows being read from a vision-encoder worker, by image hash; `settled` once the
  // rows went to the embedding cache (or the failure was counted).
  struct rows_read {
    std::shared_ptr<transfer> t;
    std::vector<float> rows;
    bool settled = false;
  };
  struct awaiting_rows {
    request* r;
    std::vector<std::shared_ptr<rows_read>> reads;
  };
  std::expected<void, error> check_request(request_id id, const std::vector<int32_t>& prompt,
                                           const sampling_params& params, traffic_class cls,
                                           const std::vector<prompt_image>& images) const;
  std::expected<void, error> check_resumed(std::span<const int32_t> resumed, const sampling_params& params) const;
  std::expected<std::vector<const prompt_image*>, error> rows_to_read(const std::vector<prompt_image>& images) const;
  // Settles the reads that are over and queues the requests none of whose reads is still out.
  void poll_rows();
  void dispatch(step_plan plan);
  step_plan plan_now();
  step_plan take_planned();
  void plan_ahead();
  void drop_planned();
  // Speculation: verify lengths for the plan's decodes (more blocks taken for them), the
  // verification of one item's logits rows, and the next drafts of the step's requests.
  bool speculates(const request& r) const;
  // Whether this step's completion makes drafts (speculating, and not spec_mode::automatic
  // verifying none).
  bool drafts_wanted() const;
  void drop_drafts(const std::vector<request*>& ready, const std::vector<size_t>& advanced, const std::string& why);
  void draft_next(std::vector<request*>& drafting, const in_flight_step& f, const std::vector<token_event>& events);
  // spec_mode::automatic: whether this step verifies (and drafts for the next), from the
  // measured tokens per second of both choices at this concurrency; auto_measure records one.
  bool auto_verifies(const step_plan& plan);
  void auto_measure(const in_flight_step& f, size_t tokens);
  void add_drafts(step_plan& plan);
  int64_t verify(request& r, std::span<const float> rows, int64_t n_rows, std::vector<token_event>& events);
  bool emit(request& r, int32_t token, std::span<const float> logits, std::vector<token_event>& events);
  void draft(std::vector<request*>& rs);
  void self_draft(const std::vector<request*>& rs, const model::forward_options& fo, std::vector<size_t>& advanced);
  std::span<const float> grammar_masked(request& r, std::span<const float> logits, std::vector<float>& scratch);
  void advance_grammar(request& r, int32_t token, size_t& advanced);
  std::vector<token_event> step_ep();
  std::vector<token_event> fail_step(const std::string& why);
  // Expert parallelism: counts a failed / good step, telling ep_config::notice when a run of
  // failures begins or ends; ep_notice prefixes the rank and step.
  void step_failed(const std::string& why);
  void step_succeeded();
  void ep_notice(const std::string& what) const;
  std::vector<token_event> complete();
  void run_forward();
  void launch();
  void wait_done();

  std::shared_ptr<const model::model_weights> weights_;
  engine_config config_;
  std::shared_ptr<const model::tokenizer> tok_;
  std::shared_ptr<model::compute_backend> backend_;  // before caches_: it makes their pages
  cache_manager caches_;
  scheduler sched_;
  std::unordered_map<int64_t, std::unique_ptr<request>> requests_;
  std::unordered_map<int64_t, std::string> texts_;
  bool stalled_ = false;
  // A failed EP step's requests stay to be computed again once after each group change (or
  // start); a second failure in the same group ends them (fail_step).
  bool may_recompute_ = true;
  void offer_handoff(request& r);
  std::unique_ptr<registered_memory> pool_reg_;  // the block pool, registered once (prefill)
  std::unordered_map<int64_t, std::vector<std::unique_ptr<registered_memory>>> leases_;  // ring registrations
  std::vector<handoff_state> handoffs_;
  int64_t next_id_ = 0;  // above every id seen (add_request without one)
  std::optional<in_flight_step> flight_;
  std::optional<step_plan> planned_;  // the next step, planned while this one computed (async)
  engine_stats stats_;
  std::unique_ptr<ep_moe_exchange> ep_;
  // The (placement, offered) pair config_.experts holds this engine's experts for.
  // Kept alive here, so a new placement never compares equal to a freed one.
  std::pair<std::shared_ptr<const ep_placement>, std::shared_ptr<const ep_placement>> held_for_;
  std::string last_error_;
  uint64_t failing_since_ = 0;  // failed_steps when the current run of failed steps began (+1); 0: none
  embedding_cache images_;
  std::map<embedding_cache::key, std::shared_ptr<rows_read>> rows_reads_;
  // Structured output: the vocabulary as bytes (from tok_, on first use) and the compiled
  // grammars with their mask caches, by constraint (at most 64 kept).
  std::shared_ptr<const token_vocab> vocab_;
  std::vector<float> masked_;  // a masked copy of one position's logits
  std::map<std::pair<uint8_t, std::string>, std::shared_ptr<compiled_grammar>> grammars_;
  // A matcher for `params.constraint` that has taken `output` (generated tokens so far).
  std::expected<std::shared_ptr<grammar_matcher>, std::string> make_matcher(const sampling_params& params,
                                                                           std::span<const int32_t> output);
  std::vector<awaiting_rows> awaiting_rows_;
  acceptance_estimate acceptance_;
  auto_verify auto_;  // spec_mode::automatic (its prior from spec.auto_from)
  cost_fitter fitter_;        // engine_config::cost_fit
  bool cost_fitted_ = false;
  cost_fitter decode_fitter_;  // engine_config::cost_fit.decode
  bool decode_fitted_ = false;
  int64_t draft_context_ = 0;

  // compute thread (async scheduling)
  std::unique_ptr<forward_worker> worker_;  // the compute thread (async scheduling)
  double last_done_ = -1;  // clock of the last forward end, for idle accounting
};

}  // namespace shoal::runtime
