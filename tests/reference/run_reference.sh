#!/usr/bin/env bash
# CTest driver `reference_forward`: the C++ engine's last-position logits (and MTP draft logits)
# against the independent NumPy reference ref_forward.py, for the `tiny` (shoal_flash) and
# `v3-tiny` (deepseek_v3) presets over prompts of 1, 5, 17, 40 and 70 tokens (crossing the
# sliding window 16, several compress runs of 4 and blocks of 16), and with the vision encoder
# over images of several sizes inside prompts (encoder rows and logits).
#
#   run_reference.sh BINDIR REFDIR
# Env: PYTHON (default /usr/bin/python3, needs numpy), REF_TOL (default 1e-3, bound on
# max|engine - ref| / max|ref|), REF_SEED (default 7), REF_SELFCHECK=1 also runs the reference's
# own self-checks first.
set -u

BINDIR=${1:?usage: run_reference.sh BINDIR REFDIR}
REFDIR=${2:?usage: run_reference.sh BINDIR REFDIR}
PY=${PYTHON:-/usr/bin/python3}
TOL=${REF_TOL:-1e-4}
SEED=${REF_SEED:-7}
SHOAL="$BINDIR/tools/shoal"
LENGTHS="1 5 17 40 70"

if ! "$PY" -c 'import numpy' 2>/dev/null; then
  echo "run_reference: $PY cannot import numpy (set PYTHON to an interpreter that can)" >&2
  exit 1
fi
if [[ ! -x "$SHOAL" ]]; then
  echo "run_reference: engine binary $SHOAL not found" >&2
  exit 1
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/shoal_ref.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
passed=0
failed=0

if [[ "${REF_SELFCHECK:-0}" == 1 ]]; then
  if "$PY" "$REFDIR/selfcheck_reference.py" > "$WORK/selfcheck.log" 2>&1; then
    echo "reference self-check: $(tail -n 1 "$WORK/selfcheck.log")"
  else
    cat "$WORK/selfcheck.log"; echo "reference self-check FAILED"; failed=$((failed + 1))
  fi
fi

# Deterministic prompt of $1 token ids < 256 (seeded by length).
make_prompt() {
  "$PY" -c "import random,sys; r=random.Random(1000+int(sys.argv[1])); \
print(','.join(str(r.randrange(256)) for _ in range(int(sys.argv[1]))))" "$1"
}

# num_nextn_predict_layers of checkpoint $1.
mtp_layers() {
  "$PY" -c "import json,sys; print(json.load(open(sys.argv[1]+'/config.json')).get('num_nextn_predict_layers',0))" "$1"
}

# Prints the compare log $2 under label $1 and counts its PASS / FAIL lines; $3 is the
# reference's exit status (a crash before judging is a failure).
count_lines() {
  local label=$1 log=$2 rc=$3 line
  while IFS= read -r line; do
    echo "$label $line"
    case $line in
      *" PASS") passed=$((passed + 1)) ;;
      *FAIL*) failed=$((failed + 1)) ;;
    esac
  done < "$log"
  if [[ $rc -ne 0 ]] && ! grep -q FAIL "$log"; then
    echo "$label FAIL reference exited $rc"; failed=$((failed + 1))
  fi
}

# One prompt on one model: engine run + compare; counts every PASS/FAIL line the compare prints.
run_case() {
  local preset=$1 model=$2 n=$3 tokens out mtp_args=() cmp_args=()
  tokens=$(make_prompt "$n")
  out="$WORK/$preset.$n"
  if [[ $(mtp_layers "$model") -gt 0 && $n -ge 2 ]]; then
    mtp_args=(--mtp-out "$out.mtp.bin")
    cmp_args=(--engine-mtp "$out.mtp.bin")
  fi
  if ! "$SHOAL" logits --model "$model" --tokens "$tokens" --out "$out.bin" "${mtp_args[@]}" \
      > "$out.engine.log" 2>&1; then
    echo "[$preset n=$n] FAIL engine: $(tail -n 3 "$out.engine.log" | tr '\n' ' ')"
    failed=$((failed + 1)); return
  fi
  "$PY" "$REFDIR/ref_forward.py" compare --model "$model" --tokens "$tokens" \
      --engine-logits "$out.bin" "${cmp_args[@]}" --tol "$TOL" > "$out.cmp.log" 2>&1
  local rc=$?
  count_lines "[$preset n=$n]" "$out.cmp.log" $rc
  [[ $rc -ne 0 ]] && echo "[$preset n=$n] tokens=$tokens"
}

for preset in tiny v3-tiny; do
  model="$WORK/$preset"
  if ! "$SHOAL" mkmodel --preset "$preset" --seed "$SEED" --out "$model" > "$WORK/mk.$preset.log" 2>&1; then
    echo "[$preset] FAIL mkmodel: $(tail -n 3 "$WORK/mk.$preset.log" | tr '\n' ' ')"
    failed=$((failed + 1)); continue
  fi
  for n in $LENGTHS; do
    run_case "$preset" "$model" "$n"
  done
done

# Vision (MODEL.md §2, model/README.md "Vision"): the vision variants of tiny and v3-tiny; images
# of several sizes (1 to 16 patches, square and not) at positions inside the prompt (crossing
# blocks of 16), one prompt with two images; the encoder rows and the logits both compared.
# $1 preset, $2 model, $3 label, then W:H pairs: each image follows 5 text tokens.
run_vision_case() {
  local preset=$1 model=$2 label=$3 tok
  shift 3
  tok=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]+'/config.json'))['vision']['image_token_id'])" "$model")
  local out="$WORK/$preset.vision.$label" specs=() tokens="" pos=0 i=0 wh w h n
  for wh in "$@"; do
    w=${wh%:*} h=${wh#*:} n=$(( (w / 14) * (h / 14) ))
    tokens+="$(make_prompt 5),"
    pos=$((pos + 5))
    "$PY" -c "import numpy as np,sys; np.random.default_rng(int(sys.argv[2])).integers(0,256,int(sys.argv[3]),dtype=np.uint8).tofile(sys.argv[1])" \
        "$out.$i.rgb" $((i * 31 + w + h)) $((w * h * 3))
    specs+=(--image "$out.$i.rgb:$w:$h:$pos")
    tokens+=$("$PY" -c "print(','.join(['$tok'] * $n))"),
    pos=$((pos + n)) i=$((i + 1))
  done
  tokens+=$(make_prompt 7)
  if ! "$SHOAL" logits --model "$model" --tokens "$tokens" "${specs[@]}" --out "$out.bin" --vision-out "$out.vision.bin" \
      > "$out.engine.log" 2>&1; then
    echo "[$preset vision $label] FAIL engine: $(tail -n 3 "$out.engine.log" | tr '\n' ' ')"
    failed=$((failed + 1)); return
  fi
  "$PY" "$REFDIR/ref_forward.py" compare --model "$model" --tokens "$tokens" "${specs[@]}" \
      --engine-logits "$out.bin" --engine-vision "$out.vision.bin" --tol "$TOL" > "$out.cmp.log" 2>&1
  count_lines "[$preset vision $label]" "$out.cmp.log" $?
}

for preset in tiny v3-tiny; do
  model="$WORK/$preset-vision"
  if ! "$SHOAL" mkmodel --preset "$preset" --vision --seed "$SEED" --out "$model" > "$WORK/mk.$preset.v.log" 2>&1; then
    echo "[$preset vision] FAIL mkmodel: $(tail -n 3 "$WORK/mk.$preset.v.log" | tr '\n' ' ')"
    failed=$((failed + 1)); continue
  fi
  for wh in 14:14 56:56 28:56 42:14; do run_vision_case "$preset" "$model" "$wh" "$wh"; done
  run_vision_case "$preset" "$model" two-images 56:28 14:42
done

echo "$passed passed, $failed failed"
[[ $failed -eq 0 && $passed -gt 0 ]]
