#!/usr/bin/env bash
# The main job: set-up, Release build, generate the default model (preset `small`, DeepSeek-V3
# tokenizer) if absent, start the 3-process loopback cluster (config/local-3node: a gateway
# node and two engine nodes whose 4 ranks form one expert-parallel group), show a chat
# completion and a streamed completion through the OpenAI API, then serve until Ctrl-C
# (`--once`: stop after the two requests). The offline demo without a cluster:
# build/tools/offline_inference models/small.
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache hits across clones in different folders (CI clones afresh each run)
export CCACHE_BASEDIR="$PWD"
./scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > build.configure.log 2>&1 \
  || { cat build.configure.log; exit 1; }
cmake --build build -j "$(nproc)" --target shoal shoald offline_inference
model=models/small
if [ ! -f "$model/config.json" ]; then
  echo "generating the default model (preset small) into $model ..."
  ./build/tools/shoal mkmodel --preset small --seed 0 --out "$model"
fi
./build/tools/shoal down > /dev/null 2>&1 || true
./build/tools/shoal up --config config/local-3node
trap './build/tools/shoal down' EXIT
api=http://127.0.0.1:8000/v1
echo
echo "== POST $api/chat/completions"
curl -sS "$api/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "small", "messages": [{"role": "user", "content": "Write a haiku about the sea."}], "max_tokens": 24}'
echo
echo
echo "== POST $api/completions (stream)"
curl -sSN "$api/completions" -H 'Content-Type: application/json' \
  -d '{"model": "small", "prompt": "The three laws of thermodynamics", "max_tokens": 16, "stream": true}'
echo
echo "(random weights: the text is noise; the flow is real)"
if [ "${1:-}" = "--once" ]; then
  exit 0
fi
echo
echo "serving on $api (shell: build/tools/shoal shell --connect 127.0.0.1:7100); Ctrl-C stops the cluster"
while true; do sleep 3600; done
