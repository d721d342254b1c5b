#pragma once
// A test case that cannot run on this machine (no GPU, not root, an ISA this CPU lacks, a tool
// missing) says so and stops: SHOAL_SKIP("why") records the reason and returns from the case.
// main (tests/doctest_main.cpp) then prints "SHOAL_TEST_SKIPPED: why" and exits with
// skip_exit_code when nothing failed, which ctest reports as skipped (SKIP_RETURN_CODE in
// tests/CMakeLists.txt), never as passed. scripts/test.sh lists the skipped cases and reasons.

#include <string>

namespace shoal::test {

inline constexpr int skip_exit_code = 77;

// Records that the running case did not run, and why (the first reason of the process is kept).
void skip(const std::string& why);

}  // namespace shoal::test

#define SHOAL_SKIP(why)          \
  do {                           \
    ::shoal::test::skip(why);    \
    return;                      \
  } while (0)
