# Sourced (after `set -euo pipefail`) by the scripts that run on
# SmolLM2-135M-Instruct (tests/bench/quality_bench.sh, tests/bench/
# quality_curve.sh, tests/interop/vllm_interop.sh), with their arguments
# BUILD_DIR [WORK_DIR ...]. Sets:
#   ROOT   the repository
#   BUILD  BUILD_DIR, absolute; BIN its binaries
#   WORK   WORK_DIR, made and absolute; without one, a temporary directory
#          removed when the script exits
#   GGUF   the SmolLM2 fixture (tests/testing/fetch_smollm2.sh puts it there)
#   DATA   the committed prompts and answers (tests/data/smollm2)
# shellcheck shell=bash
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=$(realpath "$1")
WORK=${2:-}
if [[ -z "$WORK" ]]; then
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
fi
mkdir -p "$WORK"
WORK=$(realpath "$WORK")
BIN=$BUILD/bin
GGUF=$BUILD/fixtures/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
DATA=$ROOT/tests/data/smollm2
