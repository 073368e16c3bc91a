#!/usr/bin/env bash
# The unit and integration suites against a LibTorch 2.x: the one inside pip
# torch 2.13.0 (CPU) in a venv, built in its own directory. Benchmarks are
# left out (SPECSTREAM_BUILD_BENCHMARKS=OFF). tests/run.sh calls it.
#
#   tests/torch2.sh                    venv .venv-torch2, build build-torch2
#   TORCH2_VERSION=2.14.1 tests/torch2.sh   another pip torch
#   CTEST_ARGS="-R Blocks" tests/torch2.sh  extra ctest arguments
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT}  # ccache hits across clones (tests/run.sh)
VENV=${TORCH2_VENV:-$ROOT/.venv-torch2}
BUILD=${TORCH2_BUILD_DIR:-$ROOT/build-torch2}
VERSION=${TORCH2_VERSION:-2.13.0}
start=$(date +%s)

tests/testing/pip_torch.sh "$VENV" "$VERSION"
prefix=$("$VENV/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
echo "torch2.sh: LibTorch $VERSION at $prefix"

cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" -DCMAKE_PREFIX_PATH="$prefix" \
  -DSPECSTREAM_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$BUILD"
echo "torch2.sh: build done after $(( $(date +%s) - start )) s"

# The tokenizer parity fixtures and SmolLM2, as tests/run.sh fetches them
# for build/ (SmolLM2 and its venv are shared through the machine's cache),
# and the Kubernetes check packages (shared with build/; a no-op when there).
bash tests/testing/fetch_fixtures.sh "$BUILD/fixtures"
bash tests/testing/fetch_smollm2.sh "$BUILD/fixtures"
bash tests/k8s/install.sh

# shellcheck disable=SC2086
# The lint-labelled checks (clang's lock analysis) read sources, not the
# LibTorch version: tests/run.sh ran them on the first build.
# The vLLM judge of the exports (label interop) runs once, on 1.13's build:
# an export's bytes do not depend on the LibTorch that wrote them.
ctest --test-dir "$BUILD" --output-on-failure --no-tests=error -j2 -LE "lint|interop" ${CTEST_ARGS:-}
echo "torch2.sh: unit and integration suites on LibTorch $VERSION green after $(( $(date +%s) - start )) s"
