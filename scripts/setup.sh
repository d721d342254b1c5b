#!/usr/bin/env bash
# Installs the Debian packages shoal builds against (only the missing ones), on Debian 12.
# Safe to run repeatedly; needs root (or sudo) only when something is missing.
set -euo pipefail
pkgs=(build-essential cmake ninja-build ccache pkg-config git
      libcaf-dev libfabric-dev libfabric-bin libisal-dev libmsgpack-cxx-dev doctest-dev
      libtomlplusplus-dev nlohmann-json3-dev libre2-dev libreadline-dev libfmt-dev libspdlog-dev
      libcli11-dev libxxhash-dev libbenchmark-dev libopenblas-dev libboost-dev libboost-system-dev
      libssl-dev libpng-dev libjpeg62-turbo-dev libpcre2-dev curl python3 python3-numpy python3-jsonschema
      prometheus  # promtool checks the metrics endpoints' exposition format in the tests
      clang-16 libclang-rt-16-dev  # the fuzzers' build (libFuzzer, ASan, UBSan): scripts/fuzz.sh
      openssl  # scripts/make-cluster-certs.sh: the cluster CA and node certificates (TLS tests)
      libdnnl-dev  # oneDNN: bench engine sets its bf16 GEMM beside matmul_bf16 (bench_onednn.cpp)
      iproute2)  # ip netns: the cluster test across network namespaces (tests/tools/netns_cluster_test.cpp)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Optional: the official openai npm client for tests/actors/gateway_clients_test.cpp, where
# npm and its registry are reachable (the pinned version of tests/clients/package-lock.json).
clients="$(dirname "$0")/../tests/clients"
if command -v npm > /dev/null && [ ! -f "$clients/node_modules/openai/package.json" ]; then
  timeout 120 npm ci --prefix "$clients" --no-audit --no-fund > /dev/null 2>&1 \
    || echo "setup: npm could not install tests/clients (the openai client test will not run)"
fi
