#!/usr/bin/env python3
"""Train models/small: a 10M-parameter DeepSeek-V4 with its MTP module (plain PyTorch + transformers 5.17).

Usage:
    python3 tools/train_small/train.py --data DIR --tokenizer models/small --out OUTDIR
                                       [--minutes 6] [--steps N] [--device cuda|cpu] [--dropout 0.1] ...
The shipped model: see models/small/README.md for the exact command.

DIR holds train.txt and dev.txt (or .txt.gz) from prepare_corpus.py; --tokenizer holds tokenizer.json,
tokenizer_config.json and generation_config.json from tools/train_tiny/train_tokenizer.py.

What it does (the parts shared with models/tiny come from tools/train_tiny/train.py):
  * builds DeepseekV4ForCausalLM from CONFIG below: every feature of the architecture (sliding, CSA
    ratio 4 with the indexer, HCA ratio 128; mHC with 4 streams; a hash-routed MoE layer then
    score-routed ones with the aux-loss-free correction bias; partial RoPE; YaRN on compressed layers),
    plus the MTP module of mtp.py (one sliding, score-routed block predicting token t+2);
  * trains both together on random windows [BOS] + corpus tokens (--seq 512), AdamW, bf16 autocast, fp32
    master weights, linear warm-up then cosine decay, with DeepSeek-V3's multi-token-prediction objective:
        loss = CE(main logits at t, token t+1) + lambda * CE(MTP logits at t, token t+2)
    (depth 1, so the MTP loss is one mean cross-entropy); lambda is --mtp-weight for the first
    --mtp-switch of the steps, then --mtp-weight-late (V3: 0.3, then 0.1). The MTP gradient flows into
    the main model through the shared embedding, the shared head and the final residual streams;
  * aux-loss-free load balancing on every score-routed router, the MTP block's included;
  * optional training-only dropout (--dropout) on the embedding output and on every attention and MoE
    block output, MTP block included (forward hooks; the architecture is unchanged);
  * every --eval-every steps: main dev NLL (the perplexity chunk definition) and the MTP's dev NLL,
    top-1 accuracy and greedy acceptance; keeps the weights (main and MTP) with the best main dev NLL;
  * without --steps, times the first steps and sets the step count to fill --minutes;
  * saves the best weights: model.safetensors + config.json in transformers' layout (bfloat16; norms,
    mHC, sinks, biases float32), mtp.safetensors with the MTP module under its official names
    (mtp.0.*), the tokenizer files, train_log.json; then (unless --no-eval) the held-out perplexity
    (perplexity.json), the MTP's held-out figures (mtp_eval.json) and samples (samples.json), float32.
"""
import argparse
import gzip
import importlib.util
import json
import math
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "train_tiny"))
from mtp import MTPModule, StreamTap, official_state_dict  # noqa: E402
from mtp_eval import evaluate  # noqa: E402
from perplexity_hf import chunk_ids  # noqa: E402

_spec = importlib.util.spec_from_file_location("tiny_train", os.path.join(HERE, "..", "train_tiny", "train.py"))
tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny)

SWA, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
LAYERS = [SWA, CSA, HCA, SWA, CSA, SWA]
CONFIG = dict(tiny.CONFIG)
CONFIG.update(
    num_hidden_layers=len(LAYERS), layer_types=LAYERS, mlp_layer_types=["hash_moe"] + ["moe"] * (len(LAYERS) - 1),
    n_routed_experts=16, num_nextn_predict_layers=1,
)
PROMPTS = ["Once upon a time", "It is a truth universally acknowledged", "Call me Ishmael.",
           "To be, or not to be", "CYNIC, n.", "\"My dear,\" said"]


def log(*a):
    print(*a, flush=True)


def read_text(data_dir, name):
    path = os.path.join(data_dir, name)
    if os.path.exists(path):
        return open(path, encoding="utf-8").read()
    with gzip.open(path + ".gz", "rt", encoding="utf-8") as f:
        return f.read()


def build_config():
    from transformers import DeepseekV4Config
    cfg = DeepseekV4Config(**CONFIG)
    cfg.architectures = ["DeepseekV4ForCausalLM"]
    return cfg


def add_dropout(modules, embed, p):
    """Training-only dropout on `embed`'s output and every attention / MoE block output in `modules`."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Attention, DeepseekV4SparseMoeBlock
    F = torch.nn.functional

    def hook(mod, inp, out):
        if isinstance(out, tuple):
            return (F.dropout(out[0], p, mod.training),) + tuple(out[1:])
        return F.dropout(out, p, mod.training)

    n = 0
    for m in modules.modules():
        if isinstance(m, (DeepseekV4Attention, DeepseekV4SparseMoeBlock)) or m is embed:
            m.register_forward_hook(hook)
            n += 1
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="folder with train.txt and dev.txt (or .gz), prepare_corpus.py")
    ap.add_argument("--tokenizer", default="models/small", help="folder with tokenizer.json etc.")
    ap.add_argument("--out", required=True)
    ap.add_argument("--heldout", default="models/small/heldout.txt", help="for the final evaluation")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--minutes", type=float, default=6.0, help="wall-clock budget up to the end of training")
    ap.add_argument("--steps", type=int, default=0, help="fixed number of optimizer steps (overrides --minutes)")
    ap.add_argument("--max-epochs", type=float, default=20.0, help="cap on passes over the training tokens")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--seq", type=int, default=512, help="tokens per window, BOS included")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--dropout", type=float, default=0.1, help="training-only dropout (see add_dropout)")
    ap.add_argument("--bias-rate", type=float, default=5e-3, help="aux-loss-free balance update rate")
    ap.add_argument("--mtp-weight", type=float, default=0.3, help="lambda of the MTP loss, early steps")
    ap.add_argument("--mtp-weight-late", type=float, default=0.1, help="lambda after --mtp-switch of the steps")
    ap.add_argument("--mtp-switch", type=float, default=0.7)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--experts", default="grouped_mm", choices=["grouped_mm", "eager"])
    ap.add_argument("--no-eval", action="store_true", help="skip the final held-out evaluation and samples")
    a = ap.parse_args()

    t_start = time.time()
    import transformers
    from safetensors.torch import save_file
    from tokenizers import Tokenizer
    from transformers import DeepseekV4ForCausalLM

    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    dev = torch.device(a.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    tok = Tokenizer.from_file(os.path.join(a.tokenizer, "tokenizer.json"))
    train_ids = torch.tensor(tok.encode(read_text(a.data, "train.txt"), add_special_tokens=False).ids)
    dev_ids = tok.encode(read_text(a.data, "dev.txt"), add_special_tokens=False).ids
    log(f"tokens: train {len(train_ids)}  dev {len(dev_ids)}  ({time.time() - t_start:.1f}s)")

    cfg = build_config()
    cfg._experts_implementation = a.experts
    model = DeepseekV4ForCausalLM(cfg).float()
    tiny.CONFIG = CONFIG  # init_tid2eid counts the hash layers of CONFIG
    tiny.init_tid2eid(model, gen)
    mtp = MTPModule(cfg)
    mtp.init_weights(model)
    both = torch.nn.ModuleList([model, mtp]).to(dev).train()
    tap = StreamTap(model)
    if a.dropout > 0:
        log(f"dropout {a.dropout} on {add_dropout(both, model.model.embed_tokens, a.dropout)} module outputs")
    n_main = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    log(f"model: {n_main} parameters + MTP {n_mtp}; experts implementation {model.config._experts_implementation}")

    opt = torch.optim.AdamW(tiny.param_groups(both, a.wd), lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                            fused=dev.type == "cuda")
    balance = tiny.BalanceTracker(both, a.bias_rate)
    L = a.seq - 1  # corpus tokens per window after BOS
    bos = cfg.bos_token_id
    ce = torch.nn.functional.cross_entropy

    def batch():
        off = torch.randint(0, len(train_ids) - L - 2, (a.batch,), generator=gen)
        x = torch.stack([train_ids[o:o + L + 2] for o in off.tolist()])  # [B, L+2]
        x = torch.cat([torch.full((a.batch, 1), bos, dtype=torch.long), x], dim=1).to(dev)  # [B, S+2]
        return x[:, :-2], x[:, 1:-1], x[:, 2:]  # input, token t+1, token t+2

    def train_step(step, total):
        lr = tiny.lr_at(step, total, a.warmup, a.lr, 0.1)
        lam = a.mtp_weight if step < a.mtp_switch * total else a.mtp_weight_late
        for g in opt.param_groups:
            g["lr"] = lr
        inp, tgt1, tgt2 = batch()
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            logits = model(input_ids=inp, use_cache=False).logits
            mtp_logits = mtp(tap.streams, tgt1, model, tap.layer_kwargs)
        V = logits.shape[-1]
        loss = ce(logits.float().view(-1, V), tgt1.reshape(-1))
        loss_mtp = ce(mtp_logits.float().view(-1, V), tgt2.reshape(-1))
        opt.zero_grad(set_to_none=True)
        (loss + lam * loss_mtp).backward()
        gn = torch.nn.utils.clip_grad_norm_(both.parameters(), 1.0)
        opt.step()
        imb = balance.step()
        return loss, loss_mtp, gn, lr, lam, imb

    def dev_eval():
        both.eval()
        balance.enabled = False
        r = evaluate(model, mtp, tap, dev_ids, bos, dev, autocast_dtype=torch.bfloat16)
        balance.enabled = True
        both.train()
        return r

    # first step: fall back to the eager experts loop if grouped_mm cannot train here
    try:
        train_step(0, 10 ** 9)
    except Exception as e:  # noqa: BLE001
        if a.experts != "grouped_mm":
            raise
        log(f"grouped_mm experts failed ({type(e).__name__}: {str(e)[:200]}); using eager")
        model.set_experts_implementation("eager")
        mtp.block.mlp.experts.config._experts_implementation = "eager"  # the block has its own config copy
        opt.zero_grad(set_to_none=True)
        train_step(0, 10 ** 9)
    if dev.type == "cuda":
        torch.cuda.synchronize()

    total = a.steps
    first = 1
    if not total:  # calibrate: time a few steps and one dev evaluation, then fill the budget
        t0 = time.time()
        for s in range(1, 11):
            train_step(s, 10 ** 9)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        per = (time.time() - t0) / 10
        t1 = time.time()
        dev_eval()
        per_eval = time.time() - t1
        budget = a.minutes * 60 - (time.time() - t_start)
        by_time = int(budget / (per + per_eval / a.eval_every))
        by_epochs = int(a.max_epochs * len(train_ids) / (a.batch * L))
        total = max(a.warmup + 10, min(by_time, by_epochs))
        log(f"calibration: {per * 1000:.1f} ms/step, {per_eval:.1f} s/dev eval -> {by_time} steps fit, "
            f"{by_epochs} steps = {a.max_epochs} epochs -> {total} steps")
        first = 11

    t_train = time.time()
    history, best = [], (float("inf"), -1, None)
    for step in range(first, total):
        loss, loss_mtp, gn, lr, lam, imb = train_step(step, total)
        if step % 25 == 0 or step == total - 1:
            rec = {"step": step, "loss": round(float(loss.detach()), 4), "mtp_loss": round(float(loss_mtp.detach()), 4),
                   "mtp_weight": lam, "lr": lr, "grad_norm": round(float(gn), 3),
                   "max_load/mean": [round(v, 2) for v in imb], "t": round(time.time() - t_start, 1)}
            if step % a.eval_every == 0 or step == total - 1:
                r = dev_eval()
                rec.update(dev_loss=round(r["mean_nll"], 4), dev_mtp_loss=round(r["mtp_mean_nll"], 4),
                           dev_mtp_top1=round(r["mtp_top1"], 4), dev_mtp_accept=round(r["mtp_greedy_acceptance"], 4))
                if r["mean_nll"] < best[0]:
                    best = (r["mean_nll"], step, {k: v.detach().clone() for k, v in both.state_dict().items()}, r)
            history.append(rec)
            log(json.dumps(rec))
    train_seconds = time.time() - t_train
    log(f"trained {total} steps in {time.time() - t_start:.1f}s; final loss {history[-1]['loss']}, "
        f"dev {history[-1]['dev_loss']}; best dev {best[0]:.4f} at step {best[1]}")
    both.load_state_dict(best[2])

    tiny.save_bf16(model, a.out, a.tokenizer)
    save_file(official_state_dict(mtp), os.path.join(a.out, "mtp.safetensors"), metadata={"format": "pt"})
    info = {
        "transformers": transformers.__version__, "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "args": vars(a), "parameters": n_main, "mtp_parameters": n_mtp, "steps": total,
        "tokens_per_step": a.batch * a.seq, "train_tokens": len(train_ids), "dev_tokens": len(dev_ids),
        "epochs": total * a.batch * L / len(train_ids),
        "train_seconds": round(train_seconds, 1), "total_seconds": round(time.time() - t_start, 1),
        "final_train_loss": history[-1]["loss"], "final_train_mtp_loss": history[-1]["mtp_loss"],
        "final_dev_loss": history[-1]["dev_loss"], "saved_step": best[1], "saved_dev_loss": best[0],
        "saved_dev": best[3], "experts_implementation": model.config._experts_implementation,
        "history": history,
    }
    with open(os.path.join(a.out, "train_log.json"), "w") as f:
        json.dump(info, f, indent=1)
    log(f"saved to {a.out} ({time.time() - t_start:.1f}s)")
    if a.no_eval:
        return 0

    # held-out figures in float32, from the saved (bf16-rounded) weights, as perplexity_hf.py computes them
    from mtp_eval import evaluate_dir
    res = evaluate_dir(a.out, a.heldout, a.device)
    with open(os.path.join(a.out, "perplexity.json"), "w") as f:
        json.dump(res["perplexity"], f, indent=1)
    with open(os.path.join(a.out, "mtp_eval.json"), "w") as f:
        json.dump(res["mtp"], f, indent=1)
    log(json.dumps(res["perplexity"]))
    log(json.dumps(res["mtp"]))
    sm = tiny.samples(a.out, a.device, PROMPTS)
    with open(os.path.join(a.out, "samples.json"), "w") as f:
        json.dump(sm, f, indent=1, ensure_ascii=False)
    for s in sm:
        log(json.dumps(s, ensure_ascii=False))
    log(f"done ({time.time() - t_start:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
