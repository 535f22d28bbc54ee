#!/usr/bin/env python3
"""Build small random DeepSeek-V4 golden fixtures with Hugging Face transformers.

Usage (on a machine with torch + transformers >= 5.17):
    python tools/make_golden.py --out DIR [--device cpu|cuda] [--only NAME,...] [--inspect]

For each fixture config below this script
  1. builds DeepseekV4ForCausalLM(config) in float32 and randomises EVERY parameter and persistent
     buffer (norm weights 1+0.1*randn, hc fn/base/scale, sinks, compressor position_bias, router
     correction bias, tid2eid with distinct experts per row, ...);
  2. saves it to a temporary folder in float32, reloads it with dtype=bfloat16 (so transformers
     applies its own _keep_in_fp32_modules_strict rules) and save_pretrained()s that into
     DIR/<name>/ (config.json + model.safetensors);
  3. reloads DIR/<name>/ in float32 (eager attention, TF32 off, deterministic algorithms) and writes
       logits/exact_<L>.f32   float32 LE row-major [L x vocab], one forward pass over the first L
                              prompt tokens (no cache), for L in LENS;
       logits/index.json      prompt_ids, lens, vocab_size, layout, greedy_prompt_len,
                              greedy_sequence_exact (prompt + greedy continuation), ... ;
  4. sanity-checks: logits finite, std in a sane range, prefix runs equal the first L rows of the
     longest run (causality), cached incremental decode equals the no-cache forward.

Greedy decoding is a manual argmax loop over DynamicCache (prefill the prompt, then one token per
step, no EOS stopping), which is exactly what generate(do_sample=False) does without stopping
criteria; it is cross-checked against a single no-cache forward over the final sequence.
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

LENS = [1, 3, 4, 5, 17, 64, 129, 300, 700]
GREEDY_PROMPT = 40
GREEDY_NEW = 32
# second decode test that crosses the HCA window boundary (128) during decode
GREEDY_LONG_PROMPT = 120
GREEDY_LONG_NEW = 16

SWA, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"

# Each fixture: kwargs for DeepseekV4Config (modern field names) + randomisation knobs.
FIXTURES = {
    # head_dim 512 (official), window 128, hc_mult 4, all three layer types, 1 hash layer
    "v4-hd512-w128": dict(
        seed=1,
        cfg=dict(
            vocab_size=512, hidden_size=64, num_hidden_layers=4,
            layer_types=[SWA, CSA, HCA, CSA], mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
            num_attention_heads=4, num_key_value_heads=1, head_dim=512, partial_rotary_factor=64 / 512,
            q_lora_rank=32, o_groups=2, o_lora_rank=16, sliding_window=128,
            index_n_heads=16, index_head_dim=128, index_topk=8,
            hc_mult=4, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
            moe_intermediate_size=64, routed_scaling_factor=1.5, swiglu_limit=10.0,
            rope_theta=10000.0, compress_rope_theta=160000.0, max_position_embeddings=1024,
            rope_parameters=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=256,
                                 beta_fast=32.0, beta_slow=1.0),
        ),
        expert_gain=2.0,
    ),
    # small window 16, hc_mult 2, head_dim 128, CSA first, 2 hash layers, low swiglu limit
    "v4-hc2-w16": dict(
        seed=2,
        cfg=dict(
            vocab_size=256, hidden_size=96, num_hidden_layers=5,
            layer_types=[CSA, HCA, SWA, CSA, HCA], mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe"],
            num_attention_heads=4, num_key_value_heads=1, head_dim=128, partial_rotary_factor=64 / 128,
            q_lora_rank=48, o_groups=2, o_lora_rank=32, sliding_window=16,
            index_n_heads=16, index_head_dim=128, index_topk=4,
            hc_mult=2, n_routed_experts=6, num_experts_per_tok=3, n_shared_experts=1,
            moe_intermediate_size=48, routed_scaling_factor=2.5, swiglu_limit=3.0,
            rope_theta=10000.0, compress_rope_theta=160000.0, max_position_embeddings=1024,
            rope_parameters=dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=128,
                                 beta_fast=32.0, beta_slow=1.0),
        ),
        expert_gain=2.0,
    ),
    # sliding-only model, head_dim 256, window 32, hc_mult 4
    "v4-swa-hd256": dict(
        seed=3,
        cfg=dict(
            vocab_size=256, hidden_size=64, num_hidden_layers=3,
            layer_types=[SWA, SWA, SWA], mlp_layer_types=["hash_moe", "moe", "moe"],
            num_attention_heads=2, num_key_value_heads=1, head_dim=256, partial_rotary_factor=64 / 256,
            q_lora_rank=32, o_groups=2, o_lora_rank=16, sliding_window=32,
            index_n_heads=16, index_head_dim=128, index_topk=4,
            hc_mult=4, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
            moe_intermediate_size=32, routed_scaling_factor=1.5, swiglu_limit=10.0,
            rope_theta=10000.0, compress_rope_theta=160000.0, max_position_embeddings=1024,
            rope_parameters=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=256,
                                 beta_fast=32.0, beta_slow=1.0),
        ),
        expert_gain=2.0,
    ),
    # Flash-like schedule (2 SWA, then CSA/HCA), 3 hash layers, 32 indexer heads, top-16
    "v4-flashlike": dict(
        seed=4,
        cfg=dict(
            vocab_size=256, hidden_size=128, num_hidden_layers=6,
            layer_types=[SWA, SWA, CSA, HCA, CSA, HCA],
            mlp_layer_types=["hash_moe", "hash_moe", "hash_moe", "moe", "moe", "moe"],
            num_attention_heads=4, num_key_value_heads=1, head_dim=128, partial_rotary_factor=64 / 128,
            q_lora_rank=32, o_groups=2, o_lora_rank=32, sliding_window=64,
            index_n_heads=32, index_head_dim=128, index_topk=16,
            hc_mult=4, n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=1,
            moe_intermediate_size=32, routed_scaling_factor=1.5, swiglu_limit=10.0,
            rope_theta=10000.0, compress_rope_theta=160000.0, max_position_embeddings=1024,
            rope_parameters=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=256,
                                 beta_fast=32.0, beta_slow=1.0),
        ),
        expert_gain=2.0,
    ),
}

COMMON_CFG = dict(
    num_nextn_predict_layers=1, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
    scoring_func="sqrtsoftplus", norm_topk_prob=True, hidden_act="silu", attention_bias=False,
    tie_word_embeddings=False, bos_token_id=0, eos_token_id=1,
)


def log(*a):
    print(*a, flush=True)


def setup_determinism():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


def randomise(model, cfg, expert_gain, gen):
    """Overwrite every parameter and persistent buffer. Returns {name: rule}."""
    D = cfg.hidden_size
    hc = cfg.hc_mult
    sd_keys = set(model.state_dict().keys())
    named = dict(model.named_parameters())
    for n, b in model.named_buffers():
        if n in sd_keys:
            named[n] = b
    missing = sd_keys - set(named)
    assert not missing, f"state_dict keys not reachable: {sorted(missing)[:5]}"

    def rn(shape, std, mean=0.0):
        return torch.randn(shape, generator=gen) * std + mean

    rules = {}
    with torch.no_grad():
        for n, p in sorted(named.items()):
            s = tuple(p.shape)
            if n.endswith("tid2eid"):
                V, k = s
                perm = torch.rand(V, cfg.n_routed_experts, generator=gen).argsort(dim=-1)[:, :k]
                v, r = perm.to(p.dtype), "tid2eid distinct random"
            elif n.endswith("e_score_correction_bias"):
                v, r = rn(s, 0.2), "randn*0.2"
            elif n == "model.embed_tokens.weight":
                v, r = rn(s, 1.0), "randn"
            elif n == "lm_head.weight":
                v, r = rn(s, 2.5 / math.sqrt(D)), "randn*2.5/sqrt(D)"
            elif n.endswith("hc_fn") or n.endswith("_hc.fn"):
                v, r = rn(s, 1.0 / math.sqrt(s[1])), "randn/sqrt(hc*D)"
            elif n.endswith("hc_base") or n.endswith("_hc.base"):
                v, r = rn(s, 0.5), "randn*0.5"
            elif n.endswith("hc_scale") or n.endswith("_hc.scale"):
                v, r = 0.5 + torch.rand(s, generator=gen), "0.5+rand"
            elif n.endswith("self_attn.sinks"):
                v, r = rn(s, 1.0), "randn"
            elif n.endswith("position_bias"):
                v, r = rn(s, 0.5), "randn*0.5"
            elif "norm" in n.rsplit(".", 1)[0].rsplit(".", 1)[-1] or n.endswith("layernorm.weight"):
                assert len(s) == 1, n
                v, r = rn(s, 0.1, 1.0), "1+0.1*randn"
            elif n.endswith("experts.gate_up_proj"):
                v, r = rn(s, expert_gain / math.sqrt(s[2])), f"randn*{expert_gain}/sqrt(D)"
            elif n.endswith("experts.down_proj"):
                v, r = rn(s, 0.5 / math.sqrt(s[2])), "randn*0.5/sqrt(I)"
            elif n.endswith(".weight") and len(s) == 2:
                gain = 1.0
                if "shared_experts.gate_proj" in n or "shared_experts.up_proj" in n:
                    gain = expert_gain
                elif "shared_experts.down_proj" in n:
                    gain = 0.5
                v, r = rn(s, gain / math.sqrt(s[1])), f"randn*{gain}/sqrt(fan_in)"
            else:
                raise RuntimeError(f"no randomisation rule for {n} {s} {p.dtype}")
            p.copy_(v.to(p.dtype))
            rules[n] = r
    return rules


def build_config(spec):
    from transformers import DeepseekV4Config
    kw = dict(COMMON_CFG)
    kw.update(spec["cfg"])
    cfg = DeepseekV4Config(**kw)
    cfg.architectures = ["DeepseekV4ForCausalLM"]
    return cfg


def load(path, dtype, device):
    from transformers import DeepseekV4ForCausalLM
    kw = dict(dtype=dtype, attn_implementation="eager", output_loading_info=True)
    try:
        model, info = DeepseekV4ForCausalLM.from_pretrained(path, experts_implementation="eager", **kw)
    except TypeError:
        model, info = DeepseekV4ForCausalLM.from_pretrained(path, **kw)
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return model.to(device).eval()


@torch.no_grad()
def forward_logits(model, ids, device):
    x = torch.tensor([ids], dtype=torch.long, device=device)
    out = model(input_ids=x, use_cache=False)
    return out.logits[0].float().cpu()


@torch.no_grad()
def greedy(model, prompt, n_new, device):
    """Manual greedy loop with DynamicCache. Returns (sequence, per-step logits [n_new, V])."""
    from transformers import DynamicCache
    cache = DynamicCache(config=model.config)
    x = torch.tensor([prompt], dtype=torch.long, device=device)
    out = model(input_ids=x, past_key_values=cache, use_cache=True)
    cache = out.past_key_values
    seq = list(prompt)
    step_logits = []
    last = out.logits[0, -1].float()
    for _ in range(n_new):
        step_logits.append(last.cpu())
        nxt = int(torch.argmax(last))
        seq.append(nxt)
        out = model(input_ids=torch.tensor([[nxt]], device=device), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        last = out.logits[0, -1].float()
    return seq, torch.stack(step_logits)


def make_fixture(name, spec, out_dir, device):
    import transformers
    from transformers import DeepseekV4ForCausalLM
    t0 = time.time()
    torch.manual_seed(spec["seed"])
    gen = torch.Generator().manual_seed(1000 + spec["seed"])
    cfg = build_config(spec)
    model = DeepseekV4ForCausalLM(cfg).float()
    rules = randomise(model, cfg, spec["expert_gain"], gen)

    fdir = os.path.join(out_dir, name)
    if os.path.exists(fdir):
        shutil.rmtree(fdir)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        del model
        m16, _ = DeepseekV4ForCausalLM.from_pretrained(tmp, dtype=torch.bfloat16, output_loading_info=True)
        m16.save_pretrained(fdir)
        sd16 = m16.state_dict()
        hf_listing = [(k, str(v.dtype).replace("torch.", ""), list(v.shape)) for k, v in sorted(sd16.items())]
        del m16, sd16
    for extra in ("generation_config.json",):
        p = os.path.join(fdir, extra)
        if os.path.exists(p):
            os.remove(p)

    # tensor listing of what was saved
    from safetensors import safe_open
    listing = []
    with safe_open(os.path.join(fdir, "model.safetensors"), "pt") as f:
        for k in sorted(f.keys()):
            sl = f.get_slice(k)
            listing.append((k, sl.get_dtype(), list(sl.get_shape())))

    model = load(fdir, torch.float32, device)
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(77 + spec["seed"])
    prompt = torch.randint(2, V, (max(LENS),), generator=g).tolist()  # avoid bos/eos ids

    ldir = os.path.join(fdir, "logits")
    os.makedirs(ldir, exist_ok=True)
    full = forward_logits(model, prompt, device)
    checks = {}
    assert torch.isfinite(full).all(), "non-finite logits"
    checks["logits_std_700"] = float(full.std())
    checks["logits_mean_abs_700"] = float(full.abs().mean())
    p = torch.softmax(full.double(), -1)
    checks["mean_top1_prob_700"] = float(p.max(-1).values.mean())
    checks["top1_distinct_tokens_700"] = int(full.argmax(-1).unique().numel())
    causal = {}
    for L in LENS:
        lg = full if L == max(LENS) else forward_logits(model, prompt[:L], device)
        assert lg.shape == (L, V)
        assert torch.isfinite(lg).all()
        lg.numpy().astype("<f4").tofile(os.path.join(ldir, f"exact_{L}.f32"))
        causal[L] = float((lg - full[:L]).abs().max())
    checks["prefix_vs_700_max_abs_diff"] = causal
    worst = max(causal.values())
    log(f"[{name}] logits std {checks['logits_std_700']:.3f} top1p {checks['mean_top1_prob_700']:.3f} "
        f"distinct-argmax {checks['top1_distinct_tokens_700']}  causality max diff {worst:.3e} {causal}")

    def greedy_check(plen, n_new):
        seq, steps = greedy(model, prompt[:plen], n_new, device)
        ref = forward_logits(model, seq, device)  # no cache, whole sequence
        ref_steps = ref[plen - 1: plen - 1 + n_new]
        d = float((steps - ref_steps).abs().max())
        agree = bool((ref_steps.argmax(-1) == torch.tensor(seq[plen:])).all())
        # smallest top1-top2 logit gap among the greedy picks (near ties make decode fragile)
        top2 = ref_steps.topk(2, dim=-1).values
        gap = float((top2[:, 0] - top2[:, 1]).min())
        return seq, {"cache_vs_nocache_max_abs_diff": d, "nocache_argmax_agrees": agree, "min_top1_gap": gap}

    seq, gchk = greedy_check(GREEDY_PROMPT, GREEDY_NEW)
    seq2, gchk2 = greedy_check(GREEDY_LONG_PROMPT, GREEDY_LONG_NEW)
    checks["greedy"] = gchk
    checks["greedy_long"] = gchk2
    log(f"[{name}] greedy {gchk}  long {gchk2}")

    c = model.config
    summary = dict(
        hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers, layer_types=c.layer_types,
        mlp_layer_types=c.mlp_layer_types, compress_rates=c.compress_rates,
        num_attention_heads=c.num_attention_heads, head_dim=c.head_dim, qk_rope_head_dim=c.qk_rope_head_dim,
        q_lora_rank=c.q_lora_rank, o_groups=c.o_groups, o_lora_rank=c.o_lora_rank,
        sliding_window=c.sliding_window, index_n_heads=c.index_n_heads, index_head_dim=c.index_head_dim,
        index_topk=c.index_topk, hc_mult=c.hc_mult, n_routed_experts=c.n_routed_experts,
        num_experts_per_tok=c.num_experts_per_tok, n_shared_experts=c.n_shared_experts,
        moe_intermediate_size=c.moe_intermediate_size, routed_scaling_factor=c.routed_scaling_factor,
        swiglu_limit=c.swiglu_limit, vocab_size=c.vocab_size, rope_parameters=c.rope_parameters,
        seed=spec["seed"], expert_gain=spec["expert_gain"],
    )
    index = {
        "prompt_ids": prompt,
        "lens": LENS,
        "vocab_size": V,
        "layout": "float32 little-endian, row-major [positions x vocab]",
        "greedy_prompt_len": GREEDY_PROMPT,
        "greedy_sequence_exact": seq,
        "greedy_long_prompt_len": GREEDY_LONG_PROMPT,
        "greedy_long_sequence_exact": seq2,
        "greedy_method": ("manual argmax loop with transformers DynamicCache: one prefill forward over the "
                          "prompt, then one token per step; no EOS stopping; sequences include the prompt"),
        "logits_method": ("one forward pass per length over prompt_ids[:L], use_cache=False, float32, eager "
                          "attention, TF32 off, deterministic algorithms; weights = the bf16/f32 values in "
                          "model.safetensors upcast to float32"),
        "config_summary": summary,
        "checks": checks,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "device": device if device == "cpu" else torch.cuda.get_device_name(),
    }
    with open(os.path.join(ldir, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
    with open(os.path.join(fdir, "tensors.txt"), "w") as f:
        f.write("# model.safetensors as written by save_pretrained: name, dtype, shape\n")
        for k, dt, sh in listing:
            f.write(f"{k}\t{dt}\t{sh}\n")
    with open(os.path.join(fdir, "hf_params.txt"), "w") as f:
        f.write("# in-memory transformers state_dict after loading with dtype=bfloat16: name, dtype, shape, init\n")
        for k, dt, sh in hf_listing:
            f.write(f"{k}\t{dt}\t{sh}\t{rules.get(k, '')}\n")

    ok = (worst <= 1e-4 and gchk["nocache_argmax_agrees"] and gchk2["nocache_argmax_agrees"]
          and 0.3 < checks["logits_std_700"] < 20)
    log(f"[{name}] {'OK' if ok else 'CHECK FAILED'} in {time.time() - t0:.1f}s")
    return ok


OFFICIAL_STYLE_CONFIG = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "vocab_size": 512,
    "hidden_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 1,
    "head_dim": 128, "qk_rope_head_dim": 64, "q_lora_rank": 64, "o_groups": 2, "o_lora_rank": 32,
    "sliding_window": 8, "compress_ratios": [0, 4, 128, 4, 128, 0, 0], "compress_rope_theta": 160000.0,
    "rope_theta": 10000.0,
    "rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 32, "beta_fast": 32,
                     "beta_slow": 1},
    "max_position_embeddings": 1048576, "index_n_heads": 16, "index_head_dim": 128, "index_topk": 3,
    "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-06, "rms_norm_eps": 1e-06, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 64,
    "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": True,
    "routed_scaling_factor": 1.5, "num_hash_layers": 1, "swiglu_limit": 10.0, "num_nextn_predict_layers": 1,
    "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False, "bos_token_id": 0,
    "eos_token_id": 1, "expert_dtype": "fp4", "torch_dtype": "bfloat16",
}


def inspect_install(out_dir):
    """Dump library sources and check how an official-style config.json is interpreted."""
    import inspect as ins
    import transformers
    from transformers import DeepseekV4Config
    from transformers import modeling_rope_utils, masking_utils, cache_utils
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m
    d = os.path.join(out_dir, "inspect")
    os.makedirs(d, exist_ok=True)
    for mod in (modeling_rope_utils, masking_utils, cache_utils, m):
        shutil.copy(ins.getsourcefile(mod), d)
    try:
        from transformers.integrations import moe as moe_int
        shutil.copy(ins.getsourcefile(moe_int), d)
    except Exception as e:  # noqa
        log("no integrations.moe", e)
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(OFFICIAL_STYLE_CONFIG, f)
        cfg = DeepseekV4Config.from_pretrained(tmp)
        res = {"parsed": cfg.to_dict()}
        cfg.save_pretrained(os.path.join(tmp, "re"))
        with open(os.path.join(tmp, "re", "config.json")) as f:
            res["resaved_json"] = json.load(f)
        # rope inv_freq of both rope types for this config
        from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RotaryEmbedding
        re_ = DeepseekV4RotaryEmbedding(cfg)
        res["inv_freq_main"] = re_.main_inv_freq.tolist()
        res["inv_freq_compress"] = re_.compress_inv_freq.tolist()
        res["attention_scaling"] = {"main": re_.main_attention_scaling, "compress": re_.compress_attention_scaling}
    with open(os.path.join(d, "official_config_roundtrip.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    log("rope_parameters from official-style config:", json.dumps(res["parsed"].get("rope_parameters")))
    log("layer_types:", res["parsed"].get("layer_types"), "mlp:", res["parsed"].get("mlp_layer_types"))
    log("transformers", transformers.__version__, "torch", torch.__version__)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--only", default="")
    ap.add_argument("--inspect", action="store_true", help="also dump library sources / config round-trip")
    a = ap.parse_args()
    setup_determinism()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    os.makedirs(a.out, exist_ok=True)
    if a.inspect:
        inspect_install(a.out)
    names = [n for n in FIXTURES if not a.only or n in a.only.split(",")]
    all_ok = True
    for n in names:
        all_ok &= make_fixture(n, FIXTURES[n], a.out, a.device)
    log("ALL OK" if all_ok else "SOME CHECKS FAILED")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
