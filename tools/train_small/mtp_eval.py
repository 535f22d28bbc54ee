#!/usr/bin/env python3
"""Held-out figures of a DeepSeek-V4 checkpoint with its MTP module, computed with transformers + mtp.py.

Usage:
    python3 tools/train_small/mtp_eval.py --model DIR [--text FILE] [--device cpu|cuda] [--json OUT.json]
    python3 tools/train_small/mtp_eval.py --model DIR --tokens 0,5,9,... --mtp-logits OUT.f32

DIR is either what train.py writes (transformers layout model.safetensors + mtp.safetensors with official
mtp.0.* names, bfloat16) or an official FP8 / FP4 checkpoint such as models/small (what `dsv4 quantize`
writes). The latter is dequantised exactly (bench/torch/eager_reference.py's dequantise: e4m3 or e2m1
value times its power-of-two scale, exact in bfloat16), so the figures are those of the stored weights.

Figures (float32, eager attention, TF32 off), over the chunks of tools/train_tiny/perplexity_hf.py
(consecutive 255-token chunks of the text, each run as [BOS] + chunk from a fresh state):
  * perplexity: perplexity_hf.py's own function (the definition dsv4 perplexity implements);
  * MTP: row j of a chunk x (x_0 = BOS) takes the main model's final streams at j and the true token
    x_{j+1} and predicts x_{j+2}, for j = 0 .. len(x) - 3. Reported: the MTP's mean NLL and perplexity of
    x_{j+2}, its top-1 accuracy, and its greedy acceptance: the share of rows whose MTP argmax equals the
    main model's argmax at j + 1, i.e. how often a greedy speculative-decoding draft would be accepted.
With --tokens and --mtp-logits, writes the MTP logits [(T-1) x vocab] float32 of one token sequence, row j
from position j and token j+1: the layout of `dsv4 logits --mtp`.
"""
import argparse
import json
import math
import os
import shutil
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "train_tiny"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "torch"))
from mtp import MTPModule, StreamTap, load_official  # noqa: E402
from perplexity_hf import CHUNK, chunk_ids, load_model, perplexity, tokenize  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def mtp_rows(model, mtp, tap, x):
    """(main logits [B, T, V], MTP logits [B, T, V]) of token batch x [B, T]; MTP row j uses x[:, j + 1]."""
    logits = model(input_ids=x, use_cache=False).logits
    nxt = torch.cat([x[:, 1:], x[:, -1:]], dim=1)  # the last row has no next token; causal, so it is inert
    return logits, mtp(tap.streams, nxt, model, tap.layer_kwargs)


@torch.no_grad()
def evaluate(model, mtp, tap, ids, bos_id, device, autocast_dtype=None, batch=16):
    """Main and MTP figures over [BOS] + chunk windows, equal-length chunks batched together."""
    chunks = chunk_ids(ids)
    groups = {}
    for c in chunks:
        groups.setdefault(len(c), []).append(c)
    s = dict(total_nll=0.0, count=0, mtp_total_nll=0.0, mtp_count=0, mtp_top1=0, mtp_accept=0)
    dev_type = torch.device(device).type
    for n, cs in groups.items():
        for i in range(0, len(cs), batch):
            x = torch.tensor([[bos_id] + c for c in cs[i:i + batch]], dtype=torch.long, device=device)
            with torch.autocast(device_type=dev_type, dtype=autocast_dtype or torch.float32,
                                enabled=autocast_dtype is not None):
                logits, mlogits = mtp_rows(model, mtp, tap, x)
            logp = torch.log_softmax(logits.float(), dim=-1)
            s["total_nll"] += float(-logp[:, :-1].gather(2, x[:, 1:, None]).double().sum())
            s["count"] += x[:, 1:].numel()
            mlogp = torch.log_softmax(mlogits[:, :-2].float(), dim=-1)  # rows j = 0 .. T-3
            s["mtp_total_nll"] += float(-mlogp.gather(2, x[:, 2:, None]).double().sum())
            s["mtp_count"] += x[:, 2:].numel()
            draft = mlogp.argmax(-1)
            s["mtp_top1"] += int((draft == x[:, 2:]).sum())
            s["mtp_accept"] += int((draft == logits[:, 1:-1].argmax(-1)).sum())
    return {
        "predicted_tokens": s["count"], "total_nll": s["total_nll"], "mean_nll": s["total_nll"] / s["count"],
        "perplexity": math.exp(s["total_nll"] / s["count"]), "mtp_predicted_tokens": s["mtp_count"],
        "mtp_total_nll": s["mtp_total_nll"], "mtp_mean_nll": s["mtp_total_nll"] / s["mtp_count"],
        "mtp_perplexity": math.exp(s["mtp_total_nll"] / s["mtp_count"]),
        "mtp_top1": s["mtp_top1"] / s["mtp_count"], "mtp_greedy_acceptance": s["mtp_accept"] / s["mtp_count"],
    }


def dequantised_copy(model_dir, out_dir):
    """An official FP8 / FP4 checkpoint as official-name bfloat16 (model.safetensors) that transformers
    loads, plus {mtp.0.* name: dequantised tensor}. The tokenizer files are copied along."""
    from eager_reference import dequantise, read_checkpoint
    from safetensors.torch import save_file
    raw = read_checkpoint(model_dir)
    main, mtp = {}, {}
    for name, (dtype, t) in raw.items():
        if name.endswith(".scale"):
            continue
        if dtype in ("F8_E4M3", "I8"):
            t = dequantise(dtype, t, raw[name[:-len(".weight")] + ".scale"][1])
        (mtp if name.startswith("mtp.") else main)[name] = t.clone()
    save_file(main, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    config = json.load(open(os.path.join(model_dir, "config.json")))
    for key in ("quantization_config", "expert_dtype"):
        config.pop(key, None)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    for f in TOKENIZER_FILES:
        shutil.copy(os.path.join(model_dir, f), os.path.join(out_dir, f))
    return mtp


def load_with_mtp(model_dir, device, tmp):
    """(hf dir to read, model, mtp, tap) in float32; tmp receives the dequantised copy if one is needed."""
    from safetensors.torch import load_file
    config = json.load(open(os.path.join(model_dir, "config.json")))
    if "quantization_config" in config:
        mtp_tensors = dequantised_copy(model_dir, tmp)
        hf_dir = tmp
    else:
        mtp_tensors = load_file(os.path.join(model_dir, "mtp.safetensors"))
        hf_dir = model_dir
    model = load_model(hf_dir, device)
    mtp = load_official(MTPModule(model.config), mtp_tensors).float().to(device).eval()
    return hf_dir, model, mtp, StreamTap(model)


def evaluate_dir(model_dir, text_path, device):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, model, mtp, tap = load_with_mtp(model_dir, device, tmp)
        ppl = perplexity(hf_dir, text_path, device)
        ppl["model"] = model_dir
        ids = tokenize(hf_dir, open(text_path, encoding="utf-8").read())
        r = evaluate(model, mtp, tap, ids, model.config.bos_token_id, device)
    assert r["predicted_tokens"] == ppl["predicted_tokens"]
    r.update(model=model_dir, text=text_path, chunk=CHUNK, dtype="float32", device=str(device),
             check_batched_perplexity=r.pop("perplexity"))
    for k in ("predicted_tokens", "total_nll", "mean_nll"):
        r.pop(k)
    return {"perplexity": ppl, "mtp": r}


@torch.no_grad()
def mtp_logits(model_dir, tokens, device):
    with tempfile.TemporaryDirectory() as tmp:
        _, model, mtp, tap = load_with_mtp(model_dir, device, tmp)
        x = torch.tensor([tokens], dtype=torch.long, device=device)
        _, m = mtp_rows(model, mtp, tap, x)
    return m[0, :-1].float().cpu()  # [(T-1), V]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", default="", help="text file (default: MODEL/heldout.txt)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", default="", help="also write the figures here")
    ap.add_argument("--tokens", default="", help="comma-separated ids: write their MTP logits (--mtp-logits)")
    ap.add_argument("--mtp-logits", default="")
    a = ap.parse_args()
    if a.tokens:
        torch.set_float32_matmul_precision("highest")
        m = mtp_logits(a.model, [int(t) for t in a.tokens.split(",")], a.device)
        m.numpy().astype("<f4").tofile(a.mtp_logits)
        print(f"wrote MTP logits {tuple(m.shape)} to {a.mtp_logits}")
        return 0
    res = evaluate_dir(a.model, a.text or os.path.join(a.model, "heldout.txt"), a.device)
    print(json.dumps(res, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
