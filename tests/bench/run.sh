#!/usr/bin/env bash
# The benchmarks' full tier: every benchmark at its full sizes, against the
# same floors as CI's quick tier (tests/bench/CMakeLists.txt; label full, and
# the benchmarks with one size). Run it by hand, and before each landing
# that touches performance; `tests/run.sh FULL=1` runs it as part of
# everything. It takes about 45 minutes on the 2-core machine, the quality
# benchmark's four drafts most of it.
#
#   tests/bench/run.sh [BUILD_DIR]      build/ by default, as tests/run.sh leaves it
#   CTEST_ARGS="-R student" tests/bench/run.sh   extra ctest arguments
#   CURVE=1 tests/bench/run.sh          then the learning curve (about 100 more
#                                       minutes; tests/bench/quality_curve.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=$(realpath "${1:-${SPECSTREAM_BUILD_DIR:-$ROOT/build}}")
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT}
if [[ ! -f "$BUILD/CTestTestfile.cmake" ]]; then
  echo "bench/run.sh: $BUILD is not a configured build; run ./tests/run.sh first" >&2
  exit 2
fi
cmake --build "$BUILD"
# The quality benchmark's target (tests/run.sh fetched it already for build/).
bash tests/testing/fetch_smollm2.sh "$BUILD/fixtures"
# shellcheck disable=SC2086
ctest --test-dir "$BUILD" --output-on-failure --no-tests=error -L bench -LE quick ${CTEST_ARGS:-}
if [[ -f "$BUILD/quality_bench_full/table.md" ]]; then
  echo "bench/run.sh: quality_bench_full on SmolLM2-135M-Instruct:"
  cat "$BUILD/quality_bench_full/table.md"
fi
if [[ "${CURVE:-0}" == 1 ]]; then
  bash tests/bench/quality_curve.sh "$BUILD" "$BUILD/quality_curve"
fi
