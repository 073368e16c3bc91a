#!/usr/bin/env bash
# The GPU run: one command for a Linux x86-64 machine with an NVIDIA GPU and
# a pip or conda CUDA torch, but none of the Debian dev packages this
# project builds with. It
#   1. unpacks those packages (tests/gpu/deb-packages.txt, fetched by
#      tests/gpu/fetch-deps.sh on a machine with apt) into a prefix, unless
#      the prefix is filled already;
#   2. builds the project against the torch's LibTorch with NCCL on;
#   3. runs the gpu-labelled tests and the GPU benchmarks (ctest -L gpu);
#   4. writes one summary file: the GPU, the versions, every gpu test's
#      result and every benchmark's figures.
# Exits non-zero when a step fails or a gpu test does not pass.
#
# Environment:
#   PYTHON                  the Python whose torch to use (default python3)
#   SPECSTREAM_DEPS_PREFIX  the unpacked packages (default build-gpu/deps)
#   SPECSTREAM_DEPS_DEBS    the .deb files to unpack (default tests/gpu/debs)
#   GPU_BUILD_DIR           the build directory (default build-gpu)
#   GPU_SUMMARY             the summary file (default $GPU_BUILD_DIR/gpu-summary.txt;
#                           the device tool: $OUT/gpu-summary.txt)
#   CTEST_ARGS              extra ctest arguments (e.g. -R Runtime)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
BUILD=${GPU_BUILD_DIR:-$ROOT/build-gpu}
PREFIX=${SPECSTREAM_DEPS_PREFIX:-$BUILD/deps}
DEBS=${SPECSTREAM_DEPS_DEBS:-$ROOT/tests/gpu/debs}
SUMMARY=${GPU_SUMMARY:-$BUILD/gpu-summary.txt}
start=$(date +%s)
step() { echo "gpu/run.sh: $* ($(( $(date +%s) - start )) s)"; }
mkdir -p "$BUILD" "$(dirname "$SUMMARY")"

# --- The GPU and the torch ----------------------------------------------------------
"$PYTHON" - <<'PY' >"$BUILD/torch.txt" || { cat "$BUILD/torch.txt"; exit 1; }
import sys, torch
if torch.version.cuda is None or not torch.cuda.is_available():
    sys.exit(f"gpu/run.sh: torch {torch.__version__} has no usable CUDA device")
print(f"gpu: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}")
print(f"torch: {torch.__version__} (CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))})")
print(f"cmake_prefix_path: {torch.utils.cmake_prefix_path}")
try:
    import transformers
    print(f"transformers: {transformers.__version__}")
except ImportError:
    print("transformers: not importable (its comparisons skip)")
PY
cat "$BUILD/torch.txt"
torch_prefix=$(sed -n 's/^cmake_prefix_path: //p' "$BUILD/torch.txt")

# --- The Debian packages, unpacked into a prefix ------------------------------------------
if [[ ! -d "$PREFIX/usr/include/grpcpp" ]]; then
  shopt -s nullglob
  debs=("$DEBS"/*.deb)
  if ((${#debs[@]} == 0)); then
    echo "gpu/run.sh: no $PREFIX/usr and no .deb files in $DEBS; run tests/gpu/fetch-deps.sh" \
      "on a machine with apt and bring its output here" >&2
    exit 1
  fi
  if command -v dpkg >/dev/null; then
    for deb in "${debs[@]}"; do dpkg -x "$deb" "$PREFIX"; done
  else
    "$PYTHON" tests/gpu/unpack_debs.py "$PREFIX" "${debs[@]}"
  fi
  step "unpacked ${#debs[@]} packages into $PREFIX"
fi
arch_lib="$PREFIX/usr/lib/x86_64-linux-gnu"
export PATH="$PREFIX/usr/bin:$PATH"
export LD_LIBRARY_PATH="$arch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$arch_lib/pkgconfig:$PREFIX/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$PREFIX"

# --- Build ----------------------------------------------------------------------------
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
  -DCMAKE_PREFIX_PATH="$torch_prefix;$PREFIX/usr" -DSPECSTREAM_WITH_NCCL=ON \
  -DSPECSTREAM_GPU_PYTHON="$(command -v "$PYTHON")" >"$BUILD/configure.log" 2>&1 || {
  cat "$BUILD/configure.log" >&2
  exit 1
}
grep "SpecStream:" "$BUILD/configure.log"
grep -q "SpecStream: NCCL process groups ON" "$BUILD/configure.log" || {
  echo "gpu/run.sh: this torch did not enable NCCL process groups" >&2
  exit 1
}
cmake --build "$BUILD"
step "built"

# --- The gpu tests and benchmarks ---------------------------------------------------------
status=0
# shellcheck disable=SC2086
ctest --test-dir "$BUILD" -L gpu --output-on-failure --no-tests=error \
  --output-log "$BUILD/gpu-ctest.log" ${CTEST_ARGS:-} || status=$?
step "gpu tests and benchmarks done (ctest exit $status)"

{
  echo "SpecStream GPU run, $(date -u '+%Y-%m-%d %H:%M UTC'), $(( $(date +%s) - start )) s"
  cat "$BUILD/torch.txt" | grep -v cmake_prefix_path
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
    sed 's/^/nvidia-smi: /' || true
  echo
  echo "Tests (ctest -L gpu):"
  grep -E "Test +#" "$BUILD/gpu-ctest.log" | sed -E 's/ +\.+ */ /' || true
  echo
  echo "Figures:"
  grep -h "^SUMMARY " "$BUILD/gpu-ctest.log" | sed 's/^SUMMARY /  /' || true
} >"$SUMMARY"
cat "$SUMMARY"
exit "$status"
