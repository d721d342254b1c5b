#!/usr/bin/env bash
# Runs one libFuzzer target: run_fuzzer.sh BINARY SEED_CORPUS WORK_DIR LIMIT, LIMIT a libFuzzer
# flag such as -max_total_time=15 (the test command) or -runs=1000000 (scripts/fuzz.sh).
# New inputs go to WORK_DIR/corpus (the committed seeds are read, never written); a crash,
# leak, sanitizer report or timeout leaves its input in WORK_DIR/ and fails the run, printing
# the command that replays it.
set -euo pipefail
bin=$1 seeds=$2 work=$3 limit=$4
mkdir -p "$work/corpus"
# Reports with function names and lines (any llvm-symbolizer reads clang-16's debug info).
symbolizer=$(command -v llvm-symbolizer-16 || command -v llvm-symbolizer || true)
[ -n "$symbolizer" ] && export ASAN_SYMBOLIZER_PATH="$symbolizer"
set +e
"$bin" "$limit" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
  -artifact_prefix="$work/" "$work/corpus" "$seeds" > "$work/log" 2>&1
rc=$?
set -e
grep -a -E '^(stat::number_of_executed_units|stat::new_units_added|stat::peak_rss_mb|Done )' "$work/log" || true
if [ $rc -ne 0 ]; then
  tail -n 60 "$work/log"
  echo "fuzzer $(basename "$bin") failed (exit $rc); replay: $bin $work/crash-* (or leak-/timeout-/oom-)"
  exit 1
fi
