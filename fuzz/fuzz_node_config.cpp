// libFuzzer target: a shoald node config (TOML) as runtime/node_config parses and validates it.
// Every input gives a config or one error naming where and what ("file:line:col: key ...");
// no TOML exception escapes.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "runtime/config/node_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shoal::runtime;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto c = parse_node_config(text, "/etc/shoal/fuzz.toml");
  if (!c) {
    const std::string msg = to_string(c.error());
    if (msg.rfind("/etc/shoal/fuzz.toml", 0) != 0) std::abort();
    return 0;
  }
  // A config that validated names itself and listens somewhere.
  if (c->name.empty() || c->roles.empty()) std::abort();
  return 0;
}
