#!/usr/bin/env bash
# Clang's thread-safety analysis (-Wthread-safety) over every translation
# unit that declares or uses lock annotations (ABSL_GUARDED_BY,
# ABSL_EXCLUSIVE_LOCKS_REQUIRED, ABSL_LOCKS_EXCLUDED), with the build's own
# compile commands: a member read without its mutex, or a *Locked function
# called without the lock, is an error. g++ ignores the annotations, so this
# is what makes them true. tests/lint.sh and ctest (thread_safety) run it.
#
#   tests/thread_safety.sh [BUILD [FILE...]]   (default: build/, after a
#                                    build; every annotated file)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-${SPECSTREAM_BUILD_DIR:-build}}
if [[ ! -f "$BUILD/compile_commands.json" ]]; then
  echo "thread_safety: no $BUILD/compile_commands.json; build first" >&2
  exit 2
fi
# Clang cannot read GCC's precompiled headers: a copy of the compile
# database includes the header itself instead of CMake's PCH wrapper.
db=$(mktemp -d)
trap 'rm -rf "$db"' EXIT
sed -E 's#-include [^ ]*/cmake_pch\.hxx#-include '"$PWD"'/common/torch/torch_pch.h#g; s#-Winvalid-pch##g' \
  "$BUILD/compile_commands.json" >"$db/compile_commands.json"
annotated='ABSL_GUARDED_BY|ABSL_PT_GUARDED_BY|ABSL_EXCLUSIVE_LOCKS_REQUIRED|ABSL_LOCKS_EXCLUDED'
# Sources with annotations, and the sources beside headers with them.
if (($# > 1)); then
  sources=("${@:2}")
else
  mapfile -t sources < <(
    git grep -lE "$annotated" -- '*.h' '*.cc' | sed -E 's/\.h$/.cc/' | sort -u |
      while read -r f; do [[ -f "$f" ]] && echo "$f"; done)
fi
echo "thread_safety: ${#sources[@]} translation units"
# clang-tidy refuses to run with compiler diagnostics alone, so one check that
# never fires here (setjmp/longjmp) rides along.
clang-tidy -p "$db" --quiet --checks='-*,cert-err52-cpp,clang-diagnostic-thread-safety*' \
  --warnings-as-errors='clang-diagnostic-thread-safety*' \
  --extra-arg=-Wthread-safety --extra-arg=-Wno-unknown-warning-option "${sources[@]}"
echo "thread_safety: the lock annotations hold"
