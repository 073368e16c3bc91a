#!/usr/bin/env bash
# Style checks in one command: clang-format (dry run) over every C++ file and
# clang-tidy over the sources in the compile database.
#   tests/lint.sh [--fix]   (--fix rewrites files with clang-format)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${SPECSTREAM_BUILD_DIR:-build}
mapfile -t files < <(git ls-files '*.h' '*.cc')
if [[ "${1:-}" == "--fix" ]]; then
  clang-format -i "${files[@]}"
else
  clang-format --dry-run --Werror "${files[@]}"
fi
if [[ -f "$BUILD/compile_commands.json" ]]; then
  mapfile -t sources < <(git ls-files 'common/*.cc' 'teacher/*.cc' 'student/*.cc' 'services/*.cc')
  clang-tidy -p "$BUILD" --quiet "${sources[@]}"
else
  echo "lint: no $BUILD/compile_commands.json; run tests/run.sh first for clang-tidy" >&2
fi
