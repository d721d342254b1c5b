#!/usr/bin/env bash
# The whole test suite: set-up; the sanitizer build (clang, ASan + UBSan) with its unit, actor
# and sim suites and a short run of every fuzzer (scripts/sanitize.sh); then the build
# (RelWithDebInfo with line tables only, -g1: backtraces keep their lines and the build
# takes a fifth less time; all targets) and every ctest except benchmarks. Extra arguments go to the
# last ctest (e.g. -R tokenizer, -L cluster); SHOAL_TEST_SANITIZE=0 skips the sanitizer part.
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache hits across clones in different folders (CI clones afresh each run)
export CCACHE_BASEDIR="$PWD"
./scripts/setup.sh
if [ "${SHOAL_TEST_SANITIZE:-1}" != 0 ]; then
  ./scripts/sanitize.sh
fi
build=${SHOAL_TEST_BUILD_DIR:-build-test}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" ${SHOAL_CMAKE_ARGS:-} > "$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)"
root=$PWD
cd "$build"
ctest --output-on-failure -j "$(nproc)" -LE bench "$@"
# The cases that could not run here (no GPU, not root, an ISA this CPU lacks), and why.
"$root/scripts/ctest_skipped.sh" .
