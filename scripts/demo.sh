#!/usr/bin/env bash
# The main job for now: set-up, Release build, generate the default model (preset `small`,
# DeepSeek-V3 tokenizer) if absent, and run the offline inference demo on it.
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache hits across clones in different folders (CI clones afresh each run)
export CCACHE_BASEDIR="$PWD"
./scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > build.configure.log 2>&1 \
  || { cat build.configure.log; exit 1; }
cmake --build build -j "$(nproc)" --target shoal offline_inference
model=${SHOAL_MODEL_DIR:-models/small}
if [ ! -f "$model/config.json" ]; then
  echo "generating the default model (preset small) into $model ..."
  ./build/tools/shoal mkmodel --preset small --seed 0 --out "$model"
fi
./build/tools/offline_inference "$model" "$@"
