#!/usr/bin/env bash
# Runs one libFuzzer target for a fixed time: run_fuzzer.sh BINARY SEED_CORPUS WORK_DIR SECONDS.
# New inputs go to WORK_DIR/corpus (the committed seeds are read, never written); a crash,
# leak, sanitizer report or timeout leaves its input in WORK_DIR/ and fails the run, printing
# the command that replays it.
set -euo pipefail
bin=$1 seeds=$2 work=$3 seconds=$4
mkdir -p "$work/corpus"
set +e
"$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
  -artifact_prefix="$work/" "$work/corpus" "$seeds" > "$work/log" 2>&1
rc=$?
set -e
grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+ *DONE)' "$work/log" || true
if [ $rc -ne 0 ]; then
  tail -n 60 "$work/log"
  echo "fuzzer $(basename "$bin") failed (exit $rc); replay: $bin $work/crash-* (or leak-/timeout-/oom-)"
  exit 1
fi
