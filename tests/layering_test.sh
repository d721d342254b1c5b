#!/usr/bin/env bash
# Enforces the one-way layering of ARCHITECTURE.md: kernels <- model <- runtime <- actors <- tools,
# runtime <- storage <- transport <- actors; runtime <- sim <- tools; no CAF outside actors/ and tools/;
# and inside runtime/ its own layers (runtime/README.md):
#   0 base/ < 1 structured/, vision/ < 2 core/, serve/ < 3 placement/ < 4 ep/, config/ < 5 engine/.
# `layering_test.sh SRC` checks the tree; `layering_test.sh --self-test SRC` plants a forbidden
# include in a copy of runtime/ and a source file at its top level, and passes only if this
# check then fails naming each of them.
set -u
if [ "${1:-}" = "--self-test" ]; then
  src=${2:?source dir}
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/tests"
  cp -r "$src/runtime" "$tmp/runtime"
  for d in kernels model storage transport actors sim tools; do mkdir -p "$tmp/$d"; done
  "$0" "$tmp" > "$tmp/clean.log" 2>&1 || { echo "self-test: the unplanted copy already fails:"; cat "$tmp/clean.log"; exit 1; }
  status=0
  plant() {  # file (relative to the copy), line to add, what the failure must name
    cp "$tmp/$1" "$tmp/$1.orig"
    echo "$2" >> "$tmp/$1"
    if "$0" "$tmp" > "$tmp/planted.log" 2>&1; then
      echo "self-test: '$2' in $1 was not caught"; status=1
    elif ! grep -q "$3" "$tmp/planted.log"; then
      echo "self-test: '$2' in $1 failed without naming $3:"; cat "$tmp/planted.log"; status=1
    else
      echo "self-test: caught '$2' in $1"
    fi
    mv "$tmp/$1.orig" "$tmp/$1"
  }
  plant runtime/base/ids.hpp '#include "runtime/core/request.hpp"' 'runtime/base/'
  plant runtime/structured/constraint.hpp '#include "runtime/vision/image.hpp"' 'runtime/structured/'
  plant runtime/core/request.hpp '#include "runtime/serve/openai_api.hpp"' 'runtime/core/'
  plant runtime/placement/eplb.hpp '#include "runtime/ep/expert_parallel.hpp"' 'runtime/placement/'
  plant runtime/config/node_config.hpp '#include "runtime/core/handoff.hpp"' 'runtime/config/'
  plant runtime/engine/engine.hpp '#include "runtime/config/node_config.hpp"' 'runtime/engine/'
  plant runtime/engine/engine.hpp '#include "storage/chunk_store.hpp"' 'runtime/'
  plant runtime/ep/expert_parallel.cpp '#include "kernels/cpu/ops.hpp"' 'model/backend.hpp only'
  echo '// planted' > "$tmp/runtime/planted.cpp"
  if "$0" "$tmp" > "$tmp/planted.log" 2>&1 || ! grep -q "planted.cpp" "$tmp/planted.log"; then
    echo "self-test: a source file at runtime/'s top level was not caught"; status=1
  else
    echo "self-test: caught a source file at runtime/'s top level"
  fi
  [ $status = 0 ] && echo "layering self-test ok"
  exit $status
fi
root=${1:?source dir}
fail=0
check() {  # folder, forbidden include pattern, reason
  local hits
  hits=$(grep -rnE "#\s*include\s*[<\"]($2)" "$root/$1" --include='*.hpp' --include='*.cpp' --include='*.h' --include='*.cu' --include='*.cuh' 2>/dev/null)
  if [ -n "$hits" ]; then
    echo "layering violation in $1/ ($3):"; echo "$hits"; fail=1
  fi
}
for d in kernels model runtime storage transport sim; do check "$d" 'caf/' "no CAF below actors/"; done
check kernels 'model/|runtime/|storage/|actors/|tools/' "kernels includes only itself"
check model 'runtime/|storage/|actors/|tools/' "model knows nothing of the engine"
check runtime 'storage/|actors/|tools/' "runtime is below storage and actors"
check storage 'model/|actors/|tools/' "storage sits on runtime only"
check transport 'model/|actors/|tools/' "transport sits on runtime and storage"
check runtime 'transport/' "runtime holds the interface, not the backends"
check storage 'transport/' "storage is below transport"
check actors 'tools/|sim/' "tools consume actors, not the reverse"
check sim 'caf/|actors/|tools/|storage/|transport/' "the simulator runs runtime's state machines only"
check runtime 'sim/' "runtime is below the simulator"

# runtime/'s own layers: each folder may include itself and the folders named after it.
check_pcre() {  # the same as check, with a Perl pattern (negative look-ahead)
  local hits
  hits=$(grep -rnP "#\s*include\s*[<\"]($2)" "$root/$1" --include='*.hpp' --include='*.cpp' --include='*.h' 2>/dev/null)
  if [ -n "$hits" ]; then
    echo "layering violation in $1/ ($3):"; echo "$hits"; fail=1
  fi
}
runtime_layer() {
  local allowed="$1" l
  for l in $2; do allowed="$allowed|$l"; done
  if [ ! -d "$root/runtime/$1" ]; then echo "runtime/$1/ is missing"; fail=1; return; fi
  check_pcre "runtime/$1" "runtime/(?!($allowed)/)" "may include only runtime/ folders $(echo "$1 $2" | tr ' ' ',')"
}
# Compute is the backend's (model/backend.hpp): runtime/ includes no kernels/ header but the
# assertion one.
check_pcre runtime "kernels/(?!assert\\.hpp)" "runtime reaches compute through model/backend.hpp only"
runtime_layer base ""
runtime_layer structured "base"
runtime_layer vision "base"
runtime_layer core "base structured vision"
runtime_layer serve "base structured vision"
runtime_layer placement "base core"
runtime_layer ep "base placement"
runtime_layer config "base placement"
runtime_layer engine "base structured vision core placement ep"
for d in "$root"/runtime/*/; do
  case "$(basename "$d")" in base|structured|vision|core|serve|placement|ep|config|engine) ;;
    *) echo "runtime/$(basename "$d")/ is not one of runtime's layers (tests/layering_test.sh)"; fail=1 ;;
  esac
done
top=$(find "$root/runtime" -maxdepth 1 -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' \))
if [ -n "$top" ]; then
  echo "source files at runtime/'s top level (each belongs in one of its layers):"; echo "$top"; fail=1
fi
[ $fail = 0 ] && echo "layering ok"
exit $fail
