#!/usr/bin/env bash
# Only the AVX-512 variant of the row kernels (kernels/cpu/rows_avx512.cpp, namespace
# shoal::kernels::detail::avx512) may hold AVX-512 instructions: anything else in the binaries
# runs on the AVX2 baseline. Catches an inline function of a shared header compiled with the
# variant's flags and picked by the linker for the whole program.
set -u
fail=0
for bin in "$@"; do
  [ -x "$bin" ] || { echo "no binary $bin"; fail=1; continue; }
  # functions whose body uses zmm registers, mask registers or ymm16-31 (EVEX only)
  bad=$(objdump -d --no-show-raw-insn "$bin" | awk '
    /^[0-9a-f]+ <.*>:$/ { fn = $2; next }
    /%zmm|%k[1-7]|%[xy]mm(1[6-9]|2[0-9]|3[01])/ { if (fn !~ /6avx512/) print fn }' | sort -u)
  if [ -n "$bad" ]; then
    echo "AVX-512 instructions outside the avx512 variant in $bin:"; echo "$bad"; fail=1
  fi
  n=$(objdump -d --no-show-raw-insn "$bin" | awk '/^[0-9a-f]+ <.*>:$/ { fn = $2; next } /%zmm/ && fn ~ /6avx512/ { print fn }' | sort -u | wc -l)
  if [ "$n" -eq 0 ]; then echo "$bin has no avx512 variant functions (is rows_avx512.cpp built?)"; fail=1; fi
done
[ $fail -eq 0 ] && echo "AVX-512 code only in the avx512 variant: $*"
exit $fail
