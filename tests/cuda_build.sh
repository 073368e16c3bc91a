#!/usr/bin/env bash
# Compiles and links the CUDA code paths on a machine without a GPU: the
# teacher, the student and the NCCL targets (NCCL process groups, the NCCL
# payload channel and its GPU test and benchmark) and the GPU checks
# (tests/gpu: gpu_test, gpu_bench) against the CUDA build of
# pip torch 2.14.1 (torch and its nvidia-* wheels, about 5.5 GB) in
# .venv-cuda, in build-cuda/. At -O0: nothing built here runs (a GPU
# machine runs it: docs/testing.md), so this checks that the code compiles
# and links, fast. tests/run.sh calls it.
#
#   tests/cuda_build.sh                        venv .venv-cuda, build build-cuda
#   CUDA_TORCH_VERSION=2.15.0 tests/cuda_build.sh   another pip CUDA torch
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT}  # ccache hits across clones (tests/run.sh)
VENV=${CUDA_TORCH_VENV:-$ROOT/.venv-cuda}
BUILD=${CUDA_BUILD_DIR:-$ROOT/build-cuda}
VERSION=${CUDA_TORCH_VERSION:-2.14.1}
start=$(date +%s)

tests/testing/pip_torch.sh "$VENV" "$VERSION" cuda
prefix=$("$VENV/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
cuda=$("$VENV/bin/python" -c 'import torch; print(torch.version.cuda)' 2>/dev/null)
echo "cuda_build.sh: LibTorch $VERSION (CUDA $cuda) at $prefix, after $(( $(date +%s) - start )) s"

# NCCL is required here: the point is to compile what uses it.
mkdir -p "$BUILD"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O0 -DNDEBUG" -DCMAKE_PREFIX_PATH="$prefix" \
  -DSPECSTREAM_WITH_NCCL=ON -DSPECSTREAM_BUILD_TESTS=ON -DSPECSTREAM_BUILD_BENCHMARKS=ON \
  >"$BUILD/configure.log" 2>&1 || {
  cat "$BUILD/configure.log" >&2
  exit 1
}
if ! grep -q "SpecStream: NCCL process groups ON" "$BUILD/configure.log"; then
  grep "SpecStream:" "$BUILD/configure.log" >&2
  echo "cuda_build.sh: this LibTorch did not enable NCCL process groups" >&2
  exit 1
fi
cmake --build "$BUILD" --target specstream-teacher specstream-student specstream_nccl \
  nccl_channel_test nccl_bench gpu_test gpu_bench
echo "cuda_build.sh: CUDA targets compiled and linked against LibTorch $VERSION after" \
  "$(( $(date +%s) - start )) s"
