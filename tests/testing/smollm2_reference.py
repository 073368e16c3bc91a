"""The Hugging Face side of the GGUF importer's check (gguf_reference_test).

transformers loads the GGUF itself (gguf_file=, dequantising with the gguf
package); this script compares every weight it holds with the checkpoint our
importer wrote, and writes, for each prompt, the ids HF `tokenizers` gives
with the importer's tokenizer.json and transformers' fp32 logits for them:

  python smollm2_reference.py GGUF IMPORTED_DIR PROMPTS_JSON OUT.safetensors

OUT holds ids.<i> (int32 [T]) and logits.<i> (float32 [T, V]); its
metadata holds weights_compared, weights_equal and max_abs_diff. Exits 1
when a weight is missing or differs.
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM


def main():
    gguf, imported, prompts_path, out = sys.argv[1:]
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(gguf), gguf_file=os.path.basename(gguf), dtype=torch.float32)
    model.eval()
    ours = load_file(os.path.join(imported, "model.safetensors"))
    theirs = model.state_dict()
    compared = equal = 0
    max_abs_diff = 0.0
    missing = []
    for name, tensor in theirs.items():
        if name not in ours:
            if name == "lm_head.weight" and model.config.tie_word_embeddings:
                continue
            missing.append(name)
            continue
        compared += 1
        diff = (ours[name].to(torch.float32) - tensor.to(torch.float32)).abs().max().item()
        max_abs_diff = max(max_abs_diff, diff)
        equal += int(diff == 0 and ours[name].shape == tensor.shape)
    extra = sorted(set(ours) - set(theirs))

    tokenizer = Tokenizer.from_file(os.path.join(imported, "tokenizer.json"))
    with open(prompts_path, encoding="utf-8") as f:
        prompts = json.load(f)
    tensors = {}
    with torch.no_grad():
        for i, text in enumerate(prompts):
            ids = tokenizer.encode(text, add_special_tokens=False).ids
            tensors[f"ids.{i}"] = torch.tensor(ids, dtype=torch.int32)
            logits = model(torch.tensor([ids], dtype=torch.int64)).logits[0]
            tensors[f"logits.{i}"] = logits.to(torch.float32).contiguous()
    save_file(tensors, out, metadata={
        "weights_compared": str(compared),
        "weights_equal": str(equal),
        "max_abs_diff": repr(max_abs_diff),
        "transformers": __import__("transformers").__version__,
    })
    if missing or extra or equal != compared:
        print(f"weights: {equal} of {compared} equal, max |diff| {max_abs_diff}; "
              f"missing from the import: {missing}; not in transformers: {extra}",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
