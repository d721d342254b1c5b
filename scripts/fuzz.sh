#!/usr/bin/env bash
# Long fuzzing campaigns and seeds, on the sanitizer build (scripts/sanitize.sh --build):
#   scripts/fuzz.sh --runs N [name]  each target (or the one named) for N executions over a scratch
#                                    corpus seeded from fuzz/corpus/<name>, printing executions,
#                                    new inputs and peak RSS; a failing input stays in
#                                    build-san/fuzz/long/<name>/
#   scripts/fuzz.sh --seeds          rewrites the binary seeds of fuzz/corpus with make_seeds
# The short run of every target is part of the test command (scripts/sanitize.sh, label fuzz).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/sanitize.sh --build
build=${SHOAL_SAN_BUILD_DIR:-build-san}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:suppressions=$PWD/tests/sanitizers/ubsan.supp}
case "${1:-}" in
  --seeds)
    "$build/fuzz/make_seeds" fuzz/corpus
    ;;
  --runs)
    runs=${2:?--runs N}
    for t in "$build"/fuzz/fuzz_*; do
      name=$(basename "$t")
      [ -n "${3:-}" ] && [ "$name" != "fuzz_$3" ] && continue
      echo "== $name: $runs executions"
      bash fuzz/run_fuzzer.sh "$t" "fuzz/corpus/${name#fuzz_}" "$build/fuzz/long/${name#fuzz_}" -runs="$runs"
    done
    ;;
  *)
    echo "usage: scripts/fuzz.sh --runs N [name] | --seeds" >&2
    exit 2
    ;;
esac
