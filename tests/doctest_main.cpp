// doctest entry point shared by every test executable.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "tests/support/lasting.hpp"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SHOAL_TEST_LSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define SHOAL_TEST_LSAN 1
#endif
#ifdef SHOAL_TEST_LSAN
#include <sanitizer/lsan_interface.h>
#endif

namespace {
std::atomic<bool> keep{false};
}

void shoal::test::keep_until_exit() { keep = true; }

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  int rc = context.run();
  if (context.shouldExit() || !keep) return rc;
  // Lasting objects (tests/support/lasting.hpp) are still running: check for leaks now (they
  // are reachable) and leave without static destructors racing their threads.
#ifdef SHOAL_TEST_LSAN
  if (__lsan_do_recoverable_leak_check() != 0 && rc == 0) rc = 1;
#endif
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(rc);
}
