#!/usr/bin/env bash
# Downloads the Debian 12 packages of tests/gpu/deb-packages.txt (about 40
# MB of .deb files) into DIR (default tests/gpu/debs, which git ignores), on
# a machine that has apt: this project's development machines, or any Debian
# 12 host or container. No root needed: `apt-get download` only fetches.
# Then copy DIR to the GPU machine (the device tool carries it) and point
# tests/gpu/run.sh at it with SPECSTREAM_DEPS_DEBS=DIR; run.sh unpacks the
# packages into SPECSTREAM_DEPS_PREFIX there (dpkg -x, or Python where dpkg
# is missing). Nothing is installed on either machine.
#   tests/gpu/fetch-deps.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-tests/gpu/debs}
mkdir -p "$out"
mapfile -t packages < <(grep -v '^\s*#' tests/gpu/deb-packages.txt | grep -v '^\s*$')
(cd "$out" && apt-get download "${packages[@]}")
echo "fetch-deps: $(ls "$out"/*.deb | wc -l) packages, $(du -sh "$out" | cut -f1), in $out"
