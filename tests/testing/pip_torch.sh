#!/usr/bin/env bash
# Makes VENV hold pip torch VERSION (a no-op when it does); prints nothing
# on success. `cuda` as the third argument also requires a CUDA build.
# The project's machines carry these wheels on disk (pip's find-links), so
# nothing large is downloaded.
#   tests/testing/pip_torch.sh VENV VERSION [cuda]
set -euo pipefail
venv=$1 version=$2 kind=${3:-any}
want_cuda=0
[[ "$kind" == "cuda" ]] && want_cuda=1
if "$venv/bin/python" -c "
import sys, torch
ok = torch.__version__.split('+')[0] == '$version' and (not $want_cuda or torch.version.cuda)
sys.exit(0 if ok else 1)" 2>/dev/null; then
  exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet "torch==$version" 2>&1 | grep -v "^WARNING: Location" || true
"$venv/bin/python" -c "
import sys, torch
ok = torch.__version__.split('+')[0] == '$version' and (not $want_cuda or torch.version.cuda)
sys.exit(0 if ok else 1)" 2>/dev/null || {
  echo "pip_torch.sh: torch==$version ($kind) did not install into $venv" >&2
  exit 1
}
