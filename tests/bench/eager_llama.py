#!/usr/bin/env python3
"""A plain PyTorch eager forward of a Llama checkpoint, as a user would write it.

The reference teacher_bench measures the teacher against (P23): HF's Llama
forward in torch ops (RMSNorm in float32, rotary, grouped-query attention,
SwiGLU MLP; sdpa where this torch has it, else matmul-softmax-matmul), over
the sequences of a JSON-lines file ({"input_ids": [...]}, the file `dump`
reads), capturing the hidden states after the given layers, the post-norm
last hidden state and the full-vocab argmax, as the teacher's store does.

    eager_llama.py --model DIR --data FILE --capture-layers 1,5,8
                   [--dtype float32|bfloat16] [--threads N] [--reps 3]
                   [--out DIR]

Prints one JSON object:
  compute_s     best over --reps of the forwards of every sequence (warm:
                one untimed pass first), so tokens / compute_s is the
                throughput a user would see in a loop;
  end_to_end_s  load (safetensors read by hand, cast to --dtype) + one pass
                + writing each sequence's captures in --dtype to --out (raw
                little-endian files, one per tensor and sequence), from a
                cold start of this process's work;
  tokens, threads, dtype, torch (its version).
The files in --out (aux-I.bin [T, n * hidden], last-I.bin [T, hidden] in
--dtype; argmax-I.bin [T] int64) let the caller check that this forward
computes what the teacher does.
Only the llama architecture (no biases; tied or separate lm_head).
"""
import argparse
import ctypes
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F

SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def load_weights(path, dtype):
    with open(path, "rb") as f:
        header_size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(header_size))
        data = f.read()
    weights = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in SAFETENSORS_DTYPES:
            sys.exit(f"eager_llama: {path}: tensor {name}: dtype {info['dtype']} not supported")
        begin, end = info["data_offsets"]
        tensor = torch.frombuffer(bytearray(data[begin:end]), dtype=SAFETENSORS_DTYPES[info["dtype"]])
        weights[name] = tensor.reshape(info["shape"]).to(dtype)
    return weights


class Llama:
    def __init__(self, model_dir, dtype):
        config = json.load(open(os.path.join(model_dir, "config.json")))
        if config.get("model_type") != "llama":
            sys.exit(f"eager_llama: {model_dir}: model_type {config.get('model_type')!r}: "
                     "only llama is written here")
        self.layers = config["num_hidden_layers"]
        self.heads = config["num_attention_heads"]
        self.kv_heads = config.get("num_key_value_heads", self.heads)
        self.head_dim = config.get("head_dim") or config["hidden_size"] // self.heads
        self.theta = config.get("rope_theta", 10000.0)
        self.eps = config["rms_norm_eps"]
        self.dtype = dtype
        self.w = load_weights(os.path.join(model_dir, "model.safetensors"), dtype)
        self.lm_head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])

    def norm(self, x, weight):
        f = x.to(torch.float32)
        f = f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * f.to(x.dtype)

    @torch.no_grad()
    def forward(self, ids, capture_layers):
        """ids: [T] int64. Returns (captures [T, n*hidden], last [T, hidden], argmax [T])."""
        t, d = ids.shape[0], self.head_dim
        inv_freq = 1.0 / self.theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        freqs = torch.outer(torch.arange(t, dtype=torch.float32), inv_freq)
        emb = torch.cat([freqs, freqs], -1)
        cos, sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)

        def rope(x):
            x1, x2 = x[..., : d // 2], x[..., d // 2:]
            return x * cos + torch.cat([-x2, x1], -1) * sin

        group = self.heads // self.kv_heads
        h = F.embedding(ids, self.w["model.embed_tokens.weight"])
        captured = {}
        for i in range(self.layers):
            p = f"model.layers.{i}."
            x = self.norm(h, self.w[p + "input_layernorm.weight"])
            q = F.linear(x, self.w[p + "self_attn.q_proj.weight"]).view(t, self.heads, d)
            k = F.linear(x, self.w[p + "self_attn.k_proj.weight"]).view(t, self.kv_heads, d)
            v = F.linear(x, self.w[p + "self_attn.v_proj.weight"]).view(t, self.kv_heads, d)
            q = rope(q.transpose(0, 1))
            k = rope(k.transpose(0, 1)).repeat_interleave(group, 0)
            v = v.transpose(0, 1).repeat_interleave(group, 0)
            if hasattr(F, "scaled_dot_product_attention"):
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                scores = torch.matmul(q, k.transpose(1, 2)) / math.sqrt(d)
                scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), -math.inf)
                a = torch.matmul(torch.softmax(scores, -1, dtype=torch.float32).to(self.dtype), v)
            h = h + F.linear(a.transpose(0, 1).reshape(t, self.heads * d),
                             self.w[p + "self_attn.o_proj.weight"])
            x = self.norm(h, self.w[p + "post_attention_layernorm.weight"])
            h = h + F.linear(F.silu(F.linear(x, self.w[p + "mlp.gate_proj.weight"]))
                             * F.linear(x, self.w[p + "mlp.up_proj.weight"]),
                             self.w[p + "mlp.down_proj.weight"])
            if i in capture_layers:
                captured[i] = h
        last = self.norm(h, self.w["model.norm.weight"])
        argmax = F.linear(last, self.lm_head).argmax(-1)
        return torch.cat([captured[i] for i in capture_layers], -1), last, argmax


def write(out_dir, index, tensors):
    # The tensors' bytes as they are in memory, without numpy (pip's torch
    # comes without it).
    for name, tensor in tensors.items():
        raw = tensor.contiguous()
        with open(os.path.join(out_dir, f"{name}-{index}.bin"), "wb") as f:
            f.write(ctypes.string_at(raw.data_ptr(), raw.numel() * raw.element_size()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--capture-layers", required=True)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=0, help="0: torch's default")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    dtype = torch.float32 if args.dtype == "float32" else torch.bfloat16
    capture_layers = [int(x) for x in args.capture_layers.split(",")]
    sequences = [torch.tensor(json.loads(line)["input_ids"], dtype=torch.long)
                 for line in open(args.data) if line.strip()]
    if not sequences:
        sys.exit(f"eager_llama: {args.data}: no sequences")
    if args.out:
        os.makedirs(args.out, exist_ok=True)

    start = time.perf_counter()
    model = Llama(args.model, dtype)
    for index, ids in enumerate(sequences):
        aux, last, argmax = model.forward(ids, capture_layers)
        if args.out:
            write(args.out, index, {"aux": aux, "last": last, "argmax": argmax})
    end_to_end = time.perf_counter() - start

    compute = math.inf
    for _ in range(args.reps):
        start = time.perf_counter()
        for ids in sequences:
            model.forward(ids, capture_layers)
        compute = min(compute, time.perf_counter() - start)

    result = {"tokens": sum(len(s) for s in sequences), "threads": torch.get_num_threads(),
              "dtype": args.dtype, "torch": torch.__version__, "compute_s": compute,
              "end_to_end_s": end_to_end}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
