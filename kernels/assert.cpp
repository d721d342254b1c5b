// Out-of-line assertion failure: prints the failed expression and its place, then aborts.
#include "kernels/assert.hpp"

#include <cstdio>
#include <cstdlib>

namespace shoal {

void assert_fail(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "shoal: assertion failed: %s at %s:%d\n", expr, file, line);
  std::fflush(stderr);
  std::abort();
}

}  // namespace shoal
