// How a request's generation ended: the one form every layer uses (engine events, actor
// messages, the shell, the API's finish_reason). On the wire: its integer, so new reasons go
// at the end.
#pragma once

#include <cstdint>

namespace shoal::runtime {

// none: still generating. handed_off: the request continues on another engine (prefill →
// decode handoff). tool_calls: the gateway's, when the reply is a whole tool-calls block.
enum class finish_reason : uint8_t { none, stop, length, aborted, error, handed_off, tool_calls };

constexpr const char* to_string(finish_reason r) {
  switch (r) {
    case finish_reason::none: return "none";
    case finish_reason::stop: return "stop";
    case finish_reason::length: return "length";
    case finish_reason::aborted: return "aborted";
    case finish_reason::error: return "error";
    case finish_reason::handed_off: return "handed_off";
    case finish_reason::tool_calls: return "tool_calls";
  }
  return "unknown";
}

}  // namespace shoal::runtime
