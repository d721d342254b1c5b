// TTL arithmetic (see ttl.hpp). Saturates instead of overflowing so a
// huge configured TTL means "never" rather than wrapping into the past.
#include "storage/ttl.hpp"

#include <limits>

namespace shoal::storage {

int64_t ttl_policy::ttl_ms(traffic_class c) const {
  return c == traffic_class::agent ? agent_ms : chat_ms;
}

int64_t ttl_policy::expires_at_ms(int64_t put_ms, traffic_class c) const {
  const int64_t ttl = ttl_ms(c);
  if (put_ms > std::numeric_limits<int64_t>::max() - ttl) return std::numeric_limits<int64_t>::max();
  return put_ms + ttl;
}

bool ttl_policy::expired(int64_t put_ms, traffic_class c, int64_t now_ms) const {
  return now_ms >= expires_at_ms(put_ms, c);
}

}  // namespace shoal::storage
