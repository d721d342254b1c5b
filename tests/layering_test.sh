#!/usr/bin/env bash
# Enforces the one-way layering of ARCHITECTURE.md: kernels <- model <- runtime <- actors <- tools,
# runtime <- storage <- transport <- actors; runtime <- sim <- tools; no CAF outside actors/ and tools/.
set -u
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
[ $fail = 0 ] && echo "layering ok"
exit $fail
