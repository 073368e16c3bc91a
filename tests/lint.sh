#!/usr/bin/env bash
# Style checks in one command: the include rules (tests/check_includes.sh),
# clang-format (dry run) over every C++ file, clang-tidy over the sources in
# the compile database, and clang's thread-safety analysis of the lock
# annotations (tests/thread_safety.sh).
#   tests/lint.sh [--fix]   (--fix rewrites files with clang-format)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${SPECSTREAM_BUILD_DIR:-build}
tests/check_includes.sh
mapfile -t files < <(git ls-files '*.h' '*.cc')
if [[ "${1:-}" == "--fix" ]]; then
  clang-format -i "${files[@]}"
else
  clang-format --dry-run --Werror "${files[@]}"
fi
if [[ -f "$BUILD/compile_commands.json" ]]; then
  mapfile -t sources < <(git ls-files 'common/*.cc' 'teacher/*.cc' 'student/*.cc' 'services/*.cc')
  clang-tidy -p "$BUILD" --quiet "${sources[@]}"
  tests/thread_safety.sh "$BUILD"
else
  echo "lint: no $BUILD/compile_commands.json; run tests/run.sh first for clang-tidy" >&2
fi
