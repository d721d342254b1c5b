#!/usr/bin/env bash
# The sanitizer build: clang-16 with AddressSanitizer + UndefinedBehaviorSanitizer (and libFuzzer
# instrumentation) in build-san, holding the unit, actor and sim test suites and the fuzz/
# targets; then every test of it: the suites, and each fuzzer for SHOAL_FUZZ_SECONDS (default
# 15) over its seed corpus. Extra arguments go to ctest (e.g. -L fuzz). `--build` only builds.
# The libraries keep full debug info: UBSan matches tests/sanitizers/ubsan.supp against the
# names of inlined frames, which line tables alone shorten ("operator*"). The test files' own
# flags: tests/CMakeLists.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_BASEDIR="$PWD"
build=${SHOAL_SAN_BUILD_DIR:-build-san}
cxx=$(command -v clang++-16 || true)
cc=$(command -v clang-16 || true)
if [ -z "$cxx" ] || [ -z "$cc" ]; then
  echo "sanitize: clang-16 is missing (scripts/setup.sh installs it)" >&2
  exit 1
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHOAL_SANITIZE=ON \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g -DNDEBUG" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$cc" -DSHOAL_FUZZ_SECONDS="${SHOAL_FUZZ_SECONDS:-15}" \
  > "$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)"
[ "${1:-}" = "--build" ] && exit 0
root=$PWD
cd "$build"
# Leaks are reported (LeakSanitizer) and any report fails its test (but for tests/sanitizers/lsan.supp).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:suppressions=$root/tests/sanitizers/ubsan.supp}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/tests/sanitizers/lsan.supp}
# Reports with function names and lines (any llvm-symbolizer reads clang-16's debug info).
symbolizer=$(command -v llvm-symbolizer-16 || command -v llvm-symbolizer || true)
[ -n "$symbolizer" ] && export ASAN_SYMBOLIZER_PATH="$symbolizer"
ctest --output-on-failure -j "$(nproc)" -LE bench "$@"
"$root/scripts/ctest_skipped.sh" .
