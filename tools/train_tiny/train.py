#!/usr/bin/env python3
"""Train the tiny DeepSeek-V4 model shipped in models/tiny/ (plain PyTorch + transformers 5.17).

Usage:
    python3 tools/train_tiny/train.py --data DIR --tokenizer models/tiny --out OUTDIR
                                      [--minutes 6] [--steps N] [--device cuda|cpu] [--seed 1234]
                                      [--dropout P] [--batch 32] [--seq 512] [--lr 2e-3] ...
The shipped model: --device cuda --dropout 0.1 --steps 575 (see models/tiny/README.md).

DIR holds train.txt (and heldout.txt) from prepare_corpus.py; --tokenizer holds tokenizer.json,
tokenizer_config.json and generation_config.json from train_tokenizer.py.

What it does:
  * builds DeepseekV4ForCausalLM from CONFIG below: every feature of the architecture (sliding, CSA
    ratio 4 with the indexer, HCA ratio 128; mHC with 4 streams; a hash-routed MoE layer then
    score-routed ones with the aux-loss-free correction bias; partial RoPE; YaRN on compressed layers);
  * initialises with transformers' own init, except tid2eid (the hash router's token->experts
    table), which gets distinct random experts per row (transformers leaves it zero);
  * trains on random windows [BOS] + 511 corpus tokens (--seq 512), AdamW, bf16 autocast, fp32 master weights,
    linear warm-up then cosine decay; the router correction biases follow DeepSeek's aux-loss-free
    rule (bias += rate * sign(mean load - load) after each step);
  * optional training-only dropout (--dropout; forward hooks, the architecture is unchanged);
  * keeps the last 1% of the training tokens out of training as a dev set; every --eval-every steps
    measures the dev NLL (perplexity_hf.py's chunk definition) and keeps the best weights;
  * without --steps, times the first steps and sets the step count so training fills --minutes
    (at most --max-epochs passes over the training tokens);
  * saves the best weights with save_pretrained in bfloat16 (norms, mHC, sinks and compressor
    position biases stay float32, as transformers keeps them) plus the tokenizer files into --out,
    and writes --out/train_log.json.
"""
import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perplexity_hf import chunked_nll  # noqa: E402

SWA, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"

CONFIG = dict(
    vocab_size=4096, hidden_size=256, num_hidden_layers=4,
    layer_types=[SWA, CSA, HCA, CSA],
    mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
    num_attention_heads=4, num_key_value_heads=1, head_dim=128, partial_rotary_factor=64 / 128,
    q_lora_rank=64, o_groups=2, o_lora_rank=64, sliding_window=128,
    index_n_heads=16, index_head_dim=128, index_topk=32,
    compress_rates={CSA: 4, HCA: 128},
    hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
    n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=64,
    scoring_func="sqrtsoftplus", norm_topk_prob=True, routed_scaling_factor=1.5, swiglu_limit=10.0,
    hidden_act="silu", rope_theta=10000.0, compress_rope_theta=160000.0, max_position_embeddings=2048,
    rope_parameters=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=512,
                         beta_fast=32.0, beta_slow=1.0),
    num_nextn_predict_layers=1, attention_bias=False, attention_dropout=0.0, tie_word_embeddings=False,
    bos_token_id=0, eos_token_id=1, initializer_range=0.02,
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def log(*a):
    print(*a, flush=True)


def build_config():
    from transformers import DeepseekV4Config
    cfg = DeepseekV4Config(**CONFIG)
    cfg.architectures = ["DeepseekV4ForCausalLM"]
    return cfg


def init_tid2eid(model, gen):
    """Distinct random experts per token id (a fixed hash, as in the official checkpoints)."""
    n = 0
    for name, buf in model.named_buffers():
        if name.endswith("tid2eid"):
            V, k = buf.shape
            E = model.config.n_routed_experts
            perm = torch.rand(V, E, generator=gen).argsort(dim=-1)[:, :k]
            buf.copy_(perm.to(buf.dtype))
            n += 1
    assert n == CONFIG["mlp_layer_types"].count("hash_moe"), n


class BalanceTracker:
    """Counts expert picks of every score-routed layer; updates e_score_correction_bias (aux-loss-free)."""

    def __init__(self, model, rate):
        from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4TopKRouter
        self.rate = rate
        self.routers = [m for m in model.modules() if isinstance(m, DeepseekV4TopKRouter)]
        self.counts = [torch.zeros(r.num_experts, device=r.weight.device) for r in self.routers]
        for i, r in enumerate(self.routers):
            r.register_forward_hook(self._hook(i))
        self.enabled = True

    def _hook(self, i):
        def fn(mod, inp, out):
            if self.enabled:
                idx = out[2].reshape(-1)
                self.counts[i] += torch.bincount(idx, minlength=mod.num_experts).float()
        return fn

    @torch.no_grad()
    def step(self):
        imbalance = []
        for r, c in zip(self.routers, self.counts):
            load = c / c.sum().clamp(min=1)
            r.e_score_correction_bias += self.rate * torch.sign(load.mean() - load)
            imbalance.append(float(load.max() / load.mean()))
            c.zero_()
        return imbalance


def add_dropout(model, p):
    """Training-only dropout on the token embeddings and on every attention and MoE block output.

    DeepseekV4 has no dropout of its own (attention_dropout aside); forward hooks add it without
    touching the architecture, so the saved checkpoint is a plain DeepseekV4ForCausalLM.
    """
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Attention, DeepseekV4SparseMoeBlock
    F = torch.nn.functional

    def hook(mod, inp, out):
        if isinstance(out, tuple):
            return (F.dropout(out[0], p, mod.training),) + tuple(out[1:])
        return F.dropout(out, p, mod.training)

    n = 0
    for m in model.modules():
        if isinstance(m, (DeepseekV4Attention, DeepseekV4SparseMoeBlock)) or m is model.model.embed_tokens:
            m.register_forward_hook(hook)
            n += 1
    return n


def param_groups(model, wd):
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        # matrices (and the stacked experts) decay; norms, mHC scales/bases, sinks, biases don't
        (decay if p.ndim >= 2 and "hc" not in n and "position_bias" not in n else no_decay).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def lr_at(step, total, warmup, peak, floor_frac):
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor_frac + (1 - floor_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def save_bf16(model, out, tokenizer_dir):
    """save_pretrained in bfloat16 the way make_golden.py does (reload so fp32-kept modules stay fp32)."""
    from transformers import DeepseekV4ForCausalLM
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        m16, info = DeepseekV4ForCausalLM.from_pretrained(tmp, dtype=torch.bfloat16, output_loading_info=True)
        assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
        m16.save_pretrained(out)
    for f in TOKENIZER_FILES:
        shutil.copy(os.path.join(tokenizer_dir, f), os.path.join(out, f))


@torch.no_grad()
def samples(model_dir, device, prompts, n_new=60, seed=0):
    """Greedy and sampled continuations from the saved model in float32 (transformers generate)."""
    from tokenizers import Tokenizer
    from perplexity_hf import load_model
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    model = load_model(model_dir, device)
    out = []
    for p in prompts:
        ids = torch.tensor([[model.config.bos_token_id] + tok.encode(p, add_special_tokens=False).ids], device=device)
        g = model.generate(ids, max_new_tokens=n_new, do_sample=False, eos_token_id=None, pad_token_id=1)
        torch.manual_seed(seed)
        s = model.generate(ids, max_new_tokens=n_new, do_sample=True, temperature=0.8, top_p=0.95, top_k=0,
                           eos_token_id=None, pad_token_id=1)
        out.append({"prompt": p,
                    "greedy": tok.decode(g[0, ids.shape[1]:].tolist()),
                    "greedy_ids": g[0, ids.shape[1]:].tolist(),
                    "sampled_t0.8_p0.95_seed%d" % seed: tok.decode(s[0, ids.shape[1]:].tolist())})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="folder with train.txt (prepare_corpus.py)")
    ap.add_argument("--tokenizer", default="models/tiny", help="folder with tokenizer.json etc.")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--minutes", type=float, default=6.0, help="training wall-clock budget (without --steps)")
    ap.add_argument("--steps", type=int, default=0, help="fixed number of optimizer steps (overrides --minutes)")
    ap.add_argument("--max-epochs", type=float, default=16.0, help="cap on passes over the training tokens")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--seq", type=int, default=512, help="tokens per window, BOS included")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--dropout", type=float, default=0.0, help="training-only dropout (see add_dropout)")
    ap.add_argument("--bias-rate", type=float, default=5e-3, help="aux-loss-free balance update rate")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--experts", default="grouped_mm", choices=["grouped_mm", "eager"])
    ap.add_argument("--no-samples", action="store_true")
    a = ap.parse_args()

    t_start = time.time()
    import transformers
    from tokenizers import Tokenizer
    from transformers import DeepseekV4ForCausalLM

    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    dev = torch.device(a.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    # data: [BOS] + tokens windows; the last 1% of the training tokens is the dev set
    tok = Tokenizer.from_file(os.path.join(a.tokenizer, "tokenizer.json"))
    with open(os.path.join(a.data, "train.txt"), encoding="utf-8") as f:
        ids = tok.encode(f.read(), add_special_tokens=False).ids
    n_dev = len(ids) // 100
    train_ids = torch.tensor(ids[:-n_dev], dtype=torch.long)
    dev_ids = ids[-n_dev:]
    log(f"tokens: train {len(train_ids)}  dev {len(dev_ids)}  ({time.time() - t_start:.1f}s)")

    cfg = build_config()
    cfg._experts_implementation = a.experts
    model = DeepseekV4ForCausalLM(cfg).float()
    init_tid2eid(model, gen)
    model.to(dev).train()
    if a.dropout > 0:
        log(f"dropout {a.dropout} on {add_dropout(model, a.dropout)} module outputs")
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params} parameters; experts implementation {model.config._experts_implementation}")

    opt = torch.optim.AdamW(param_groups(model, a.wd), lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                            fused=dev.type == "cuda")
    balance = BalanceTracker(model, a.bias_rate)
    L = a.seq - 1  # corpus tokens per window after BOS
    bos = cfg.bos_token_id

    def batch():
        off = torch.randint(0, len(train_ids) - L - 1, (a.batch,), generator=gen)
        x = torch.stack([train_ids[o:o + L + 1] for o in off.tolist()])  # [B, L+1]
        x = torch.cat([torch.full((a.batch, 1), bos, dtype=torch.long), x], dim=1)  # [B, L+2]
        return x[:, :-1].to(dev, non_blocking=True), x[:, 1:].to(dev, non_blocking=True)

    def train_step(step, total):
        lr = lr_at(step, total, a.warmup, a.lr, 0.1)
        for g in opt.param_groups:
            g["lr"] = lr
        inp, tgt = batch()
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            logits = model(input_ids=inp, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), tgt.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        imb = balance.step()
        return loss, gn, lr, imb

    def dev_loss():
        model.eval()
        balance.enabled = False
        tot, n = chunked_nll(model, dev_ids, bos, dev, autocast_dtype=torch.bfloat16)
        balance.enabled = True
        model.train()
        return tot / n

    # first step: fall back to the eager experts loop if grouped_mm cannot train here
    try:
        train_step(0, 10 ** 9)
    except Exception as e:  # noqa: BLE001
        if a.experts != "grouped_mm":
            raise
        log(f"grouped_mm experts failed ({type(e).__name__}: {str(e)[:200]}); using eager")
        model.set_experts_implementation("eager")
        opt.zero_grad(set_to_none=True)
        train_step(0, 10 ** 9)
    if dev.type == "cuda":
        torch.cuda.synchronize()

    total = a.steps
    if not total:  # calibrate: time a few steps, then fill the budget
        t0 = time.time()
        for s in range(1, 11):
            train_step(s, 10 ** 9)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        per = (time.time() - t0) / 10
        budget = a.minutes * 60 - (time.time() - t_start)
        # dev evaluations cost time too: measure one
        t1 = time.time()
        dev_loss()
        per_eval = time.time() - t1
        by_time = int(budget / (per + per_eval / a.eval_every))
        by_epochs = int(a.max_epochs * len(train_ids) / (a.batch * L))
        total = max(a.warmup + 10, min(by_time, by_epochs))
        log(f"calibration: {per * 1000:.1f} ms/step, {per_eval:.1f} s/dev eval -> {by_time} steps fit, "
            f"{by_epochs} steps = {a.max_epochs} epochs -> {total} steps")
        first = 11
    else:
        first = 1

    t_train = time.time()
    history, best = [], (float("inf"), -1, None)
    loss_ema = None
    for step in range(first, total):
        loss, gn, lr, imb = train_step(step, total)
        if step % 25 == 0 or step == total - 1:
            lv = float(loss.detach())
            loss_ema = lv if loss_ema is None else 0.8 * loss_ema + 0.2 * lv
            rec = {"step": step, "loss": round(lv, 4), "lr": lr, "grad_norm": round(float(gn), 3),
                   "max_load/mean": [round(v, 2) for v in imb], "t": round(time.time() - t_start, 1)}
            if step % a.eval_every == 0 or step == total - 1:
                dl = dev_loss()
                rec["dev_loss"] = round(dl, 4)
                if dl < best[0]:
                    best = (dl, step, {k: v.detach().clone() for k, v in model.state_dict().items()})
            history.append(rec)
            log(json.dumps(rec))
    train_seconds = time.time() - t_train
    final_loss = history[-1]["loss"]
    final_dev = history[-1]["dev_loss"]
    log(f"trained {total} steps in {time.time() - t_start:.1f}s; final loss {final_loss}, dev {final_dev}; "
        f"best dev {best[0]:.4f} at step {best[1]}")
    model.load_state_dict(best[2])

    save_bf16(model, a.out, a.tokenizer)
    info = {
        "transformers": transformers.__version__, "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "args": vars(a), "parameters": n_params, "steps": total,
        "tokens_per_step": a.batch * a.seq, "train_tokens": len(train_ids), "dev_tokens": len(dev_ids),
        "epochs": total * a.batch * (a.seq - 1) / len(train_ids),
        "train_seconds": round(train_seconds, 1), "total_seconds": round(time.time() - t_start, 1),
        "final_train_loss": final_loss, "final_dev_loss": final_dev,
        "saved_step": best[1], "saved_dev_loss": best[0],
        "experts_implementation": model.config._experts_implementation, "history": history,
    }
    with open(os.path.join(a.out, "train_log.json"), "w") as f:
        json.dump(info, f, indent=1)
    log(f"saved to {a.out} ({time.time() - t_start:.1f}s)")
    if not a.no_samples:
        from samples_hf import PROMPTS
        sm = samples(a.out, a.device, PROMPTS)
        with open(os.path.join(a.out, "samples.json"), "w") as f:
            json.dump(sm, f, indent=1, ensure_ascii=False)
        for s in sm:
            log(json.dumps(s, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
