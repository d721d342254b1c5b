// Out-of-line parts of interfaces.hpp: type registration with an actor_system_config, the
// "shoal" error category, and the conversions between wire messages and runtime types. The
// only TU besides the actors that pays for CAF's heavier headers.
#include "actors/interfaces.hpp"

#include <caf/actor_system_config.hpp>
#include <caf/error.hpp>
#include <caf/make_message.hpp>
#include <caf/sec.hpp>

#include "runtime/vision/image.hpp"

namespace shoal::actors {

namespace {

constexpr caf::atom_value shoal_category = caf::atom("shoal");

bool is_unreachable(caf::sec s) {
  switch (s) {
    case caf::sec::request_receiver_down:
    case caf::sec::no_route_to_receiving_node:
    case caf::sec::cannot_connect_to_node:
    case caf::sec::disconnect_during_handshake:
    case caf::sec::socket_disconnected:
    case caf::sec::connection_timeout:
    case caf::sec::remote_lookup_failed:
      return true;
    default:
      return false;
  }
}

}  // namespace

const char* to_string(errc e) {
  switch (e) {
    case errc::invalid_request: return "invalid_request";
    case errc::duplicate_request: return "duplicate_request";
    case errc::no_sink: return "no_sink";
    case errc::timed_out: return "timed_out";
    case errc::unreachable: return "unreachable";
    case errc::unknown: return "unknown";
    case errc::draining: return "draining";
    case errc::no_engine: return "no_engine";
    case errc::not_found: return "not_found";
    case errc::corrupt: return "corrupt";
    case errc::storage_full: return "storage_full";
    case errc::no_room: return "no_room";
    case errc::too_many_requests: return "too_many_requests";
    case errc::refused: return "refused";
    case errc::conflict: return "conflict";
  }
  return "errc(?)";
}

caf::error make_error(error_reply r) {
  auto code = static_cast<uint8_t>(r.code);
  return caf::error{code, shoal_category, caf::make_message(std::move(r))};
}

caf::error make_error(errc code, std::string message) {
  return make_error(error_reply{code, std::move(message)});
}

error_reply to_error_reply(const caf::error& e) {
  if (e.category() == shoal_category) {
    if (e.context().match_elements<error_reply>()) return e.context().get_as<error_reply>(0);
    return {static_cast<errc>(e.code()), caf::to_string(e)};
  }
  if (e.category() == caf::atom("system")) {
    auto s = static_cast<caf::sec>(e.code());
    if (s == caf::sec::request_timeout) return {errc::timed_out, caf::to_string(e)};
    if (is_unreachable(s)) return {errc::unreachable, caf::to_string(e)};
  }
  return {errc::unknown, caf::to_string(e)};
}

handoff_offer to_handoff_offer(const runtime::handoff_state& s, caf::actor prefill, int64_t blocks_needed,
                               uint64_t lease) {
  return {s.id,        std::move(prefill), blocks_needed, lease,         s.tokens,     s.prompt_len,
          s.images,           s.params,   s.seq_seed,    s.cls,           s.text,       s.computed,
          s.dec_from,  s.ring_tokens,      s.ring_floor,  s.cached_tokens, s.swa_approx, s.snapshot_at,
          s.kv,        s.blocks,           s.rings};
}

runtime::handoff_state to_handoff_state(const handoff_offer& o) {
  runtime::handoff_state s;
  s.id = o.id;
  s.tokens = o.tokens;
  s.prompt_len = o.prompt_len;
  s.images = o.images;
  s.params = o.sampling;
  s.seq_seed = o.seq_seed;
  s.cls = o.cls;
  s.text = o.text;
  s.computed = o.computed;
  s.dec_from = o.dec_from;
  s.ring_tokens = o.ring_tokens;
  s.kv = o.kv;
  s.ring_floor = o.ring_floor;
  s.cached_tokens = o.cached_tokens;
  s.swa_approx = o.swa_approx;
  s.snapshot_at = o.snapshot_at;
  s.blocks = o.blocks;
  s.rings = o.rings;
  return s;
}

void add_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_types<caf::id_block::shoal>();
  // The error_renderer signature is (code, category, context); the templated
  // add_error_category<T> of 0.17 does not compile against it, so a lambda it is.
  cfg.add_error_category(shoal_category, [](uint8_t code, caf::atom_value, const caf::message& context) {
    std::string out = "shoal::";
    out += to_string(static_cast<errc>(code));
    if (context.match_elements<error_reply>()) out += ": " + context.get_as<error_reply>(0).message;
    return out;
  });
}

}  // namespace shoal::actors
