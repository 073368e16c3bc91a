#!/usr/bin/env bash
# The LibTorch 2.x pass, on the CUDA build of pip torch 2.14.1 (cu130, with
# its nvidia-* wheels: about 5.5 GB, in a venv kept once per machine in
# ~/.cache/specstream, $SPECSTREAM_CACHE), in build-torch2/ with
# NCCL process groups ON. It
#   * compiles and links the CUDA code paths: the daemons, the NCCL process
#     groups and payload channel (specstream_nccl, nccl_channel_test,
#     nccl_bench) and the GPU checks (tests/gpu: gpu_test, gpu_bench), which
#     a GPU machine runs (docs/gpu.md);
#   * builds and runs the suites labelled `versions` (target versions_suite):
#     the tests of the code that differs between LibTorch versions (c10d
#     Backend vs ProcessGroup, DDP, CP, TP and EP, devices, checkpoints'
#     generator state, the kernels' numerics, the runtimes against HF and the
#     daemons end to end). Without a GPU the CUDA LibTorch computes on the
#     CPU, so they run as they do on 1.13.
# Everything else is the same source on either version and runs once, on
# 1.13 (tests/run.sh). tests/run.sh calls this script; `tests/run.sh FULL=1`
# sets TORCH2_ALL=1.
#
#   tests/torch2.sh                    the versions suites and the CUDA targets
#   tests/torch2.sh --install          only install the pip torch (tests/run.sh
#                                      does it while it builds)
#   TORCH2_ALL=1 tests/torch2.sh       every unit and integration suite
#   TORCH2_VERSION=2.13.0 TORCH2_KIND=cpu TORCH2_VENV=/tmp/torch213 tests/torch2.sh
#                                      another pip torch (a CPU one: no CUDA targets)
#   CTEST_ARGS="-R Blocks" tests/torch2.sh  extra ctest arguments
#   TORCH2_OPT=-O2 tests/torch2.sh     the optimisation level (default -O0)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT}  # ccache hits across clones (tests/run.sh)
VENV=${TORCH2_VENV:-${SPECSTREAM_CACHE:-$HOME/.cache/specstream}/venv-torch-2.14.1-cuda}
BUILD=${TORCH2_BUILD_DIR:-$ROOT/build-torch2}
VERSION=${TORCH2_VERSION:-2.14.1}
KIND=${TORCH2_KIND:-cuda}
start=$(date +%s)

tests/testing/pip_torch.sh "$VENV" "$VERSION" "$KIND"
[[ "${1:-}" != "--install" ]] || exit 0
prefix=$("$VENV/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
cuda=$("$VENV/bin/python" -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null)
echo "torch2.sh: LibTorch $VERSION (CUDA ${cuda:-none}) at $prefix"

nccl=OFF
[[ -n "$cuda" ]] && nccl=ON  # the point of a CUDA torch is to compile what uses NCCL
mkdir -p "$BUILD"
# At -O0: this pass checks that the code compiles, links and behaves the
# same on 2.x, not how fast it runs, and the tests' time is in LibTorch's
# kernels, not our code. Measured from a cold ccache: the build 496 s at -O2,
# 327 s at -O0; `ctest -L versions` 80 s and 83 s.
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="${TORCH2_OPT:--O0} -DNDEBUG" -DCMAKE_PREFIX_PATH="$prefix" \
  -DSPECSTREAM_WITH_NCCL=$nccl -DSPECSTREAM_BUILD_BENCHMARKS=$nccl \
  >"$BUILD/configure.log" 2>&1 || {
  cat "$BUILD/configure.log" >&2
  exit 1
}
targets=()
if [[ -n "$cuda" ]]; then
  if ! grep -q "SpecStream: NCCL process groups ON" "$BUILD/configure.log"; then
    grep "SpecStream:" "$BUILD/configure.log" >&2
    echo "torch2.sh: this CUDA LibTorch did not enable NCCL process groups" >&2
    exit 1
  fi
  targets+=(specstream_nccl nccl_channel_test nccl_bench gpu_test gpu_bench)
fi
if [[ -n "${TORCH2_ALL:-}" ]]; then
  cmake --build "$BUILD"
  labels=(-LE "lint|interop|bench")
else
  targets+=(versions_suite)
  labels=(-L versions)
fi
[[ ${#targets[@]} -eq 0 ]] || cmake --build "$BUILD" --target "${targets[@]}"
echo "torch2.sh: build done after $(( $(date +%s) - start )) s"

# The tokenizer parity fixtures and SmolLM2, as tests/run.sh fetches them
# for build/ (SmolLM2 and its venv are shared through the machine's cache),
# and the Kubernetes check packages (shared with build/; a no-op when there).
bash tests/testing/fetch_fixtures.sh "$BUILD/fixtures"
bash tests/testing/fetch_smollm2.sh "$BUILD/fixtures"
bash tests/k8s/install.sh

# The lint-labelled checks (clang's lock analysis) read sources, not the
# LibTorch version, and the vLLM judge of the exports (label interop) an
# export's bytes: both run once, on 1.13's build.
# One compute thread per test in the pool, as tests/run.sh runs it.
# shellcheck disable=SC2086
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ctest --test-dir "$BUILD" --output-on-failure --no-tests=error -j2 "${labels[@]}" ${CTEST_ARGS:-}
echo "torch2.sh: suites ${labels[*]} on LibTorch $VERSION green after $(( $(date +%s) - start )) s"
