// Always-on assertions for programmer errors. Operating errors are values (std::expected),
// never assertions; an assertion failing means a bug, so it prints where and aborts.
#pragma once

namespace shoal {

[[noreturn]] void assert_fail(const char* expr, const char* file, int line);

}  // namespace shoal

#define SHOAL_ASSERT(cond) \
  ((cond) ? static_cast<void>(0) : ::shoal::assert_fail(#cond, __FILE__, __LINE__))
