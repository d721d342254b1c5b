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
symbolizer=$(command -v llvm-symbolizer-16 || command -v llvm-symbolizer || true)
[ -n "$symbolizer" ] && export ASAN_SYMBOLIZER_PATH="$symbolizer"
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
      work="$build/fuzz/long/${name#fuzz_}"
      mkdir -p "$work/corpus"
      echo "== $name: $runs executions"
      set +e
      ASAN_OPTIONS=detect_leaks=1 "$t" -runs="$runs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -print_final_stats=1 -artifact_prefix="$work/" "$work/corpus" "fuzz/corpus/${name#fuzz_}" > "$work/log" 2>&1
      rc=$?
      set -e
      grep -E '^(stat::number_of_executed_units|stat::new_units_added|stat::peak_rss_mb|Done )' "$work/log" || true
      if [ $rc -ne 0 ]; then
        tail -n 40 "$work/log"
        echo "$name failed (exit $rc): inputs in $work"
        exit 1
      fi
    done
    ;;
  *)
    echo "usage: scripts/fuzz.sh --runs N [name] | --seeds" >&2
    exit 2
    ;;
esac
