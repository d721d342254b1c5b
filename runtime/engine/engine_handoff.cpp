// The engine's side of a prefill → decode handoff (DISAGG.md): the prefill engine pins a
// request's caches and describes them, the decode engine validates that description, reserves
// blocks and reads them.
#include "runtime/engine/engine.hpp"

#include "kernels/assert.hpp"

namespace shoal::runtime {

// Pins r (it leaves the running set with its caches) and describes its blocks and rings.
void engine::offer_handoff(request& r) {
  handoff_state s;
  s.id = r.id;
  s.tokens = r.tokens;
  s.prompt_len = r.prompt_len;
  s.images = r.images;
  s.params = r.params;
  s.seq_seed = r.seq_seed;
  s.cls = r.cls;
  s.text = texts_[r.id.value];
  s.computed = r.computed();
  s.dec_from = r.dec_from;
  s.ring_tokens = r.cache.ring_tokens;
  s.ring_floor = r.cache.ring_floor;
  s.cached_tokens = r.cached_tokens;
  s.swa_approx = r.swa_approx;
  s.snapshot_at = r.snapshot_at;
  const model::kv_pages& pages = *caches_.pages();
  s.kv = pages.format();
  for (int64_t i = 0; i < caches_.blocks_for(s.computed); ++i)
    s.blocks.push_back(pool_reg_->describe(pages.offset_bytes(r.blocks[static_cast<size_t>(i)].value), pages.block_bytes()));
  std::vector<std::unique_ptr<registered_memory>> regs;
  for (const auto& ring : r.cache.rings) {
    if (ring.empty()) {  // nothing to read
      s.rings.emplace_back();
      continue;
    }
    auto reg = config_.bulk->register_memory(std::as_bytes(std::span(ring)));
    if (!reg) {  // cannot lend this one: it stays here, colocated
      last_error_ = "handoff of request " + std::to_string(r.id.value) + ": " + reg.error();
      return;
    }
    s.rings.push_back((*reg)->describe(0, ring.size()));
    regs.push_back(std::move(*reg));
  }
  r.handed_off = true;
  ++stats_.handoffs_offered;
  sched_.detach(&r);
  leases_[r.id.value] = std::move(regs);
  handoffs_.push_back(std::move(s));
}

std::vector<handoff_state> engine::take_handoffs() { return std::exchange(handoffs_, {}); }

bool engine::handoff_done(request_id id, bool taken) {
  auto it = requests_.find(id.value);
  if (it == requests_.end() || it->second->status != request_status::handing_off) return false;
  request* r = it->second.get();
  leases_.erase(id.value);  // the registrations go before anything they cover can change
  if (!taken) {
    ++stats_.handoffs_kept;
    sched_.resume(r);
    return true;
  }
  ++stats_.handoffs_lent;
  r->finish = finish_reason::handed_off;
  sched_.finish(r);
  return true;
}

std::expected<request_id, error> engine::add_handoff(const handoff_state& s) {
  if (!s.id.valid()) return fail(errc::invalid_argument, "handoff: request id must be >= 0");
  if (requests_.contains(s.id.value))
    return fail(errc::duplicate, "handoff: request " + to_string(s.id) + " is still held by this engine");
  const model::model_config& c = weights_->config;
  if (!config_.bulk) return fail(errc::unavailable, "this engine has no transport to read a handoff with");
  if (s.kv != caches_.format()) {  // not ours to read: the prefill engine keeps it (or another takes it)
    ++stats_.handoffs_refused_format;
    return fail(errc::unavailable,
                "handoff: its KV blocks are " + s.kv.describe() + ", this engine's are " + caches_.format().describe());
  }
  if (auto why = caches_.validate_handoff(s); !why.empty()) return fail(errc::invalid_argument, "handoff: " + why);
  for (size_t i = 0; i < s.tokens.size(); ++i)
    if (s.tokens[i] < 0 || s.tokens[i] >= c.vocab_size)
      return fail(errc::invalid_argument, "handoff: token " + std::to_string(i) + " (id " + std::to_string(s.tokens[i]) +
                             ") is outside the vocabulary");
  if (auto bad = validate(s.params, c.vocab_size)) return fail(errc::invalid_argument, "handoff: " + *bad);
  if (!traffic_class_from_byte(static_cast<uint8_t>(s.cls))) return fail(errc::invalid_argument, "handoff: unknown traffic class");
  if (s.prompt_len < 0 || s.prompt_len > static_cast<int64_t>(s.tokens.size()))
    return fail(errc::invalid_argument, "handoff: prompt_len " + std::to_string(s.prompt_len) + " outside the tokens");
  if (auto why = check_prompt_images(c.vision, std::span(s.tokens).first(static_cast<size_t>(s.prompt_len)), s.images);
      !why.empty())
    return fail(errc::invalid_argument, "handoff: " + why);
  if (!s.params.stop_strings.empty() && !tok_)
    return fail(errc::unavailable, "stop strings need a tokenizer, and this engine has none");
  std::shared_ptr<grammar_matcher> matcher;
  if (s.params.constraint.active()) {  // it continues where the prefill engine's matcher was
    auto m = make_matcher(s.params, std::span(s.tokens).subspan(static_cast<size_t>(s.prompt_len)));
    if (!m) return fail(tok_ ? errc::invalid_argument : errc::unavailable, "handoff: " + m.error());
    matcher = std::move(*m);
  }
  const int64_t total = s.prompt_len + s.params.max_tokens;
  if (caches_.blocks_for(total) > caches_.pool().num_blocks())
    return fail(errc::invalid_argument, "handoff: request needs " + std::to_string(caches_.blocks_for(total)) + " cache blocks; the engine has " +
                           std::to_string(caches_.pool().num_blocks()));
  auto r = std::make_unique<request>();
  r->id = s.id;
  next_id_ = std::max(next_id_, s.id.value + 1);
  r->tokens = s.tokens;
  r->prompt_len = s.prompt_len;
  r->params = s.params;
  r->seq_seed = s.seq_seed;
  r->cls = s.cls;
  r->dec_from = s.dec_from;
  r->images = s.images;
  r->remote_checked = true;  // its prefix came with it
  r->swa_checked = true;
  r->matcher = std::move(matcher);
  if (!caches_.start_import(*r, s, *config_.bulk, config_.handoff_read_timeout))
    return fail(errc::no_room, "no room: " + std::to_string(caches_.blocks_for(s.computed) + 1) + " blocks needed, " +
                           std::to_string(caches_.pool().num_free()) + " free");
  request* raw = r.get();
  texts_[r->id.value] = s.text;
  requests_[r->id.value] = std::move(r);
  sched_.add_importing(raw);
  return raw->id;
}
}  // namespace shoal::runtime
