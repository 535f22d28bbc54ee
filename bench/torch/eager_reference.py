#!/usr/bin/env python3
"""PyTorch eager reference point for dsv4 bench: transformers' DeepseekV4ForCausalLM decoding one sequence.

Usage (GPU machine: torch 2.11, transformers 5.17, safetensors):
    python bench/torch/eager_reference.py --model DIR [--context 0,4096] [--new-tokens 32] [--reps 3]

DIR is a dsv4 checkpoint in the official layout, typically one written by `dsv4 synth` (FP8 / FP4 matrices with
E8M0 scales). transformers cannot load those formats without its quantizer integrations, so the matrices are
dequantised here (spec §3.3 formulas) to BF16 and written, with the rest, into a temporary official-name
checkpoint that from_pretrained loads (transformers 5.17 maps official names itself,
docs/design/transformers-layout.md §3). The MTP module is dropped (transformers does not build it).

Timing: prefill the context once per repetition with a DynamicCache, then --new-tokens greedy steps of one
token, CUDA-synchronised; tokens/s = new tokens / decode time. Eager attention and eager experts, in FP32: under
BF16, transformers 5.17 feeds fp32 activations (its mHC / router math) into BF16 linears and fails with
"expected mat1 and mat2 to have the same dtype"; FP32 is also what dsv4's reference numerics compute.
Prints one markdown row per context, matching the decode rows of `dsv4 bench` (batch 1).
"""
import argparse
import json
import mmap
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time

import torch

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
RAW_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I64": torch.int64,
              "I32": torch.int32, "I8": torch.uint8, "U8": torch.uint8, "F8_E4M3": torch.uint8, "F8_E8M0": torch.uint8}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def read_safetensors(path):
    """{name: (dtype label, tensor of the raw elements)}; FP8 / E8M0 / packed FP4 come back as uint8."""
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    n = struct.unpack("<Q", mm[:8])[0]
    header = json.loads(mm[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        t = torch.frombuffer(bytearray(mm[base + a:base + b]), dtype=RAW_DTYPES[e["dtype"]])
        out[name] = (e["dtype"], t.reshape(e["shape"]) if e["shape"] else t.reshape(()))
    return out


def read_checkpoint(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    else:
        files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    tensors = {}
    for f in files:
        tensors.update(read_safetensors(os.path.join(model_dir, f)))
    return tensors


def e8m0(s):
    return torch.pow(2.0, s.float() - 127.0)


def dequantise(dtype, w, scale):
    """Logical [rows, cols] BF16 matrix of an FP8 (128x128 block scales) or packed FP4 (per-32 scales) weight."""
    if dtype == "F8_E4M3":
        rows, cols = w.shape
        v = w.view(torch.float8_e4m3fn).float()
        s = e8m0(scale).repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
        return (v * s).to(torch.bfloat16)
    rows, half = w.shape
    v = torch.empty(rows, 2 * half)
    v[:, 0::2] = E2M1[(w & 15).long()]
    v[:, 1::2] = E2M1[(w >> 4).long()]
    return (v * e8m0(scale).repeat_interleave(32, 1)).to(torch.bfloat16)


def bf16_checkpoint(model_dir, out_dir):
    """Official names, quantised matrices dequantised to BF16, no MTP; config without the FP8 integration keys."""
    raw = read_checkpoint(model_dir)
    state = {}
    for name, (dtype, t) in raw.items():
        if name.startswith("mtp.") or name.endswith(".scale"):
            continue
        if dtype in ("F8_E4M3", "I8"):
            state[name] = dequantise(dtype, t, raw[name[:-len(".weight")] + ".scale"][1])
        else:
            state[name] = t.clone()
    from safetensors.torch import save_file
    save_file(state, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    config = json.load(open(os.path.join(model_dir, "config.json")))
    for key in ("quantization_config", "expert_dtype"):
        config.pop(key, None)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return config


def load(path, device):
    from transformers import DeepseekV4ForCausalLM
    kw = dict(dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    try:
        model, info = DeepseekV4ForCausalLM.from_pretrained(path, experts_implementation="eager", **kw)
    except TypeError:
        model, info = DeepseekV4ForCausalLM.from_pretrained(path, **kw)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    assert not bad, f"checkpoint does not match the model: {bad}"
    return model.to(device).eval()


@torch.no_grad()
def decode_seconds(model, prompt, new_tokens, device):
    """Seconds for new_tokens greedy single-token steps after prefilling prompt (len ≥ 1) into a fresh cache."""
    from transformers import DynamicCache
    cache = DynamicCache(config=model.config)
    out = model(input_ids=torch.tensor([prompt], device=device), past_key_values=cache, use_cache=True)
    nxt = out.logits[0, -1].argmax()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(new_tokens):
        out = model(input_ids=nxt.view(1, 1), past_key_values=out.past_key_values, use_cache=True)
        nxt = out.logits[0, -1].argmax()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="dsv4 checkpoint directory (official layout)")
    ap.add_argument("--context", default="0,4096", help="context depths before decoding (comma-separated)")
    ap.add_argument("--new-tokens", type=int, default=32, help="timed decode steps per repetition")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tmp", default=None, help="where to write the BF16 copy (default: system temp dir)")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    device = "cuda"
    import transformers

    tmp = tempfile.mkdtemp(prefix="dsv4-eager-", dir=args.tmp)
    try:
        t0 = time.time()
        config = bf16_checkpoint(args.model, tmp)
        model = load(tmp, device)
        log(f"loaded {args.model} as BF16 in {time.time() - t0:.1f} s "
            f"({torch.cuda.memory_allocated() / 2**30:.2f} GiB on {torch.cuda.get_device_name()})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    gen = torch.Generator().manual_seed(args.seed)
    vocab = config["vocab_size"]
    print("| reference | GPU | layers | context | batch | ms/token | tokens/s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for ctx in [int(c) for c in args.context.split(",")]:
        # The token before the first timed step is part of the context: a context of 0 still needs one token.
        prompt = torch.randint(2, vocab, (max(ctx, 1),), generator=gen).tolist()
        decode_seconds(model, prompt, 2, device)  # warm-up
        ms = [decode_seconds(model, prompt, args.new_tokens, device) / args.new_tokens * 1e3 for _ in range(args.reps)]
        mean, sd = statistics.mean(ms), (statistics.stdev(ms) if len(ms) > 1 else 0.0)
        tps = [1e3 / m for m in ms]
        tmean, tsd = statistics.mean(tps), (statistics.stdev(tps) if len(tps) > 1 else 0.0)
        print(f"| transformers {transformers.__version__} eager, torch {torch.__version__}, BF16 "
              f"| {torch.cuda.get_device_name()} | {config['num_hidden_layers']} | {ctx} | 1 "
              f"| {mean:.3f} ± {sd:.3f} | {tmean:.1f} ± {tsd:.1f} |", flush=True)


if __name__ == "__main__":
    main()
