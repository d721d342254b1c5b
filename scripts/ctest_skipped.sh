#!/usr/bin/env bash
# Lists the test cases the last ctest run in BUILD_DIR skipped, with the reason each gave
# (tests/support/skip.hpp prints "SHOAL_TEST_SKIPPED: why"), and closes with the plain count
# line "tests: N passed, N failed, N skipped". Run after ctest by scripts/test.sh and
# scripts/sanitize.sh.
set -euo pipefail
log=${1:?build dir}/Testing/Temporary/LastTest.log
[ -f "$log" ] || { echo "ctest_skipped: no $log"; exit 0; }
awk '
  /^[0-9]+\/[0-9]+ Test: / { name = $0; sub(/^[0-9]+\/[0-9]+ Test: /, "", name); reason = ""; total++ }
  /^SHOAL_TEST_SKIPPED: / { reason = $0; sub(/^SHOAL_TEST_SKIPPED: /, "", reason) }
  /^Test Passed\./ { if (reason != "") { skipped++; lines = lines "  " name ": " reason "\n" } else passed++ }
  /^Test Failed\./ { failed++ }
  END {
    if (skipped > 0) printf "skipped (did not run here, reported as skipped by ctest): %d\n%s", skipped, lines
    printf "tests: %d passed, %d failed, %d skipped\n", passed, failed, skipped
  }' "$log"
