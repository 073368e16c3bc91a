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
# A copy of the compile database that clang-tidy can use:
#  * clang cannot read GCC's precompiled headers, so each command drops
#    CMake's PCH wrapper (sources include what they use; a TU that includes
#    no LibTorch header then parses none);
#  * a unity build (SPECSTREAM_UNITY_BUILD) compiles generated unity_N_cxx.cxx
#    files that include a target's sources: each of those sources gets the
#    unity file's command, so it is analysed alone with its target's flags.
db=$(mktemp -d)
trap 'rm -rf "$db"' EXIT
python3 - "$BUILD/compile_commands.json" "$db/compile_commands.json" "$PWD" <<'PY'
import json, re, sys
src, dst, root = sys.argv[1:]
pch = re.compile(r"-include \S*/cmake_pch\.hxx")
out = []
for entry in json.load(open(src)):
    command = pch.sub("", entry["command"])
    command = command.replace("-Winvalid-pch", "")
    files = [entry["file"]]
    if re.search(r"/unity_\d+_cxx\.cxx$", entry["file"]):
        files = re.findall(r'^#include "([^"]+)"', open(entry["file"]).read(), re.M)
    for f in files:
        out.append({"directory": entry["directory"], "file": f,
                    "command": command.replace(entry["file"], f)})
json.dump(out, open(dst, "w"), indent=0)
PY
annotated='ABSL_GUARDED_BY|ABSL_PT_GUARDED_BY|ABSL_EXCLUSIVE_LOCKS_REQUIRED|ABSL_LOCKS_EXCLUDED'
# Sources with annotations, and the sources beside headers with them.
if (($# > 1)); then
  sources=("${@:2}")
else
  mapfile -t sources < <(
    git grep -lE "$annotated" -- '*.h' '*.cc' | sed -E 's/\.h$/.cc/' | sort -u |
      while read -r f; do [[ -f "$f" ]] && echo "$f"; done)
fi
# Nothing to analyse means a wrong tree or a broken search, not a pass.
if ((${#sources[@]} == 0)); then
  echo "thread_safety: no annotated translation unit found; nothing would be checked" >&2
  exit 1
fi
for f in "${sources[@]}"; do
  [[ -f "$f" ]] || { echo "thread_safety: $f: no such file" >&2; exit 1; }
done
echo "thread_safety: ${#sources[@]} translation units"
# clang-tidy refuses to run with compiler diagnostics alone, so one check that
# never fires here (setjmp/longjmp) rides along.
clang-tidy -p "$db" --quiet --checks='-*,cert-err52-cpp,clang-diagnostic-thread-safety*' \
  --warnings-as-errors='clang-diagnostic-thread-safety*' \
  --extra-arg=-Wthread-safety --extra-arg=-Wno-unknown-warning-option "${sources[@]}"
echo "thread_safety: the lock annotations hold"
