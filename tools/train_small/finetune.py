#!/usr/bin/env python3
"""Fine-tune models/small into a chat model that writes V4's reasoning and DSML tool calls, trained with the
FP8 / FP4 rounding of its stored formats (plain PyTorch + transformers 5.17, as train.py).

Usage:
    python3 tools/train_small/finetune.py --model models/small --data DIR --chat CHAT.jsonl.gz --out OUTDIR
                                          [--minutes 5] [--steps N] [--no-qat] ...
The shipped model: see models/small/README.md for the exact command.

DIR holds train.txt and dev.txt (or .txt.gz) from prepare_corpus.py; CHAT.jsonl(.gz) holds {"text": ...}
lines from chat_data.py (whole conversations in the V4 prompt format, BOS first, every assistant turn ending
with EOS). --model is an official FP8 / FP4 checkpoint (models/small), read dequantised exactly.

What it does:
  * starts from the stored weights (main model and MTP module) and keeps train.py's recipe: AdamW, bf16
    autocast over FP32 master weights, dropout hooks, aux-loss-free balancing, the MTP objective
        loss = CE(t+1) + lambda * CE_MTP(t+2)
    on two batches a step: --batch windows of [BOS] + English (the pre-training corpus, so the model keeps
    its English) and --chat-batch conversations (padded with EOS on the right; scored on what the assistant
    writes, from after each hand-over to its EOS, unless --score all);
  * quantisation-aware (unless --no-qat): every matrix stored as FP8 runs with its weight rounded to e4m3
    with a power-of-two scale per 128 x 128 block, every FP4 expert matrix with its weight rounded to e2m1
    with a power-of-two scale per 32 columns (dsv4 quantize's rounding), and the inputs of those GEMMs
    act_quant'ed to e4m3 per token and 128 columns with power-of-two scales (DeepSeek's act_quant, what
    `--numerics fast` computes) -- except wo_a, which the official code multiplies in bf16. Gradients pass
    the roundings straight through. This is how DeepSeek trains V4 (FP8 activations), and what models/small
    lacked: trained in BF16, its fast-numerics top-1 against reference was 96.7% (issue 24's gate: 97%);
  * saves the final weights as train.py does (model.safetensors + config.json in transformers' layout,
    mtp.safetensors under official names, the tokenizer files, train_log.json), then the held-out
    perplexity and MTP figures (perplexity.json, mtp_eval.json) and samples (samples.json). What it learnt
    of the chats: chat_eval.py, on the engine, after `dsv4 quantize`.
"""
import argparse
import gzip
import importlib.util
import json
import os
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "train_tiny"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "torch"))
import chat_data  # noqa: E402
from mtp import MTPModule, StreamTap, load_official, official_state_dict  # noqa: E402
from mtp_eval import dequantised_copy, evaluate, evaluate_dir  # noqa: E402

# train.py beside this file (PROMPTS, add_dropout, read_text, and models/tiny's helpers as .tiny)
_spec = importlib.util.spec_from_file_location("small_train", os.path.join(HERE, "train.py"))
small = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(small)
tiny = small.tiny
log = small.log
BOS, EOS, ASSISTANT = chat_data.BOS, chat_data.EOS, chat_data.ASSISTANT


# ---- the stored formats' roundings, straight-through

def ste(x, q):
    """q in the forward pass, the identity's gradient in the backward pass."""
    return x + (q - x).detach()


def pow2_scale(amax, max_code):
    """The smallest power of two s with amax / s <= max_code (dsv4 quantize's block_exponent, ue8m0)."""
    return torch.exp2(torch.ceil(torch.log2(amax.clamp(min=1e-30) / max_code)))


def act_quant(x):
    """e4m3 per token and 128 columns (a partial block at the end), power-of-two scales: DeepSeek's act_quant
    on the last dimension, with the amax floor of src/cpu/quant.cpp's fp8_round_trip."""
    K = x.shape[-1]
    xp = F.pad(x.float(), (0, -K % 128))
    xb = xp.reshape(*x.shape[:-1], xp.shape[-1] // 128, 128)
    s = pow2_scale(xb.abs().amax(-1, keepdim=True).clamp(min=1e-4), 448.0)
    q = ((xb / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s).reshape(xp.shape)[..., :K]
    return ste(x, q.to(x.dtype))


def fp8_block(w):
    """e4m3 with a power-of-two scale per 128 x 128 block (partial blocks at the edges), 2-D w."""
    R, C = w.shape
    pr, pc = -R % 128, -C % 128
    wp = F.pad(w.float(), (0, pc, 0, pr))
    b = wp.reshape((R + pr) // 128, 128, (C + pc) // 128, 128)
    s = pow2_scale(b.abs().amax(dim=(1, 3), keepdim=True), 448.0)
    q = ((b / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s).reshape(wp.shape)[:R, :C]
    return ste(w, q.to(w.dtype))


E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def fp4_rows(w):
    """e2m1 with a power-of-two scale per 32 consecutive entries of the last dimension (round to nearest)."""
    b = w.float().reshape(*w.shape[:-1], w.shape[-1] // 32, 32)
    s = pow2_scale(b.abs().amax(-1, keepdim=True), 6.0)
    v = (b / s).clamp(-6, 6)
    grid = E2M1.to(w.device)
    mid = (grid[1:] + grid[:-1]) / 2
    q = grid[torch.bucketize(v.abs(), mid)] * v.sign() * s
    return ste(w, q.reshape(w.shape).to(w.dtype))


class Rounded(torch.nn.Module):
    """A parametrization: the weight as stored (FP8 blocks or FP4 rows)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, w):
        return self.fn(w)


def add_qat(modules):
    """The stored formats' roundings on every FP8 / FP4 matrix of `modules` (main model and MTP) and act_quant
    on their inputs (dsv4's quantize.cpp official_format names these matrices). Returns what remove_qat
    undoes: the parametrized (module, name) pairs and transformers' own _apply_gate."""
    from torch.nn.utils import parametrize
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m4
    done = []

    def weight(mod, name, fn):
        parametrize.register_parametrization(mod, name, Rounded(fn))
        done.append((mod, name))

    def quantised_input(mod):
        mod.register_forward_pre_hook(lambda _m, args: (act_quant(args[0]),) + tuple(args[1:]))

    for mod in modules.modules():
        if isinstance(mod, m4.DeepseekV4Attention):  # wq_a, wq_b, wkv, wo_a, wo_b
            for lin in (mod.q_a_proj, mod.q_b_proj, mod.kv_proj, mod.o_b_proj):
                weight(lin, "weight", fp8_block)
                quantised_input(lin)
            weight(mod.o_a_proj, "weight", fp8_block)  # multiplied in bf16 by the official code: no act_quant
        elif isinstance(mod, m4.DeepseekV4Indexer):  # the indexer's wq_b
            weight(mod.q_b_proj, "weight", fp8_block)
            quantised_input(mod.q_b_proj)
        elif isinstance(mod, m4.DeepseekV4SparseMoeBlock):
            for lin in (mod.shared_experts.gate_proj, mod.shared_experts.up_proj, mod.shared_experts.down_proj):
                weight(lin, "weight", fp8_block)
                quantised_input(lin)
            weight(mod.experts, "gate_up_proj", fp4_rows)  # [E, 2I, D]: rows of w1 then w3, per 32 of D
            weight(mod.experts, "down_proj", fp4_rows)  # [E, D, I]: per 32 of I
            quantised_input(mod.experts)
        elif isinstance(mod, MTPModule):
            for lin in (mod.e_proj, mod.h_proj):
                weight(lin, "weight", fp8_block)
                quantised_input(lin)
    # h, the routed experts' w2 input: _apply_gate is where every experts implementation forms it
    apply_gate = m4.DeepseekV4Experts._apply_gate
    m4.DeepseekV4Experts._apply_gate = lambda self, gate_up: act_quant(apply_gate(self, gate_up))
    return done, apply_gate


def remove_qat(qat):
    """Back to plain parameters holding the FP32 master weights (what train.py saves) and transformers' own
    _apply_gate (the evaluations below load fresh models in this process). The act_quant hooks stay on this
    model, which is not used after."""
    from torch.nn.utils import parametrize
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m4
    done, apply_gate = qat
    for mod, name in done:
        parametrize.remove_parametrizations(mod, name, leave_parametrized=False)
    m4.DeepseekV4Experts._apply_gate = apply_gate


# ---- data

def read_chats(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def assistant_tokens(ids, hand_over, eos_id):
    """Mask of the tokens an assistant writes in a conversation's ids: from after each hand-over
    (<｜Assistant｜> then <think> or </think>) up to its EOS, which is included."""
    assistant, think, end_think = hand_over
    prev = torch.cat([ids.new_full((1,), -1), ids[:-1]])
    start = (prev == assistant) & ((ids == think) | (ids == end_think))
    step = torch.zeros(len(ids) + 1, dtype=torch.long)
    step[1:] += start.long()  # the output starts after the hand-over's second token
    step[1:] -= (ids == eos_id).long()  # and ends after its EOS
    return torch.cumsum(step, 0)[:-1] > 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/small", help="the official FP8 / FP4 checkpoint to start from")
    ap.add_argument("--data", required=True, help="folder with train.txt and dev.txt (or .gz), prepare_corpus.py")
    ap.add_argument("--chat", required=True, help="chat_data.py output: training conversations")
    ap.add_argument("--chat-dev", default="", help="chat_data.py output with another seed: dev conversations")
    ap.add_argument("--out", required=True)
    ap.add_argument("--heldout", default="models/small/heldout.txt")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--minutes", type=float, default=5.0, help="wall-clock budget up to the end of training")
    ap.add_argument("--steps", type=int, default=0, help="fixed number of optimizer steps (overrides --minutes)")
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--seq", type=int, default=512, help="tokens per English window, BOS included")
    ap.add_argument("--batch", type=int, default=16, help="English windows per step")
    ap.add_argument("--chat-batch", type=int, default=16, help="conversations per step")
    ap.add_argument("--chat-seq", type=int, default=1536, help="longest conversation kept, tokens")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--bias-rate", type=float, default=2e-3)
    ap.add_argument("--mtp-weight", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--score", default="assistant", choices=["assistant", "all"],
                    help="the conversation tokens scored: what the assistant writes, or every token")
    ap.add_argument("--no-qat", action="store_true")
    ap.add_argument("--no-eval", action="store_true")
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

    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    train_ids = torch.tensor(tok.encode(small.read_text(a.data, "train.txt"), add_special_tokens=False).ids)
    dev_ids = tok.encode(small.read_text(a.data, "dev.txt"), add_special_tokens=False).ids
    chats = [torch.tensor(e.ids) for e in tok.encode_batch(read_chats(a.chat), add_special_tokens=False)]
    long = sum(len(c) > a.chat_seq for c in chats)
    chats = [c for c in chats if len(c) <= a.chat_seq]
    dev_chats = [torch.tensor(e.ids) for e in tok.encode_batch(read_chats(a.chat_dev) if a.chat_dev else [],
                                                                add_special_tokens=False)]
    lens = sorted(len(c) for c in chats)
    log(f"tokens: English train {len(train_ids)} dev {len(dev_ids)}; {len(chats)} conversations "
        f"({long} longer than {a.chat_seq} dropped), tokens p50 {lens[len(lens) // 2]} max {lens[-1]}, "
        f"{sum(lens)} in all; {len(dev_chats)} dev conversations ({time.time() - t_start:.1f}s)")
    bos_id, eos_id = tok.token_to_id(BOS), tok.token_to_id(EOS)
    assert all(int(c[0]) == bos_id for c in chats), "every conversation starts with BOS"
    hand_over = (tok.token_to_id(ASSISTANT), tok.token_to_id(chat_data.THINK_START),
                 tok.token_to_id(chat_data.THINK_END))
    if a.score == "assistant":
        chat_scored = [assistant_tokens(c, hand_over, eos_id) for c in chats]
        dev_scored = [assistant_tokens(c, hand_over, eos_id) for c in dev_chats]
    else:
        chat_scored = [torch.ones(len(c), dtype=torch.bool) for c in chats]
        dev_scored = [torch.ones(len(c), dtype=torch.bool) for c in dev_chats]
    log(f"scored as targets ({a.score}): {sum(int(m.sum()) for m in chat_scored)} conversation tokens")

    with tempfile.TemporaryDirectory() as tmp:
        mtp_tensors = dequantised_copy(a.model, tmp)
        model, info = DeepseekV4ForCausalLM.from_pretrained(tmp, dtype=torch.float32, output_loading_info=True,
                                                            experts_implementation="grouped_mm")
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    cfg = model.config
    mtp = load_official(MTPModule(cfg), mtp_tensors)
    both = torch.nn.ModuleList([model, mtp]).float().to(dev).train()
    tap = StreamTap(model)
    qat = ([], None) if a.no_qat else add_qat(both)
    log(f"QAT: {len(qat[0])} matrices rounded to their stored formats" if qat[0] else "QAT off")
    if a.dropout > 0:
        log(f"dropout {a.dropout} on {small.add_dropout(both, model.model.embed_tokens, a.dropout)} module outputs")

    opt = torch.optim.AdamW(tiny.param_groups(both, a.wd), lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                            fused=dev.type == "cuda")
    balance = tiny.BalanceTracker(both, a.bias_rate)
    L = a.seq - 1

    def english():
        off = torch.randint(0, len(train_ids) - L - 2, (a.batch,), generator=gen)
        x = torch.stack([train_ids[o:o + L + 2] for o in off.tolist()])
        x = torch.cat([torch.full((a.batch, 1), bos_id, dtype=torch.long), x], dim=1)
        return x, torch.ones_like(x, dtype=torch.bool)

    def padded(rows, scored):
        """[B, T + 2] token rows padded with EOS (inputs) and the mask of the tokens scored as targets; two more
        EOS so the MTP target t+2 exists for every scored position."""
        T = max(len(r) for r in rows) + 2
        x = torch.full((len(rows), T), eos_id, dtype=torch.long)
        real = torch.zeros((len(rows), T), dtype=torch.bool)
        for i, (r, m) in enumerate(zip(rows, scored)):
            x[i, :len(r)] = r
            real[i, :len(r)] = m
        return x, real

    def chat_batch():
        idx = torch.randint(0, len(chats), (a.chat_batch,), generator=gen).tolist()
        return padded([chats[i] for i in idx], [chat_scored[i] for i in idx])

    ce = torch.nn.functional.cross_entropy

    def losses(x, real):
        """Main and MTP mean cross-entropy over the real targets of token rows x [B, T + 2]."""
        x, real = x.to(dev), real.to(dev)
        inp, t1, t2 = x[:, :-2], x[:, 1:-1], x[:, 2:]
        logits = model(input_ids=inp, use_cache=False).logits
        mtp_logits = mtp(tap.streams, t1, model, tap.layer_kwargs)
        V = logits.shape[-1]
        y1 = t1.masked_fill(~real[:, 1:-1], -100)
        y2 = t2.masked_fill(~real[:, 2:], -100)
        return ce(logits.float().reshape(-1, V), y1.reshape(-1)), ce(mtp_logits.float().reshape(-1, V), y2.reshape(-1))

    def train_step(step, total):
        lr = tiny.lr_at(step, total, a.warmup, a.lr, 0.1)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        out = []
        for x, real in (english(), chat_batch()):
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
                loss, loss_mtp = losses(x, real)
            (loss + a.mtp_weight * loss_mtp).backward()
            out += [loss, loss_mtp]
        gn = torch.nn.utils.clip_grad_norm_(both.parameters(), 1.0)
        opt.step()
        imb = balance.step()
        return out, gn, lr, imb

    @torch.no_grad()
    def chat_dev_loss():
        tot, n = 0.0, 0
        for i in range(0, len(dev_chats), 16):
            x, real = padded(dev_chats[i:i + 16], dev_scored[i:i + 16])
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
                x, real = x.to(dev), real.to(dev)
                logits = model(input_ids=x[:, :-2], use_cache=False).logits
            y = x[:, 1:-1].masked_fill(~real[:, 1:-1], -100)
            tot += float(ce(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum"))
            n += int((y != -100).sum())
        return tot / max(1, n)

    def dev_eval():
        both.eval()
        balance.enabled = False
        r = evaluate(model, mtp, tap, dev_ids, bos_id, dev, autocast_dtype=torch.bfloat16)
        r["chat_nll"] = chat_dev_loss() if dev_chats else float("nan")
        balance.enabled = True
        both.train()
        return r

    r0 = dev_eval()
    log(f"start: dev loss {r0['mean_nll']:.4f}, MTP {r0['mtp_mean_nll']:.4f}, chat dev {r0['chat_nll']:.4f}")
    total = a.steps
    first = 0
    if not total:  # calibrate: time a few steps, then fill the budget
        t0 = time.time()
        for s in range(10):
            train_step(s, 10 ** 9)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        per = (time.time() - t0) / 10
        t1 = time.time()
        dev_eval()
        per_eval = time.time() - t1
        budget = a.minutes * 60 - (time.time() - t_start)
        total = max(a.warmup + 10, int(budget / (per + per_eval / a.eval_every)))
        log(f"calibration: {per * 1000:.1f} ms/step, {per_eval:.1f} s/dev eval -> {total} steps")
        first = 10

    t_train = time.time()
    history = []
    for step in range(first, total):
        (loss, loss_mtp, closs, closs_mtp), gn, lr, imb = train_step(step, total)
        if step % 25 == 0 or step == total - 1:
            rec = {"step": step, "loss": round(float(loss), 4), "mtp_loss": round(float(loss_mtp), 4),
                   "chat_loss": round(float(closs), 4), "chat_mtp_loss": round(float(closs_mtp), 4), "lr": lr,
                   "grad_norm": round(float(gn), 3), "max_load/mean": [round(v, 2) for v in imb],
                   "t": round(time.time() - t_start, 1)}
            if step % a.eval_every == 0 or step == total - 1:
                r = dev_eval()
                rec.update(dev_loss=round(r["mean_nll"], 4), dev_mtp_loss=round(r["mtp_mean_nll"], 4),
                           dev_mtp_accept=round(r["mtp_greedy_acceptance"], 4), dev_chat_loss=round(r["chat_nll"], 4))
                last = r
            history.append(rec)
            log(json.dumps(rec))
    train_seconds = time.time() - t_train
    log(f"trained {total} steps in {time.time() - t_start:.1f}s")

    if qat[0]:
        remove_qat(qat)
    tiny.save_bf16(model, a.out, a.model)
    save_file(official_state_dict(mtp), os.path.join(a.out, "mtp.safetensors"), metadata={"format": "pt"})
    info = {
        "transformers": transformers.__version__, "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "args": vars(a),
        "start_dev": r0, "steps": total, "english_tokens_per_step": a.batch * a.seq,
        "conversations": len(chats), "conversation_tokens": sum(lens),
        "train_seconds": round(train_seconds, 1), "total_seconds": round(time.time() - t_start, 1),
        "final_dev": last, "qat_matrices": len(qat[0]), "history": history,
    }
    with open(os.path.join(a.out, "train_log.json"), "w") as f:
        json.dump(info, f, indent=1)
    log(f"saved to {a.out} ({time.time() - t_start:.1f}s)")
    if a.no_eval:
        return 0
    res = evaluate_dir(a.out, a.heldout, a.device)
    with open(os.path.join(a.out, "perplexity.json"), "w") as f:
        json.dump(res["perplexity"], f, indent=1)
    with open(os.path.join(a.out, "mtp_eval.json"), "w") as f:
        json.dump(res["mtp"], f, indent=1)
    log(json.dumps(res["perplexity"]))
    log(json.dumps(res["mtp"]))
    sm = tiny.samples(a.out, a.device, small.PROMPTS)
    with open(os.path.join(a.out, "samples.json"), "w") as f:
        json.dump(sm, f, indent=1, ensure_ascii=False)
    log(f"done ({time.time() - t_start:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
