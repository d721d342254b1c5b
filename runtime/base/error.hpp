// Errors of runtime/ as values, one `errc` as in STYLE.md (model/error.hpp and
// storage/error.hpp are the same shape): a code a caller branches on and a message for people
// naming what was wrong. No caller inspects the message text.
#pragma once

#include <cstdint>
#include <expected>
#include <string>
#include <string_view>

namespace shoal::runtime {

enum class errc : uint8_t {
  invalid_argument = 1,  // the input is wrong (bad token, bad params, too long): retrying cannot help
  duplicate,             // an id that is still in use
  no_room,               // not enough free capacity now (blocks, slots): another place may take it
  not_found,             // no such thing here
  unavailable,           // this component cannot do it (no transport, no tokenizer, not this mode)
  refused,               // the peer said no
  timed_out,             // no outcome within the deadline: the peer may still act on it
  maybe_delivered,       // the bytes left, but whether the peer took them is unknown
  corrupt,               // bytes arrived that do not match their checksum: read them elsewhere or again
};

constexpr std::string_view to_string(errc e) {
  switch (e) {
    case errc::invalid_argument: return "invalid_argument";
    case errc::duplicate: return "duplicate";
    case errc::no_room: return "no_room";
    case errc::not_found: return "not_found";
    case errc::unavailable: return "unavailable";
    case errc::refused: return "refused";
    case errc::timed_out: return "timed_out";
    case errc::maybe_delivered: return "maybe_delivered";
    case errc::corrupt: return "corrupt";
  }
  return "unknown";
}

struct error {
  errc code = errc::invalid_argument;
  std::string message;  // names the field or value at fault
};

template <class T>
using result = std::expected<T, error>;

inline std::unexpected<error> fail(errc code, std::string message) {
  return std::unexpected(error{code, std::move(message)});
}

}  // namespace shoal::runtime
