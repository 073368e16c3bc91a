#!/usr/bin/env python3
"""Hugging Face transformers' own forward of a checkpoint, as the judge of
the teacher's captures (tests/gpu/gpu_test.cc) and of its speed
(tests/gpu/gpu_bench.cc).

    hf_reference.py hidden --model DIR --ids 1,2,3 --device cuda --dtype float32 --out FILE
        writes FILE (safetensors): hidden.<i> = output_hidden_states[i] of
        the sequence, [T, H] float32 (i = 0 is the embeddings, i = L the
        final norm's output)
    hf_reference.py speed --model DIR --tokens 1024 --device cuda --dtype bfloat16 --attn sdpa
        prints "tokens_per_s <value>": the median of 5 timed forwards of
        one sequence (output_hidden_states=True, as the teacher captures)
        after 2 warm-ups

Exits 77 when transformers (or safetensors) cannot be imported, so that
the callers skip and say why.
"""
import argparse
import statistics
import sys
import time

try:
    import torch
    import transformers
    from safetensors.torch import save_file
except ImportError as error:  # the callers skip on 77
    print(f"hf_reference.py: {error}", file=sys.stderr)
    sys.exit(77)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load(args, attn):
    # `dtype` since transformers 4.56; `torch_dtype` before it.
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            args.model, dtype=DTYPES[args.dtype], attn_implementation=attn)
    except TypeError:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            args.model, torch_dtype=DTYPES[args.dtype], attn_implementation=attn)
    return model.to(args.device).eval()


def hidden(args):
    model = load(args, "eager")
    ids = torch.tensor([[int(x) for x in args.ids.split(",")]], device=args.device)
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    tensors = {f"hidden.{i}": h[0].float().cpu().contiguous()
               for i, h in enumerate(out.hidden_states)}
    save_file(tensors, args.out)


def speed(args):
    model = load(args, args.attn)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(model.config.vocab_size, (1, args.tokens), generator=generator)
    ids = ids.to(args.device)
    times = []
    with torch.no_grad():
        for i in range(7):
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            start = time.perf_counter()
            model(input_ids=ids, output_hidden_states=True)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            if i >= 2:
                times.append(time.perf_counter() - start)
    print(f"tokens_per_s {args.tokens / statistics.median(times):.1f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["hidden", "speed"])
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--ids")
    parser.add_argument("--out")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--attn", default="sdpa", choices=["eager", "sdpa"])
    args = parser.parse_args()
    if args.mode == "hidden":
        hidden(args)
    else:
        speed(args)


if __name__ == "__main__":
    main()
