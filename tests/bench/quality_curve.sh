#!/usr/bin/env bash
# The learning curve (P19; full benchmark tier, outside CI; docs/evaluation.md):
# an EAGLE-3 draft (EAGLE 3.1 with CURVE_KIND=eagle31) for SmolLM2-135M-Instruct
# trained on more data than the quality benchmark's, with real τ(T = 0) on the
# 24 held-out prompts and the wall-clock ratio against target-only decoding at
# several training budgets up to CURVE_MINUTES of training on this machine.
#
# The data: every training prompt (id % 10 != 9; the held-out ones are never
# answered, trained on or seen) with the committed answers
# (tests/data/smollm2/answers.jsonl, the target's own); new prompts the target
# writes itself from seed topics (tests/data/smollm2/topics.txt), with its
# greedy answers; and CURVE_ANSWERS more answers per prompt, old and new,
# sampled from the target at CURVE_TEMPERATURE, each with its own seed
# (`specstream-eval generate --batch`, answers decoded together).
#
# The budgets: one run of the quality benchmark's recipe (lr 5e-3, K = 7,
# draft vocab 4096, batch 1) with a constant step size after a short warmup,
# long enough for CURVE_MINUTES (the step rate measured first on a short
# run), checkpointed every 1/16 of it; the checkpoints at the fractions
# CURVE_POINTS of the run are the budgets (with a constant step size, a
# checkpoint of the long run is what a run stopped there would have been).
# Every budget's draft decodes the held-out prompts in one
# `specstream-eval speculate`, which measures target-only decoding in the
# same run.
#
#   tests/bench/quality_curve.sh BUILD_DIR [WORK_DIR]
#
# Writes WORK_DIR/curve.md (the table) and WORK_DIR/curve.png (τ and the wall
# ratio against training minutes and tokens; matplotlib from PyPI in a venv
# under BUILD_DIR/plot-venv); CURVE_DOCS=1 copies them to
# docs/quality_curve.md and docs/images/quality_curve.png.
# Environment (defaults are the full run, about 100 minutes in all: 32 of
# them writing the data, 57 training, 10 decoding):
#   CURVE_MINUTES (60), CURVE_POINTS ("0.0625 0.125 0.25 0.5 1"),
#   CURVE_ANSWERS (1), CURVE_TOPIC_SEEDS (2; 0: no target-written prompts),
#   CURVE_TEMPERATURE (0.8), CURVE_MAX_NEW (160),
#   CURVE_BATCH (8), CURVE_TRAIN_PROMPTS (0: all 216), CURVE_PROMPTS (24),
#   CURVE_EVAL_MAX_NEW (64), CURVE_KIND (eagle3 | eagle31).
set -euo pipefail
# ROOT, BUILD, WORK, BIN, GGUF, DATA.
source "$(dirname "$0")/../testing/smollm2_script.sh"
MINUTES=${CURVE_MINUTES:-60}
POINTS=${CURVE_POINTS:-0.0625 0.125 0.25 0.5 1}
ANSWERS=${CURVE_ANSWERS:-1}
TOPIC_SEEDS=${CURVE_TOPIC_SEEDS:-2}
TEMPERATURE=${CURVE_TEMPERATURE:-0.8}
MAX_NEW=${CURVE_MAX_NEW:-160}
BATCH=${CURVE_BATCH:-8}
TRAIN_PROMPTS=${CURVE_TRAIN_PROMPTS:-0}
PROMPTS_N=${CURVE_PROMPTS:-24}
EVAL_MAX_NEW=${CURVE_EVAL_MAX_NEW:-64}
KIND=${CURVE_KIND:-eagle3}
start=$(date +%s)
stamp() { echo "quality_curve: $1 after $(( $(date +%s) - start )) s"; }
[[ -f "$GGUF" ]] || { echo "quality_curve: $GGUF is missing (tests/testing/fetch_smollm2.sh)" >&2; exit 1; }
case $KIND in
  eagle3) draft_extra="" ;;
  eagle31) draft_extra="
    fc_norm: true
    norm_output: true" ;;
  *) echo "quality_curve: CURVE_KIND $KIND: expected eagle3 or eagle31" >&2; exit 2 ;;
esac

# --- The data ---------------------------------------------------------------
rm -rf "$WORK/target" "$WORK/store-train" "$WORK"/ckpt-* "$WORK"/budget-* "$WORK/curve."*
"$BIN/specstream-teacher" import-gguf --gguf "$GGUF" --out "$WORK/target" >/dev/null
generate() {  # NAME [generate flags...]: the target's answers, to $WORK/NAME.jsonl
  local name=$1
  shift
  "$BIN/specstream-eval" generate --target "$WORK/target" --batch "$BATCH" \
    --out "$WORK/$name.jsonl" "$@" 2>"$WORK/$name.log" || { tail -5 "$WORK/$name.log" >&2; exit 1; }
}
# Target-written prompts: for every seed topic (tests/data/smollm2/topics.txt)
# the target is asked, in two phrasings and CURVE_TOPIC_SEEDS sampled tries,
# for a question a user might ask; the questions in what it writes (a
# sentence from a question word to a "?", 4 to 25 words, not about "question"
# itself) become new training prompts, ids from 1000 up skipping the held-out
# residue (id % 10 == 9), none equal to any committed prompt. The first three
# training prompts serve as the examples; no held-out prompt is shown.
python3 - "$DATA" "$WORK" "$TRAIN_PROMPTS" <<'PY'
import json, sys
data, work, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
train = [p for p in map(json.loads, open(f"{data}/prompts.jsonl")) if p["id"] % 10 != 9]
if limit > 0:
    train = train[:limit]
with open(f"{work}/prompts.jsonl", "w") as f:
    for p in train:
        f.write(json.dumps(p) + "\n")
examples = "\n".join(p["prompt"] for p in train[:3])
forms = ["Here are questions people ask an assistant:\n" + examples +
         "\n\nWrite one new question of this kind about {}.",
         "Give me one example of a question a beginner might ask about {}."]
topics = [t.strip() for t in open(f"{data}/topics.txt") if t.strip()]
with open(f"{work}/instructions.jsonl", "w") as f:
    for i, (topic, form) in enumerate((t, fm) for t in topics for fm in forms):
        f.write(json.dumps({"id": i, "prompt": form.format(topic)}) + "\n")
PY
for ((s = 1; s <= TOPIC_SEEDS; s++)); do
  generate "written-$s" --prompts "$WORK/instructions.jsonl" --split all --max-new 48 \
    --temperature "$TEMPERATURE" --seed $((s * 1000003))
done
python3 - "$DATA" "$WORK" "$TOPIC_SEEDS" <<'PY'
import json, re, sys
data, work, seeds = sys.argv[1], sys.argv[2], int(sys.argv[3])
key = lambda q: re.sub(r"\W+", " ", q.lower()).strip()
committed = {key(p["prompt"]) for p in map(json.loads, open(f"{data}/prompts.jsonl"))}
starts = {"what", "how", "why", "when", "where", "which", "who", "can", "could", "should",
          "is", "are", "do", "does", "would", "will"}
found, seen = [], set(committed)
for s in range(1, seeds + 1):
    for r in map(json.loads, open(f"{work}/written-{s}.jsonl")):
        for m in re.finditer(r'[A-Z][^?"\n!:]{8,160}\?', r["answer"]):
            q = re.split(r"(?<=[.!])\s+", m.group(0).strip())[-1]
            first = re.match(r"[A-Za-z]*", q).group(0).lower()
            if first not in starts or not 4 <= len(q.split()) <= 25 or "question" in q.lower():
                continue
            if key(q) not in seen:
                seen.add(key(q))
                found.append(q)
ids = [i for i in range(1000, 1000 + 2 * len(found) + 10) if i % 10 != 9][:len(found)]
with open(f"{work}/written.jsonl", "w") as f, open(f"{work}/prompts.jsonl", "a") as all_prompts:
    for i, q in zip(ids, found):
        line = json.dumps({"id": i, "prompt": q}) + "\n"
        f.write(line)
        all_prompts.write(line)
print(f"quality_curve: the target wrote {len(found)} new prompts")
PY
stamp "target-written prompts ready"
if [[ -s "$WORK/written.jsonl" ]]; then
  # Their greedy answers (the committed prompts have theirs in answers.jsonl).
  generate written-answers --prompts "$WORK/written.jsonl" --split all --max-new "$MAX_NEW" \
    --temperature 0
  stamp "greedy answers to the written prompts"
else
  : >"$WORK/written-answers.jsonl"
fi
for ((s = 1; s <= ANSWERS; s++)); do
  # Seeds far apart: prompt id i's answer is sampled with seed s * 100000 + i.
  generate "sampled-$s" --prompts "$WORK/prompts.jsonl" --split train --max-new "$MAX_NEW" \
    --temperature "$TEMPERATURE" --seed $((s * 100000))
  stamp "sampled answers $s of $ANSWERS written"
done
python3 - "$DATA/answers.jsonl" "$WORK" "$ANSWERS" "$TRAIN_PROMPTS" <<'PY'
import json, sys
committed, work, answers, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
records = [json.loads(l) for l in open(committed) if l.strip()]
records = [r for r in records if r["id"] % 10 != 9]
if limit > 0:
    ids = sorted({r["id"] for r in records})[:limit]
    records = [r for r in records if r["id"] in ids]
for name in ["written-answers"] + [f"sampled-{s}" for s in range(1, answers + 1)]:
    records += [json.loads(l) for l in open(f"{work}/{name}.jsonl") if l.strip()]
held = [r["id"] for r in records if r["id"] % 10 == 9]
if held:
    sys.exit(f"quality_curve: held-out prompts {held[:5]} reached the training data")
seen, rows = set(), []
for r in records:
    key = tuple(r["input_ids"])
    if key not in seen:
        seen.add(key)
        rows.append({"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]})
with open(f"{work}/train.jsonl", "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
tokens = sum(len(r["input_ids"]) for r in rows)
prompts = len({r["id"] for r in records})
written = sum(1 for _ in open(f"{work}/written.jsonl"))
json.dump({"samples": len(rows), "tokens": tokens, "prompts": prompts, "written": written},
          open(f"{work}/train-size.json", "w"))
print(f"quality_curve: {len(rows)} distinct training samples, {tokens} tokens, "
      f"{prompts} prompts ({written} written by the target); held-out prompts unseen")
PY
"$BIN/specstream-teacher" dump --model "$WORK/target" --data "$WORK/train.jsonl" \
  --out "$WORK/store-train" --keep-target-ids >/dev/null 2>"$WORK/dump.log" \
  || { tail -5 "$WORK/dump.log" >&2; exit 1; }
stamp "the store is written"

# --- Training -----------------------------------------------------------------
job() {  # NAME MAX_STEPS EVERY_STEPS
  cat >"$WORK/$1.yaml" <<YAML
name: curve-$1
data:
  store: $WORK/store-train
model:
  target: $WORK/target
  draft:
    draft_vocab_size: 4096$draft_extra
optimizer:
  lr: 5.0e-3
  warmup_ratio: 0.02
  schedule: constant
training:
  max_steps: $2
  batch_size: 1
  ttt_steps: 7
  seed: 0
  dtype: float32
  log_every: 50
checkpoint:
  dir: $WORK/ckpt-$1
  every_steps: $3
  keep_last: 0
YAML
}
# The step rate, from a short run.
job calibrate 60 0
t0=$(date +%s.%N)
"$BIN/specstream-student" train --config "$WORK/calibrate.yaml" >"$WORK/train-calibrate.log" 2>&1 \
  || { tail -20 "$WORK/train-calibrate.log" >&2; exit 1; }
t1=$(date +%s.%N)
read -r steps unit < <(python3 -c "
rate = 60 / ($t1 - $t0)
steps = max(16, int($MINUTES * 60 * rate) // 16 * 16)
print(steps, steps // 16)")
stamp "calibrated: $steps steps for $MINUTES minutes, a checkpoint every $unit"
job run "$steps" "$unit"
launched=$(date +%s.%N)
"$BIN/specstream-student" train --config "$WORK/run.yaml" \
  >"$WORK/train-run.log" 2>&1 || { tail -20 "$WORK/train-run.log" >&2; exit 1; }
stamp "trained $steps steps"

# --- The budgets, decoded -------------------------------------------------------
drafts=()
budgets=()
for p in $POINTS; do
  step=$(python3 -c "print(max(1, round($p * 16)) * $unit)")
  name=$(printf 'step-%08d' "$step")
  [[ -d "$WORK/ckpt-run/$name" ]] || { echo "quality_curve: no checkpoint $name" >&2; exit 1; }
  # A checkpoint root holding just that step (its `latest`).
  root="$WORK/budget-$step"
  mkdir -p "$root"
  ln -sfn "$WORK/ckpt-run/$name" "$root/$name"
  echo "$name" >"$root/latest"
  drafts+=(--draft "$root")
  budgets+=("$step:$(stat -c %Y "$WORK/ckpt-run/$name")")
done
"$BIN/specstream-eval" speculate --target "$WORK/target" --prompts "$DATA/prompts.jsonl" \
  --split holdout --limit "$PROMPTS_N" --max-new "$EVAL_MAX_NEW" --temperatures 0 \
  "${drafts[@]}" --json "$WORK/curve.json" 2>"$WORK/speculate.log" \
  || { tail -20 "$WORK/speculate.log" >&2; exit 1; }
stamp "every budget decoded"

# --- Table and plot ---------------------------------------------------------------
VENV=$BUILD/plot-venv
if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c "import matplotlib" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet matplotlib >"$WORK/pip.log" 2>&1 \
    || { tail -5 "$WORK/pip.log" >&2; exit 1; }
fi
"$VENV/bin/python" - "$WORK" "$launched" "$KIND" "$steps" "$MINUTES" "${budgets[@]}" <<'PY'
import json, os, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
work, launched, kind, steps, minutes = sys.argv[1], float(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
budgets = [tuple(map(float, b.split(":"))) for b in sys.argv[6:]]
size = json.load(open(f"{work}/train-size.json"))
per_sample = size["tokens"] / size["samples"]
rows = {}
for r in map(json.loads, open(f"{work}/curve.json")):
    step = int(os.path.basename(r["path"].rstrip("/"))[len("budget-"):])
    rows[step] = r
table = [f"| training (min) | steps | ≈ tokens | epochs | real τ, T=0 | wall clock vs target-only |",
         "|---|---|---|---|---|---|"]
points = []
for step, saved in budgets:
    r = rows[int(step)]
    mins = (saved - launched) / 60
    tokens = step * per_sample
    points.append((mins, tokens, r["tau"], r["tau_stderr"], r["speedup"]))
    table.append(f"| {mins:.1f} | {int(step)} | {tokens / 1e6:.2f}M | {step / size['samples']:.2f} | "
                 f"{r['tau']:.3f} ± {r['tau_stderr']:.3f} | ×{r['speedup']:.2f} |")
best = max(points, key=lambda p: p[2])
text = ("\n".join(table) + "\n\n"
        f"{kind} on SmolLM2-135M-Instruct; {size['samples']} training samples "
        f"({size['tokens']} tokens) of {size['prompts']} prompts, {size['written']} of them "
        f"written by the target; {rows[int(budgets[0][0])]['prompts']} held-out prompts; "
        f"one run of {steps} steps ({minutes} min budget), constant step size. "
        f"Best: τ {best[2]:.3f} at {best[0]:.1f} min, wall ×{best[4]:.2f}.\n")
print(text)
open(f"{work}/curve.md", "w").write(text)
fig, ax = plt.subplots(figsize=(7, 4))
xs = [p[0] for p in points]
ax.errorbar(xs, [p[2] for p in points], yerr=[p[3] for p in points], marker="o",
            label="real τ (T = 0), held-out prompts")
ax.plot(xs, [p[4] for p in points], marker="s", label="wall clock vs target-only (×)")
ax.axhline(1.0, color="gray", linewidth=0.8)
ax.axhline(2.0, color="gray", linewidth=0.8, linestyle="--")
ax.set_xscale("log")
ax.set_xlabel("training minutes on the 2-core machine (log)")
top = ax.secondary_xaxis("top", functions=(lambda m: m * points[-1][1] / points[-1][0] / 1e6,
                                           lambda t: t * 1e6 * points[-1][0] / points[-1][1]))
top.set_xlabel("≈ training tokens (M)")
ax.set_title(f"{kind} draft for SmolLM2-135M-Instruct: learning curve")
ax.legend(loc="upper left")
fig.tight_layout()
fig.savefig(f"{work}/curve.png", dpi=110)
PY
if [[ "${CURVE_DOCS:-0}" == 1 ]]; then
  mkdir -p "$ROOT/docs/images"
  cp "$WORK/curve.png" "$ROOT/docs/images/quality_curve.png"
  cp "$WORK/curve.md" "$ROOT/docs/quality_curve.md"
fi
stamp "done"
