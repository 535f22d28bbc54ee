#!/usr/bin/env python3
"""Held-out perplexity of a DeepSeek-V4 checkpoint as computed by Hugging Face transformers.

Usage:
    python3 tools/train_tiny/perplexity_hf.py --model models/tiny [--text models/tiny/heldout.txt]
                                              [--device cpu|cuda] [--json OUT.json]

The definition (the same one `dsv4 perplexity` implements):
  1. tokenize the text with the model's tokenizer.json, no special tokens;
  2. split the ids into consecutive non-overlapping chunks of 255 tokens (the last may be shorter;
     a chunk shorter than 2 tokens is skipped);
  3. run each chunk as [BOS] + chunk through a fresh model state (no cache carried over), float32
     weights and activations, eager attention, TF32 off;
  4. add up -log p(token | BOS and the chunk tokens before it) over every chunk token;
  5. perplexity = exp(total NLL / number of predicted tokens).
"""
import argparse
import json
import math
import os
import sys
import time

import torch

CHUNK = 255


def chunk_ids(ids, chunk=CHUNK):
    """Consecutive non-overlapping chunks of `chunk` ids; chunks shorter than 2 are dropped."""
    return [c for c in (ids[i:i + chunk] for i in range(0, len(ids), chunk)) if len(c) >= 2]


@torch.no_grad()
def chunked_nll(model, ids, bos_id, device, chunk=CHUNK, autocast_dtype=None):
    """(total NLL in nats as float64, number of predicted tokens) over [BOS]+chunk windows."""
    total, count = 0.0, 0
    for c in chunk_ids(ids, chunk):
        x = torch.tensor([[bos_id] + c], dtype=torch.long, device=device)
        with torch.autocast(device_type=torch.device(device).type, dtype=autocast_dtype or torch.float32,
                            enabled=autocast_dtype is not None):
            logits = model(input_ids=x, use_cache=False).logits[0]
        logp = torch.log_softmax(logits.float(), dim=-1)  # [len(c)+1, V]
        tgt = x[0, 1:]
        nll = -logp[:-1].gather(1, tgt[:, None]).squeeze(1)  # position t predicts token t+1
        total += float(nll.double().sum())
        count += tgt.numel()
    return total, count


def load_model(path, device):
    from transformers import DeepseekV4ForCausalLM
    model, info = DeepseekV4ForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager",
        output_loading_info=True)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise RuntimeError(f"checkpoint {path} does not match the model: {bad}")
    return model.float().to(device).eval()


def tokenize(model_dir, text):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    return tok.encode(text, add_special_tokens=False).ids


def perplexity(model_dir, text_path, device):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    with open(text_path, encoding="utf-8") as f:
        text = f.read()
    ids = tokenize(model_dir, text)
    try:  # cross-check: transformers' own tokenizer wrapper must give the same ids
        from transformers import AutoTokenizer
        hf_ids = AutoTokenizer.from_pretrained(model_dir)(text, add_special_tokens=False)["input_ids"]
        tok_check = "same ids" if hf_ids == ids else f"DIFFERENT ids ({len(hf_ids)} vs {len(ids)})"
    except Exception as e:  # noqa: BLE001 - a report line, not a failure
        tok_check = f"AutoTokenizer failed: {type(e).__name__}: {e}"
    model = load_model(model_dir, device)
    t0 = time.time()
    total, n = chunked_nll(model, ids, model.config.bos_token_id, device)
    res = {
        "model": model_dir, "text": text_path, "text_bytes": len(text.encode("utf-8")),
        "tokens": len(ids), "chunk": CHUNK, "chunks": len(chunk_ids(ids)), "predicted_tokens": n,
        "total_nll": total, "mean_nll": total / n, "perplexity": math.exp(total / n),
        "dtype": "float32", "attn_implementation": "eager", "device": str(device),
        "autotokenizer_check": tok_check, "seconds": round(time.time() - t0, 2),
    }
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="folder with config.json, model.safetensors, tokenizer.json")
    ap.add_argument("--text", default="", help="text file (default: MODEL/heldout.txt)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", default="", help="also write the result here")
    a = ap.parse_args()
    res = perplexity(a.model, a.text or os.path.join(a.model, "heldout.txt"), a.device)
    print(json.dumps(res, indent=1))
    print(f"perplexity {res['perplexity']:.4f} over {res['predicted_tokens']} predicted tokens "
          f"({res['chunks']} chunks of <= {CHUNK}), mean NLL {res['mean_nll']:.6f} nats")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
