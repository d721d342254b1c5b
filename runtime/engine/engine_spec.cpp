// Speculative decoding in the engine (DSpark, runtime/core/speculative.hpp): the verification of a
// step's logits rows, the next drafts (the MTP chain, or the target itself for tests), and the
// verify lengths of a plan's decodes. The step loop is engine.cpp.
#include <algorithm>
#include <cmath>

#include "model/forward.hpp"
#include "runtime/base/clock.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/structured/grammar.hpp"

namespace shoal::runtime {

// Rows j = 0 … n_rows − 1 are the logits after the pending token and after each of the
// first n_rows − 1 drafts. Row j decides output token j of this step: greedy takes the
// target's token (the draft is accepted when they agree); sampling accepts the draft with
// probability min(1, p/q) and otherwise draws from the residual; past the last verified
// draft the token is drawn as without speculation. Stops at the first rejection or finish.
int64_t engine::verify(request& r, std::span<const float> rows, int64_t n_rows, std::vector<token_event>& events) {
  const int64_t V = weights_->config.vocab_size;
  const auto& synth = config_.spec.synthetic;
  int64_t accepted = 0;
  for (int64_t j = 0; j < n_rows; ++j) {
    std::span<const float> logits = rows.subspan(static_cast<size_t>(j * V), static_cast<size_t>(V));
    std::span<const float> allowed = logits;
    if (r.matcher) {  // structured output: refused tokens to −inf
      masked_.assign(logits.begin(), logits.end());
      allowed = masked_;
      if (r.matcher->apply_mask(masked_) == 0) {  // no token of the vocabulary continues the match
        r.finish = finish_reason::error;
        events.push_back({r.id, -1, true, finish_reason::error, {}});
        break;
      }
    }
    const int64_t step = r.output_len();
    const auto generated = std::span<const int32_t>(r.tokens).subspan(static_cast<size_t>(r.prompt_len));
    const bool drafted = j < n_rows - 1;
    int32_t token = -1;
    bool accept = false;
    if (!drafted) {
      token = sample_token(allowed, r.params, r.seq_seed, step, generated);
    } else {
      const int32_t d = r.spec.drafts[static_cast<size_t>(j)];
      if (synth) {  // benchmark mode: acceptance drawn from the synthetic model, not the target
        accept = synth->accepted(r.seq_seed, step, j, r.spec.confidence[static_cast<size_t>(j)]);
        token = accept ? d : sample_token(allowed, r.params, r.seq_seed, step, generated);
      } else if (r.params.temperature == 0.0f) {
        token = sample_token(allowed, r.params, r.seq_seed, step, generated);
        accept = token == d;
      } else {
        const token_distribution p = distribution_of(allowed, r.params, generated);
        const token_distribution& q = r.spec.q[static_cast<size_t>(j)];
        accept = accept_draft(p, q, d, accept_uniform(r.seq_seed, step));
        token = accept ? d : draw_from(residual(p, q), uniform_at(r.seq_seed, step));
      }
    }
    if (accept) ++accepted;
    const bool goes_on = emit(r, token, logits, events);
    if (!goes_on || (drafted && !accept)) break;
  }
  return accepted;
}

// The next drafts of each request: the MTP chain over its last hidden rows, one batch.
void engine::draft(std::vector<request*>& rs) {
  const int64_t d = weights_->config.hidden_size;
  std::vector<model::mtp_step_item> items;
  std::vector<request*> ready;
  for (request* r : rs) {
    auto& sp = r->spec;
    sp.drafts.clear();
    sp.confidence.clear();
    sp.q.clear();
    sp.drafted_at = -1;
    const int64_t rows = static_cast<int64_t>(sp.hidden.size()) / d;
    if (rows == 0 || sp.hidden_from + rows != r->computed() || r->computed() != r->num_tokens() - 1) continue;
    items.push_back({r->tokens, sp.hidden.data(), sp.hidden_from, &r->cache, &sp.mtp});
    ready.push_back(r);
  }
  if (items.empty()) return;
  const auto& synth = config_.spec.synthetic;
  model::forward_options fo{config_.batch_invariant, config_.naive_prefill, ep_.get()};
  std::vector<int32_t> generated;
  std::vector<float> draft_masked;
  std::vector<size_t> advanced(ready.size(), 0);  // tokens each matcher took for the drafts
  if (config_.spec.self_draft) {
    self_draft(ready, fo, advanced);
  } else {
    const int64_t window = weights_->config.is_flash() ? weights_->config.window() : draft_context_;
    try {
    backend_->mtp_step(items, config_.spec.nextn, window,
                   [&](size_t i, int64_t k, std::span<const float> logits, float confidence) {
                     request& r = *ready[i];
                     const int64_t step = r.output_len() + k;  // the output index this draft would take
                     std::span<const int32_t> gen;
                     if (r.params.adjusts_logits()) {
                       generated.assign(r.tokens.begin() + r.prompt_len, r.tokens.end());
                       generated.insert(generated.end(), r.spec.drafts.begin(), r.spec.drafts.end());
                       gen = generated;
                     }
                     logits = grammar_masked(r, logits, draft_masked);
                     int32_t token;
                     if (r.params.temperature == 0.0f || synth) {
                       token = sample_token(logits, r.params, r.seq_seed, step, gen);
                     } else {
                       r.spec.q.push_back(distribution_of(logits, r.params, gen));
                       token = draw_from(r.spec.q.back(), draft_uniform(r.seq_seed, step));
                     }
                     advance_grammar(r, token, advanced[i]);
                     if (synth) confidence = synth->confidence(r.seq_seed, step, k);
                     else if (std::isnan(confidence)) confidence = acceptance_.at(k);
                     r.spec.drafts.push_back(token);
                     r.spec.confidence.push_back(confidence);
                     return token;
                   },
                   fo);
    } catch (const ep_error& e) {
      drop_drafts(ready, advanced, e.what());
      return;
    }
  }
  for (size_t i = 0; i < ready.size(); ++i) {
    if (advanced[i] > 0) ready[i]->matcher->rollback(advanced[i]);  // the drafts are not output yet
    ready[i]->spec.drafted_at = ready[i]->computed();
  }
  stats_.spec.drafted += static_cast<uint64_t>(ready.size()) * static_cast<uint64_t>(config_.spec.nextn);
}

// A draft pass's exchange failed (expert parallelism): no drafts this step; the MTP caches of
// the chain are partly written, so each restarts from its hidden rows.
void engine::drop_drafts(const std::vector<request*>& ready, const std::vector<size_t>& advanced, const std::string& why) {
  last_error_ = why;
  ++stats_.failed_steps;
  for (size_t i = 0; i < ready.size(); ++i) {
    if (advanced[i] > 0) ready[i]->matcher->rollback(advanced[i]);
    ready[i]->spec.drafts.clear();
    ready[i]->spec.confidence.clear();
    ready[i]->spec.q.clear();
    ready[i]->spec.mtp = {};
  }
}

// A draft's logits under the request's grammar, where the drafts so far left its matcher (the
// logits themselves without one, or once nothing continues the match: such drafts are
// rejected at verification).
std::span<const float> engine::grammar_masked(request& r, std::span<const float> logits, std::vector<float>& scratch) {
  if (!r.matcher || r.matcher->terminated()) return logits;
  scratch.assign(logits.begin(), logits.end());
  if (r.matcher->apply_mask(scratch) == 0) return logits;
  return scratch;
}

void engine::advance_grammar(request& r, int32_t token, size_t& advanced) {
  if (r.matcher && !r.matcher->terminated() && r.matcher->accept_token(token)) ++advanced;
}

// spec_config::self_draft: drafts from the target model over the whole sequence, mixed with
// the uniform distribution (weight self_draft_noise).
void engine::self_draft(const std::vector<request*>& rs, const model::forward_options& fo, std::vector<size_t>& advanced) {
  const int64_t V = weights_->config.vocab_size;
  const double noise = config_.spec.self_draft_noise;
  std::vector<float> masked;
  for (size_t i = 0; i < rs.size(); ++i) {
    request* r = rs[i];
    std::vector<int32_t> seq = r->tokens;
    for (int64_t k = 0; k < config_.spec.nextn; ++k) {
      const int64_t step = r->output_len() + k;
      const std::vector<float> full = backend_->forward_full(seq, fo, caches_.format().dtype).logits;
      const std::span<const float> logits = grammar_masked(*r, full, masked);
      const auto gen = std::span<const int32_t>(seq).subspan(static_cast<size_t>(r->prompt_len));
      const double u = draft_uniform(r->seq_seed, step);
      int32_t token;
      if (r->params.temperature == 0.0f) {
        token = sample_token(logits, r->params, r->seq_seed, step, gen);
        if (u < noise)  // a uniformly drawn token instead
          token = static_cast<int32_t>(std::min<int64_t>(V - 1, static_cast<int64_t>(uniform_at(r->seq_seed ^ 0x9b05688c2b3e6c1fULL, step) * double(V))));
      } else {
        const token_distribution p = distribution_of(logits, r->params, gen);
        token_distribution q;
        q.ids.resize(static_cast<size_t>(V));
        q.weights.assign(static_cast<size_t>(V), static_cast<float>(noise / double(V)));
        for (int64_t t = 0; t < V; ++t) q.ids[static_cast<size_t>(t)] = static_cast<int32_t>(t);
        for (size_t i = 0; i < p.ids.size(); ++i)
          q.weights[static_cast<size_t>(p.ids[i])] += static_cast<float>((1 - noise) * p.weights[i] / p.total);
        q.total = 0;
        for (float x : q.weights) q.total += x;
        token = draw_from(q, u);
        r->spec.q.push_back(std::move(q));
      }
      advance_grammar(*r, token, advanced[i]);
      r->spec.drafts.push_back(token);
      r->spec.confidence.push_back(static_cast<float>(1 - noise));
      seq.push_back(token);
    }
  }
}

// spec_mode::automatic (runtime::auto_verify): this step's choice, by its decoding requests.
bool engine::auto_verifies(const step_plan& plan) {
  int64_t decodes = 0;
  for (const planned_item& it : plan.items)
    if (it.n_tokens == 1 && it.req->computed() == it.req->num_tokens() - 1) ++decodes;
  if (decodes == 0) return stats_.spec.auto_verifying;
  return auto_.choose(decodes);
}

// A completed step's rate for auto_verify: tokens emitted per second of the step.
void engine::auto_measure(const in_flight_step& f, size_t tokens) {
  const int64_t decodes = static_cast<int64_t>(f.plan.items.size());
  const bool decode_only = std::all_of(f.plan.items.begin(), f.plan.items.end(),
                                       [](const planned_item& it) { return it.n_tokens - it.drafts == 1; });
  const double dt = default_clock()->now_s() - f.started;
  auto_.measure(decodes, f.verifies, decode_only, dt > 0 ? double(tokens) / dt : 0);
}

// Verify lengths for the plan's decodes: every draft (fixed, or adaptive below adaptive_from
// decodes) or the policy's choice, bounded by max_tokens and by the free blocks.
void engine::add_drafts(step_plan& plan) {
  if (config_.spec.mode == spec_mode::off) return;
  if (config_.spec.mode == spec_mode::automatic) {
    const bool on = auto_verifies(plan);
    if (on != stats_.spec.auto_verifying) {
      stats_.spec.auto_verifying = on;
      ++stats_.spec.auto_switches;
    }
    if (!on) return;
  }
  std::vector<size_t> at;
  std::vector<spec_candidate> cands;
  for (size_t i = 0; i < plan.items.size(); ++i) {
    planned_item& it = plan.items[i];
    request& r = *it.req;
    if (it.n_tokens != 1 || r.computed() != r.num_tokens() - 1 || r.spec.drafted_at != r.computed()) continue;
    const int64_t left = static_cast<int64_t>(r.params.max_tokens) - r.output_len() - 1;
    const int64_t k = std::min<int64_t>(static_cast<int64_t>(r.spec.drafts.size()), left);
    if (k <= 0) continue;
    at.push_back(i);
    cands.push_back({std::vector<float>(r.spec.confidence.begin(), r.spec.confidence.begin() + k), r.computed()});
  }
  if (cands.empty()) return;
  std::vector<int64_t> k(cands.size());
  if (config_.spec.mode == spec_mode::adaptive && static_cast<int64_t>(cands.size()) >= config_.spec.adaptive_from) {
    k = choose_verify_lengths(cands, *config_.spec.cost, plan.tokens);
  } else {
    const int64_t cap = config_.spec.mode != spec_mode::adaptive && config_.spec.fixed_k > 0 ? config_.spec.fixed_k
                                                                                              : config_.spec.nextn;
    for (size_t c = 0; c < cands.size(); ++c) k[c] = std::min(cap, static_cast<int64_t>(cands[c].confidence.size()));
  }
  for (size_t c = 0; c < cands.size(); ++c) {
    planned_item& it = plan.items[at[c]];
    request& r = *it.req;
    const int64_t held = static_cast<int64_t>(r.blocks.size() + it.new_blocks.size());
    int64_t n = k[c];
    const model::model_config& mc = weights_->config;
    if (mc.is_flash() && config_.cache.prefix_caching) {
      // A window snapshot is taken at a block boundary p while the ring still holds [p − W, p):
      // a run may pass p by at most ring − W positions, so it stops there.
      const int64_t slack = caches_.ring_tokens() - mc.window(), end = r.computed() + 1 + n;
      const int64_t p = end / mc.block_size * mc.block_size;
      if (p > r.computed() && end - p > slack) n = std::max<int64_t>(0, p + slack - r.computed() - 1);
    }
    while (n > 0 && caches_.blocks_for(r.computed() + 1 + n) - held > caches_.pool().num_free()) --n;
    if (n == 0) continue;
    auto more = caches_.take_blocks(caches_.blocks_for(r.computed() + 1 + n) - held);
    it.new_blocks.insert(it.new_blocks.end(), more.begin(), more.end());
    it.drafts = n;
    it.n_tokens += n;
    plan.tokens += n;
  }
}

}  // namespace shoal::runtime
