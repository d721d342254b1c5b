// doctest entry point shared by every test executable.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include <string>

#include "tests/support/lasting.hpp"
#include "tests/support/skip.hpp"

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
std::string skipped;  // why a case did not run ("" when every case ran)

// A run that failed nothing but skipped a case exits with skip_exit_code after naming why.
int with_skip(int rc) {
  if (rc != 0 || skipped.empty()) return rc;
  std::printf("SHOAL_TEST_SKIPPED: %s\n", skipped.c_str());
  return shoal::test::skip_exit_code;
}
}  // namespace

void shoal::test::keep_until_exit() { keep = true; }

void shoal::test::skip(const std::string& why) {
  MESSAGE("skipped: " << why);
  if (skipped.empty()) skipped = why;
}

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  int rc = context.run();
  if (context.shouldExit()) return rc;
  if (!keep) return with_skip(rc);
  // Lasting objects (tests/support/lasting.hpp) are still running: check for leaks now (they
  // are reachable) and leave without static destructors racing their threads.
#ifdef SHOAL_TEST_LSAN
  if (__lsan_do_recoverable_leak_check() != 0 && rc == 0) rc = 1;
#endif
  rc = with_skip(rc);
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(rc);
}
