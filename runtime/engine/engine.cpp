// Step loop of the engine: plan → dispatch (attach blocks, build forward items) → forward
// (inline, or on the compute thread) → complete (sample, stop checks, commit caches,
// finish). In async mode the next plan is made while the forward pass runs.
#include "runtime/engine/engine.hpp"

#include "model/vision.hpp"
#include "runtime/ep/expert_residency.hpp"
#include "runtime/structured/grammar.hpp"
#include "runtime/vision/image.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include <malloc.h>

#include "kernels/assert.hpp"
#include "runtime/base/clock.hpp"

namespace shoal::runtime {
namespace {

double now_s() { return default_clock()->now_s(); }

// The stats of a step-cost model in use: where it came from, its fit, its coefficients.
cost_stats cost_stats_of(std::string source, std::string detail, const cost_model& m) {
  return {std::move(source), std::move(detail), m.quality().samples, m.quality().r2, m.quality().rms_rel_error,
          {m.a(), m.b(), m.c(), m.d()}};
}

// The engine's backend: the one given, else engine.device's over the weights (an unknown
// device is the caller's error: node_config and the tools check it first).
std::shared_ptr<model::compute_backend> backend_for(const engine_config& c,
                                                    const std::shared_ptr<const model::model_weights>& w) {
  if (c.backend) return c.backend;
  auto b = model::make_backend(c.device, w);
  SHOAL_ASSERT(b.has_value());
  return std::move(*b);
}

// The cache config with its paged memory made by the backend.
cache_config with_pages(cache_config c, model::compute_backend& b, const model::model_config& m) {
  if (c.payload && !c.pages) c.pages = b.create_kv(model::kv_format_of(m, c.kv_dtype), static_cast<int32_t>(c.num_blocks));
  return c;
}

}  // namespace

engine::engine(std::shared_ptr<const model::model_weights> weights, const engine_config& config,
               std::shared_ptr<const model::tokenizer> tok)
    : weights_(std::move(weights)), config_(config), tok_(std::move(tok)), backend_(backend_for(config, weights_)),
      caches_(weights_->config, with_pages(config.cache, *backend_, weights_->config)), sched_(config.sched, caches_),
      images_(config.image_cache_bytes), auto_(config.spec.auto_from) {
  // Step buffers are large and short-lived: keep freed memory in the process instead of
  // returning it to the kernel, so each step does not page-fault its buffers in again.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // the largest value glibc accepts
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  if (config_.spec.mode != spec_mode::off) {
    // A bad spec_config is the caller's error (engine_setup and shoald validate it first).
    SHOAL_ASSERT(!validate(config_.spec, max_backtrack(weights_->config, config_.cache)));
    SHOAL_ASSERT(!weights_->mtp.empty() && config_.role != engine_role::prefill);
    SHOAL_ASSERT(!(config_.ep && config_.spec.self_draft));  // self-drafting needs every expert here
    const model::model_config& c = weights_->config;
    draft_context_ = config_.spec.draft_context > 0 ? config_.spec.draft_context : (c.is_flash() ? c.window() : 64);
  }
  if (config_.sched.cost) {
    stats_.cost = cost_stats_of("file", config_.cost_source, *config_.sched.cost);
  } else if (config_.cost_fit.enabled) {
    fitter_ = cost_fitter(config_.cost_fit.min_samples);
    stats_.cost.detail = "collecting 0/" + std::to_string(config_.cost_fit.min_samples) + " steps";
  }
  if (config_.cost_fit.decode) decode_fitter_ = cost_fitter(decode_fit_samples());
  if (config_.ep) {
    ep_ = std::make_unique<ep_moe_exchange>(weights_, backend_, config_.ep->layout, config_.ep->transport,
                                            config_.batch_invariant, config_.ep->limits);
    ep_->set_load_window(config_.ep->load_window_steps);
    if (config_.spec.mode != spec_mode::off) ep_->set_draft_depth(config_.spec.nextn);
  }
  if (config_.role == engine_role::prefill) {
    SHOAL_ASSERT(config_.bulk);  // engine_config::bulk is required for role prefill (caller's error)
    auto reg = config_.bulk->register_memory(caches_.pages()->memory());
    SHOAL_ASSERT(reg.has_value());
    pool_reg_ = std::move(*reg);
  }
  worker_ = std::make_unique<forward_worker>(config_.async_scheduling, [this] { run_forward(); });
}

engine::~engine() {
  if (config_.experts) config_.experts->release(this);
  for (auto& [hash, rr] : rows_reads_) rr->t->wait();  // their buffers are the reads' destinations
  worker_.reset();
}

// Everything about a request that can be wrong but its constraint, checked before anything
// changes.
std::expected<void, error> engine::check_request(request_id id, const std::vector<int32_t>& prompt,
                                                 const sampling_params& params, traffic_class cls,
                                                 const std::vector<prompt_image>& images) const {
  if (!id.valid()) return fail(errc::invalid_argument, "request id must be >= 0");
  if (requests_.contains(id.value))
    return fail(errc::duplicate, "request " + to_string(id) + " is still held by this engine");
  if (!traffic_class_from_byte(static_cast<uint8_t>(cls)))
    return fail(errc::invalid_argument, "traffic class " + std::to_string(static_cast<int>(cls)) + " is not 0 (agent) or 1 (chat)");
  if (!params.stop_strings.empty() && !tok_)
    return fail(errc::unavailable, "stop strings need a tokenizer, and this engine has none");
  const model::model_config& c = weights_->config;
  if (prompt.empty()) return fail(errc::invalid_argument, "prompt is empty");
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= c.vocab_size)
      return fail(errc::invalid_argument, "prompt token " + std::to_string(i) + " (id " + std::to_string(prompt[i]) +
                             ") is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  if (auto bad = validate(params, c.vocab_size)) return fail(errc::invalid_argument, *bad);
  if (auto why = check_prompt_images(c.vision, prompt, images); !why.empty()) return fail(errc::invalid_argument, why);
  int64_t total = static_cast<int64_t>(prompt.size()) + params.max_tokens;
  if (c.max_position_embeddings > 0 && total > c.max_position_embeddings)
    return fail(errc::invalid_argument, "prompt (" + std::to_string(prompt.size()) + ") + max_tokens (" +
                           std::to_string(params.max_tokens) + ") exceeds the context length " +
                           std::to_string(c.max_position_embeddings));
  if (caches_.blocks_for(total) > caches_.pool().num_blocks())
    return fail(errc::invalid_argument, "request needs " + std::to_string(caches_.blocks_for(total)) +
                           " cache blocks; the engine has " + std::to_string(caches_.pool().num_blocks()));
  return {};
}

// A re-routed request's output so far: tokens of the vocabulary, fewer than max_tokens, none
// that would have ended it (a stop token; a stop string is the client's to find).
std::expected<void, error> engine::check_resumed(std::span<const int32_t> resumed, const sampling_params& params) const {
  if (resumed.empty()) return {};
  const int64_t V = weights_->config.vocab_size;
  if (static_cast<int64_t>(resumed.size()) >= params.max_tokens)
    return fail(errc::invalid_argument, "resumed output has " + std::to_string(resumed.size()) +
                                          " tokens; max_tokens is " + std::to_string(params.max_tokens));
  const stop_checker stop(params, static_cast<int32_t>(weights_->config.eos_token_id));
  for (size_t i = 0; i < resumed.size(); ++i) {
    if (resumed[i] < 0 || resumed[i] >= V)
      return fail(errc::invalid_argument, "resumed output token " + std::to_string(i) + " (id " +
                                            std::to_string(resumed[i]) + ") is outside the vocabulary [0, " +
                                            std::to_string(V) + ")");
    if (stop.is_stop_token(resumed[i]))
      return fail(errc::invalid_argument, "resumed output token " + std::to_string(i) + " (id " +
                                            std::to_string(resumed[i]) + ") is a stop token");
  }
  return {};
}

// The images whose rows a vision-encoder worker holds and this engine has not cached: read
// before the request steps (checked first, so a refused request starts no read).
std::expected<std::vector<const prompt_image*>, error> engine::rows_to_read(const std::vector<prompt_image>& images) const {
  std::vector<const prompt_image*> out;
  if (!config_.bulk) return out;
  const int64_t d = weights_->config.hidden_size;
  for (size_t i = 0; i < images.size(); ++i) {
    const prompt_image& im = images[i];
    if (im.rows.owner.empty() || images_.contains(im.hash)) continue;
    const uint64_t want = static_cast<uint64_t>(im.count) * static_cast<uint64_t>(d) * sizeof(float);
    if (im.rows.length != want)
      return fail(errc::invalid_argument, "image " + std::to_string(i + 1) + ": its encoder rows are " +
                             std::to_string(im.rows.length) + " bytes; " + std::to_string(im.count) + " rows of " +
                             std::to_string(d) + " floats are " + std::to_string(want));
    out.push_back(&im);
  }
  return out;
}

std::expected<request_id, error> engine::add_request(request_id id, std::vector<int32_t> prompt,
                                                     const sampling_params& params, traffic_class cls,
                                                     std::vector<prompt_image> images,
                                                     std::span<const int32_t> resumed) {
  if (auto ok = check_request(id, prompt, params, cls, images); !ok) return std::unexpected(ok.error());
  if (auto ok = check_resumed(resumed, params); !ok) return std::unexpected(ok.error());
  std::shared_ptr<grammar_matcher> matcher;
  if (params.constraint.active()) {
    auto m = make_matcher(params, resumed);
    if (!m) return fail(tok_ ? errc::invalid_argument : errc::unavailable, m.error());
    matcher = std::move(*m);
  }
  auto to_read = rows_to_read(images);
  if (!to_read) return std::unexpected(to_read.error());
  awaiting_rows wait{nullptr, {}};
  for (const prompt_image* im : *to_read) {
    auto& rr = rows_reads_[im->hash];
    if (!rr) {  // one read per image, shared by the requests that carry it
      rr = std::make_shared<rows_read>();
      rr->rows.resize(static_cast<size_t>(im->rows.length / sizeof(float)));
      rr->t = config_.bulk->read(im->rows, std::as_writable_bytes(std::span<float>(rr->rows)),
                                 config_.handoff_read_timeout);
    }
    wait.reads.push_back(rr);
  }
  auto r = std::make_unique<request>();
  r->id = id;
  next_id_ = std::max(next_id_, id.value + 1);
  r->prompt_len = static_cast<int64_t>(prompt.size());
  r->tokens = std::move(prompt);
  r->tokens.insert(r->tokens.end(), resumed.begin(), resumed.end());
  r->resumed = static_cast<int64_t>(resumed.size());
  if (tok_ && !resumed.empty()) {  // the output text the stop strings search, as emit() builds it
    std::string& text = texts_[id.value];
    for (int32_t t : resumed) text += tok_->decode_token(t);
  }
  r->images = std::move(images);  // the pointers in to_read were used above: the vector moves now
  r->params = params;
  r->cls = cls;
  r->seq_seed = sequence_seed(params, static_cast<uint64_t>(r->id.value));
  r->matcher = std::move(matcher);
  request* raw = r.get();
  requests_[r->id.value] = std::move(r);
  if (wait.reads.empty()) {
    sched_.add(raw);
  } else {
    wait.r = raw;
    awaiting_rows_.push_back(std::move(wait));
  }
  return raw->id;
}

void engine::poll_rows() {
  for (auto it = rows_reads_.begin(); it != rows_reads_.end();) {
    rows_read& rr = *it->second;
    if (rr.t->done() && !rr.settled) {
      rr.settled = true;
      if (rr.t->ok()) {
        images_.put(it->first, std::make_shared<const std::vector<float>>(std::move(rr.rows)));
        ++stats_.image_rows_read;
      } else {
        ++stats_.image_row_read_failures;  // image_rows() encodes it when a step reaches it
      }
    }
    it = rr.settled ? rows_reads_.erase(it) : std::next(it);
  }
  std::erase_if(awaiting_rows_, [&](const awaiting_rows& a) {
    if (!std::ranges::all_of(a.reads, [](const auto& rr) { return rr->settled; })) return false;
    sched_.add(a.r);
    return true;
  });
}

bool engine::abort(request_id id) {
  auto it = requests_.find(id.value);
  if (it == requests_.end() || it->second->status == request_status::finished) return false;
  request* r = it->second.get();
  if (auto a = std::ranges::find(awaiting_rows_, r, &awaiting_rows::r); a != awaiting_rows_.end()) {
    awaiting_rows_.erase(a);  // its reads go on (other requests, the cache): only it leaves
    r->finish = finish_reason::aborted;
    r->status = request_status::finished;
    return true;
  }
  if (flight_)  // a request in the running step finishes after it
    for (auto& item : flight_->plan.items)
      if (item.req == r) {
        r->abort_requested = true;
        return true;
      }
  r->finish = finish_reason::aborted;
  leases_.erase(id.value);
  sched_.finish(r);
  if (planned_) sched_.prune(*planned_);  // its planned chunk's blocks go back too
  return true;
}

bool engine::has_work() const {
  // Reads no request waits on any more still hold blocks: polled until the tier lets go.
  return sched_.running() + sched_.waiting() + sched_.remote_reads_out() + sched_.importing() > 0 ||
         flight_.has_value() || !awaiting_rows_.empty() || !rows_reads_.empty();
}

std::expected<std::shared_ptr<grammar_matcher>, std::string> engine::make_matcher(const sampling_params& params,
                                                                                  std::span<const int32_t> output) {
  const constraint_spec& spec = params.constraint;
  if (!tok_) return std::unexpected("structured output needs a tokenizer, and this engine has none");
  if (!constraint_kind_from_byte(static_cast<uint8_t>(spec.kind)))
    return std::unexpected("unknown constraint kind " + std::to_string(static_cast<int>(spec.kind)));
  if (!vocab_)
    vocab_ = make_token_vocab(*tok_, static_cast<int32_t>(weights_->config.vocab_size),
                              static_cast<int32_t>(weights_->config.eos_token_id));
  auto key = std::make_pair(static_cast<uint8_t>(spec.kind), spec.source);
  auto it = grammars_.find(key);
  if (it == grammars_.end()) {
    auto compiled = compile_for(spec, vocab_);
    if (auto* e = std::get_if<grammar_error>(&compiled))
      return std::unexpected(std::string(to_string(spec.kind)) + ": " + e->text());
    if (grammars_.size() >= 64) grammars_.erase(grammars_.begin());
    it = grammars_.emplace(std::move(key), std::get<std::shared_ptr<compiled_grammar>>(std::move(compiled))).first;
  }
  auto m = std::make_shared<grammar_matcher>(it->second);
  for (size_t i = 0; i < output.size(); ++i)
    if (!m->accept_token(output[i]))
      return std::unexpected("output token " + std::to_string(i) + " (id " + std::to_string(output[i]) +
                             ") does not match the " + to_string(spec.kind) + " constraint");
  return m;
}

embedding_cache::rows engine::image_rows(const prompt_image& im) {
  if (auto hit = images_.get(im.hash)) return hit;
  auto rows = std::make_shared<const std::vector<float>>(
      backend_->encode_image(im.pixels->rgb, im.pixels->width, im.pixels->height, config_.batch_invariant));
  images_.put(im.hash, rows);
  ++stats_.images_encoded;
  stats_.image_patches_encoded += static_cast<uint64_t>(im.count);
  return rows;
}

void engine::dispatch(step_plan plan) {
  in_flight_step f;
  f.started = now_s();
  f.verifies = stats_.spec.auto_verifying;
  f.plan = std::move(plan);
  f.inputs.resize(f.plan.items.size());
  f.verify_tokens.resize(f.plan.items.size());
  for (size_t k = 0; k < f.plan.items.size(); ++k) {
    auto& it = f.plan.items[k];
    request* r = it.req;
    caches_.attach(*r, it.new_blocks);
    it.base = r->computed();
    for (const prompt_image& im : r->images)  // images this run reaches: their encoder rows
      if (im.pos < it.base + it.n_tokens && im.pos + im.count > it.base) {
        f.rows.push_back(image_rows(im));
        f.inputs[k].push_back({im.pos, im.count, f.rows.back()->data()});
      }
    model::forward_item fi;
    fi.cache = &r->cache;
    fi.tokens = std::span<const int32_t>(r->tokens).subspan(it.base, it.n_tokens);
    fi.dec_from = r->dec_from;
    fi.blocks_valid_until = r->blocks_valid_until;
    fi.logits = it.base + it.n_tokens == r->num_tokens();
    if (it.drafts > 0) {  // the pending token and the drafts it verifies
      std::vector<int32_t>& vt = f.verify_tokens[k];
      vt.push_back(r->tokens.back());
      vt.insert(vt.end(), r->spec.drafts.begin(), r->spec.drafts.begin() + it.drafts);
      fi.tokens = vt;
      fi.logits = true;
      fi.logit_rows = 1 + it.drafts;
    }
    // Hidden rows only when this step's completion drafts (auto: not while it verifies none).
    fi.hidden = fi.logits && speculates(*r) && drafts_wanted();
    fi.inputs = f.inputs[k];
    f.items.push_back(fi);
    (it.n_tokens - it.drafts > 1 ? stats_.prefill_tokens : stats_.decode_tokens) += static_cast<uint64_t>(it.n_tokens);
  }
  flight_ = std::move(f);
}

void engine::run_forward() {
  model::forward_options fo{config_.batch_invariant, config_.naive_prefill, ep_.get()};
  double t0 = now_s();
  if (last_done_ >= 0) stats_.idle_s += t0 - last_done_;
  flight_->output = backend_->forward(flight_->items, fo);
  last_done_ = now_s();
  flight_->forward_s = last_done_ - t0;
  stats_.forward_s += last_done_ - t0;
}

void engine::launch() { worker_->launch(); }

void engine::wait_done() { worker_->wait(); }

bool engine::speculates(const request&) const { return config_.spec.mode != spec_mode::off; }

bool engine::drafts_wanted() const {
  return config_.spec.mode != spec_mode::off &&
         (config_.spec.mode != spec_mode::automatic || stats_.spec.auto_verifying);
}

// The next step's drafts of the requests that decoded; spec_mode::automatic makes none while it
// verifies none, and measures the step.
void engine::draft_next(std::vector<request*>& drafting, const in_flight_step& f,
                        const std::vector<token_event>& events) {
  const bool wanted = drafts_wanted();
  if (!drafting.empty() && wanted) draft(drafting);
  if (!wanted)  // the MTP chain's incremental state skips these steps: it restarts from the hidden rows
    for (request* r : drafting) {
      r->spec.mtp = {};
      r->spec.drafts.clear();
      r->spec.drafted_at = -1;
    }
  if (config_.spec.mode == spec_mode::automatic)
    auto_measure(f, static_cast<size_t>(std::count_if(events.begin(), events.end(),
                                                      [](const token_event& e) { return e.token >= 0; })));
}

// Emits `token` (drawn from the raw logits row `logits`): grammar, text, stop checks, the
// event. True when r goes on.
bool engine::emit(request& r, int32_t token, std::span<const float> logits, std::vector<token_event>& events) {
  // The mask allowed only tokens the matcher takes; one it refuses would desynchronise the
  // output from its grammar, so it ends the request (never expected).
  const bool grammar_refused = r.matcher && !r.matcher->accept_token(token);
  const bool grammar_done = r.matcher && !grammar_refused && r.matcher->terminated();
  r.tokens.push_back(token);
  std::string& text = texts_[r.id.value];
  const size_t before = text.size();
  if (tok_) text += tok_->decode_token(token);
  stop_checker stop(r.params, static_cast<int32_t>(weights_->config.eos_token_id));
  // Only the newest piece can complete a match: search from where one could start.
  const size_t from = before >= stop.longest_stop() ? before - stop.longest_stop() + 1 : 0;
  stop_result sr = stop.check(std::span<const int32_t>(r.tokens).subspan(static_cast<size_t>(r.prompt_len)),
                              text, stop.longest_stop() ? from : 0);
  if (sr.truncate_at) text.resize(*sr.truncate_at);
  if (grammar_done && sr.reason == finish_reason::none) sr.reason = finish_reason::stop;  // nothing may follow
  if (grammar_refused) sr.reason = finish_reason::error;
  ++stats_.generated;
  const bool finished = sr.reason != finish_reason::none;
  events.push_back({r.id, token, finished, sr.reason, finished ? static_cast<int32_t>(r.cached_tokens) : 0});
  if (config_.capture_logits) events.back().logits.assign(logits.begin(), logits.end());
  if (r.params.logprobs >= 0) events.back().logprobs = logprobs_of(logits, token, r.params.logprobs);
  if (sr.reason != finish_reason::none) r.finish = sr.reason;
  return sr.reason == finish_reason::none;
}

std::vector<token_event> engine::complete() {
  std::vector<token_event> events;
  in_flight_step& f = *flight_;
  learn_cost(f);
  const int64_t V = weights_->config.vocab_size, d = weights_->config.hidden_size;
  size_t row = 0;
  std::vector<request*> drafting;
  for (size_t i = 0; i < f.items.size(); ++i) {
    request* r = f.plan.items[i].req;
    if (f.items[i].logits) {
      const int64_t n_rows = f.items[i].logit_rows;
      const size_t before = r->tokens.size();
      const int64_t accepted = verify(*r, {f.output.logits.data() + row * V, static_cast<size_t>(n_rows * V)}, n_rows, events);
      row += static_cast<size_t>(n_rows);
      if (speculates(*r) && f.plan.items[i].n_tokens - f.plan.items[i].drafts == 1) {  // a decode step
        ++stats_.spec.decode_steps;
        stats_.spec.verified += static_cast<uint64_t>(n_rows - 1);
        stats_.spec.accepted += static_cast<uint64_t>(accepted);
        stats_.spec.emitted += static_cast<uint64_t>(r->tokens.size() - before);
        if (!config_.spec.synthetic && n_rows > 1) acceptance_.record(n_rows - 1, accepted);
      }
    }
    if (f.plan.items[i].drafts > 0) {  // roll back to the accepted tokens: rejected entries are rewritten later
      auto& sp = r->spec;
      sp.ring_written = std::max(sp.ring_written, r->cache.computed);
      r->cache.computed = std::min(r->cache.computed, r->num_tokens() - 1);
    }
    if (f.items[i].hidden) {  // keep the last draft_context hidden rows of accepted positions
      auto& sp = r->spec;
      const std::vector<float>& h = f.output.hidden[i];
      const int64_t from = f.output.hidden_from[i];
      const int64_t end = std::min(from + static_cast<int64_t>(h.size()) / d, r->computed());
      if (end > from) {
        if (sp.hidden_from + static_cast<int64_t>(sp.hidden.size()) / d != from) {
          sp.hidden.clear();
          sp.hidden_from = from;
        }
        sp.hidden.insert(sp.hidden.end(), h.begin(), h.begin() + (end - from) * d);
        const int64_t extra = static_cast<int64_t>(sp.hidden.size()) / d - draft_context_;
        if (extra > 0) {
          sp.hidden.erase(sp.hidden.begin(), sp.hidden.begin() + extra * d);
          sp.hidden_from += extra;
        }
      }
    }
    if (r->abort_requested && r->finish == finish_reason::none) {
      r->finish = finish_reason::aborted;
      events.push_back({r->id, -1, true, finish_reason::aborted, {}});
    }
    caches_.commit(*r);
    if (r->finish != finish_reason::none) {
      sched_.finish(r);
    } else if (config_.role == engine_role::prefill && !r->handed_off && f.items[i].logits && r->output_len() == r->resumed + 1) {
      offer_handoff(*r);  // its first token (here) is out: the rest is a decode engine's
    } else if (f.items[i].hidden) {
      drafting.push_back(r);
    }
  }
  draft_next(drafting, f, events);
  ++stats_.steps;
  flight_.reset();
  return events;
}

std::vector<token_event> engine::step() {
  stalled_ = false;
  if (!rows_reads_.empty() || !awaiting_rows_.empty()) poll_rows();
  if (ep_) return step_ep();
  if (!flight_) {
    step_plan p = plan_now();
    stalled_ = p.items.empty() && has_work();
    if (p.items.empty()) return {};
    dispatch(std::move(p));
    launch();
  }
  plan_ahead();
  wait_done();
  std::vector<token_event> events = complete();
  if (planned_) {  // (plan_now fits it: requests that just finished give their blocks back)
    step_plan next = plan_now();
    if (!next.items.empty()) {
      dispatch(std::move(next));
      launch();
    }
  }
  return events;
}

// The next step's plan on the critical path: the one planned ahead, fitted to what the step
// before it did (speculation: how many drafts were accepted), or a fresh one; then this
// step's drafts, which depend on the step before it.
step_plan engine::plan_now() {
  const double t0 = now_s();
  step_plan p = planned_ ? take_planned() : sched_.plan({});
  add_drafts(p);
  const double dt = now_s() - t0;
  stats_.plan_s += dt;
  stats_.plan_exposed_s += dt;
  return p;
}

step_plan engine::take_planned() {
  step_plan p = std::move(*planned_);
  planned_.reset();
  sched_.refit(p);
  if (p.needs_sync) p = sched_.plan({});
  return p;
}

// Async scheduling: the next step is planned while this one computes, from the in-flight view
// (the requests of this step as if it completed with none of its drafts accepted).
void engine::plan_ahead() {
  if (!config_.async_scheduling || !flight_) return;
  const double t0 = now_s();
  planned_ = sched_.plan(flight_->plan.items);
  stats_.plan_s += now_s() - t0;
}

// A plan made ahead that will not run (its step failed, or a request in it is forgotten).
void engine::drop_planned() {
  if (!planned_) return;
  sched_.discard(*planned_);
  planned_.reset();
}

// cost_fit: a step that computed a multi-token chunk is a sample (engine_config::cost_fit);
// once the samples determine a model the scheduler sizes chunks by it. cost_fit.decode: a step
// of decodes only (drafts verified included) is a sample of the decode model, fitted once for
// the decode balancer (it sizes nothing here). Decode steps are short and many, and their
// times vary more (an expert-parallel step waits on its exchanges), so that fit takes
// 4 × cost_fit.min_samples of them.
void engine::learn_cost(const in_flight_step& f) {
  const bool prefill_wanted = config_.cost_fit.enabled && !cost_fitted_;
  const bool decode_wanted = config_.cost_fit.decode && !decode_fitted_;
  if (!prefill_wanted && !decode_wanted) return;
  int64_t n = 0, np = 0;
  bool chunk = false;
  for (const planned_item& it : f.plan.items) {
    n += it.n_tokens;
    np += it.n_tokens * it.base;
    chunk = chunk || it.n_tokens - it.drafts > 1;
  }
  if (n == 0 || !(chunk ? prefill_wanted : decode_wanted)) return;
  auto m = chunk ? sample_cost(fitter_, stats_.cost, config_.cost_fit.min_samples, "steps", n, np / n, f.forward_s)
                 : sample_cost(decode_fitter_, stats_.decode_cost, decode_fit_samples(), "decode steps", n, np / n,
                               f.forward_s);
  if (!m) return;
  if (!chunk) {
    decode_fitted_ = true;
    return;
  }
  cost_fitted_ = true;
  sched_.set_cost(*m, config_.cost_fit.step_budget_s);
  if (config_.cost_fit.fitted) config_.cost_fit.fitted(*m);
}

// One sample into `fitter`, its progress into `stats`; the model once `needed` samples (checked
// every 4th) determine one, with `stats` then saying so.
std::optional<cost_model> engine::sample_cost(cost_fitter& fitter, cost_stats& stats, int64_t needed, const char* what,
                                              int64_t n, int64_t p, double seconds) {
  fitter.add(n, p, seconds);
  stats.samples = fitter.samples();
  stats.detail = "collecting " + std::to_string(fitter.samples()) + "/" + std::to_string(needed) + " " + what;
  if (fitter.samples() < needed || fitter.samples() % 4 != 0) return std::nullopt;
  std::optional<cost_model> m = fitter.fit();
  if (m) stats = cost_stats_of("fitted", "from " + std::to_string(m->quality().samples) + " " + what + " of this engine", *m);
  return m;
}

uint64_t engine::steps_started() const { return ep_ ? ep_->steps_started() : stats_.steps; }

std::vector<completion> engine::run_to_completion() {
  std::vector<int64_t> ids;
  for (auto& [id, r] : requests_)
    if (r->status != request_status::finished) ids.push_back(id);
  while (has_work()) {
    step();
    if (stalled_) std::this_thread::sleep_for(std::chrono::microseconds(200));  // remote reads pending
  }
  std::sort(ids.begin(), ids.end());
  std::vector<completion> out;
  for (int64_t id : ids) out.push_back(result(request_id(id)));
  return out;
}

completion engine::result(request_id id) const {
  const request& r = *requests_.at(id.value);
  completion c{r.id, {r.tokens.begin(), r.tokens.begin() + r.prompt_len},
               {r.tokens.begin() + r.prompt_len, r.tokens.end()}, {}, r.finish, r.cached_tokens};
  if (auto t = texts_.find(id.value); t != texts_.end()) c.text = t->second;
  return c;
}

void engine::forget(request_id id) {
  auto it = requests_.find(id.value);
  if (it != requests_.end() && it->second->status == request_status::finished) {
    if (planned_) sched_.prune(*planned_);  // no planned item may point at it
    requests_.erase(it);
    texts_.erase(id.value);
  }
}

engine_stats engine::stats() const {
  engine_stats s = stats_;
  s.cache = caches_.stats();
  s.swa = caches_.swa().stats();
  s.blocks_free = caches_.pool().num_free();
  s.blocks_total = caches_.pool().num_blocks();
  s.running = static_cast<int64_t>(sched_.running());
  for (const request* r : sched_.running_requests()) s.kv_tokens += r->computed();
  s.waiting = static_cast<int64_t>(sched_.waiting());
  s.waiting_for_remote = static_cast<int64_t>(sched_.waiting_for_remote() + awaiting_rows_.size());
  s.image_cache = images_.stats();
  return s;
}

}  // namespace shoal::runtime
