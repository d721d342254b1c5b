// Traffic classes and their time-to-live. Every chunk is put under a class; a chunk of class c
// put at time p is expired from p + ttl(c) on (inclusive). Pure arithmetic on times the caller
// passes in: no clock is read here, the chunk store supplies its injectable clock's reading.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "runtime/base/traffic_class.hpp"

namespace shoal::storage {

// The one traffic-class type of the project; stored as its byte in the chunk file header, so
// its values are part of the on-disk format.
using runtime::n_traffic_classes;
using runtime::to_string;
using runtime::traffic_class;
using runtime::traffic_class_from_byte;

inline constexpr int64_t ms_per_day = 24LL * 3600 * 1000;

struct ttl_policy {
  int64_t agent_ms = 3 * ms_per_day;
  int64_t chat_ms = 7 * ms_per_day;

  int64_t ttl_ms(traffic_class c) const;
  // First instant at which a chunk put at put_ms is expired.
  int64_t expires_at_ms(int64_t put_ms, traffic_class c) const;
  bool expired(int64_t put_ms, traffic_class c, int64_t now_ms) const;
  bool valid() const { return agent_ms > 0 && chat_ms > 0; }
};

}  // namespace shoal::storage
