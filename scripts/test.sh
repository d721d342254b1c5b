#!/usr/bin/env bash
# The whole test suite: set-up, build (RelWithDebInfo, all targets), then every ctest except
# benchmarks. Extra arguments go to ctest (e.g. -R tokenizer, -L cluster).
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache hits across clones in different folders (CI clones afresh each run)
export CCACHE_BASEDIR="$PWD"
./scripts/setup.sh
build=${SHOAL_TEST_BUILD_DIR:-build-test}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${SHOAL_CMAKE_ARGS:-} > "$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)"
cd "$build"
ctest --output-on-failure -j "$(nproc)" -LE bench "$@"
