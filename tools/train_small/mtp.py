"""The DeepSeek-V4 multi-token-prediction (MTP) module in PyTorch, built from transformers' V4 layers.

transformers' DeepseekV4ForCausalLM has no MTP module (it ignores `mtp.*` tensors), so the small model's
training script adds one here. The forward is spec §10, which is what dsv4's DeepseekV4::mtp_step computes:

    H   = the main model's final residual streams at position t   [B, S, hc, D]  (before the hc_head collapse)
    e   = e_proj · enorm(embed(token t+1))                         [B, S, D], added to every stream
    X   = e + h_proj · hnorm(H)                                    (hnorm is an RMSNorm over D, per stream)
    X   = Block(X)                  one decoder layer: mHC + sliding-window attention + score-routed MoE
    logits(t+2) = head · norm(hc_head(X))                          the main model's embedding and head

The block is a DeepseekV4DecoderLayer at layer index L = num_hidden_layers (the spec's MTP layer index), with
layer type sliding_attention and a score-routed MoE, so its weights have exactly the shapes of a main layer.

Tensor names: `official_state_dict` / `load_official` use the official checkpoint names (`mtp.0.attn.wq_a
.weight`, `mtp.0.ffn.experts.3.w1.weight`, ... spec §12.2), which `dsv4 quantize` turns into FP8 / FP4 and
the dsv4 loader reads (src/loader/weight_map.cpp).
"""
import copy
import re

import torch
from torch import nn

SWA = "sliding_attention"

# per-layer name pieces: this module's state_dict name (after "block.") -> official name (after "mtp.0.")
LAYER_NAMES = [
    ("input_layernorm.weight", "attn_norm.weight"),
    ("post_attention_layernorm.weight", "ffn_norm.weight"),
    ("attn_hc.fn", "hc_attn_fn"), ("attn_hc.base", "hc_attn_base"), ("attn_hc.scale", "hc_attn_scale"),
    ("ffn_hc.fn", "hc_ffn_fn"), ("ffn_hc.base", "hc_ffn_base"), ("ffn_hc.scale", "hc_ffn_scale"),
    ("self_attn.q_a_proj.weight", "attn.wq_a.weight"),
    ("self_attn.q_a_norm.weight", "attn.q_norm.weight"),
    ("self_attn.q_b_proj.weight", "attn.wq_b.weight"),
    ("self_attn.kv_proj.weight", "attn.wkv.weight"),
    ("self_attn.kv_norm.weight", "attn.kv_norm.weight"),
    ("self_attn.o_a_proj.weight", "attn.wo_a.weight"),
    ("self_attn.o_b_proj.weight", "attn.wo_b.weight"),
    ("self_attn.sinks", "attn.attn_sink"),
    ("mlp.gate.weight", "ffn.gate.weight"),
    ("mlp.gate.e_score_correction_bias", "ffn.gate.bias"),
    ("mlp.shared_experts.gate_proj.weight", "ffn.shared_experts.w1.weight"),
    ("mlp.shared_experts.up_proj.weight", "ffn.shared_experts.w3.weight"),
    ("mlp.shared_experts.down_proj.weight", "ffn.shared_experts.w2.weight"),
]
TOP_NAMES = [
    ("e_proj.weight", "e_proj.weight"), ("h_proj.weight", "h_proj.weight"),
    ("enorm.weight", "enorm.weight"), ("hnorm.weight", "hnorm.weight"), ("norm.weight", "norm.weight"),
    ("hc_head.hc_fn", "hc_head_fn"), ("hc_head.hc_base", "hc_head_base"), ("hc_head.hc_scale", "hc_head_scale"),
]
# kept in float32 on disk, as transformers keeps the main layers' norms, mHC, sinks and router biases
FP32_OFFICIAL = re.compile(r"(norm\.weight|hc_\w+|attn_sink|gate\.bias)$")


class MTPModule(nn.Module):
    def __init__(self, config):
        super().__init__()
        from transformers.models.deepseek_v4.modeling_deepseek_v4 import (
            DeepseekV4DecoderLayer, DeepseekV4HyperHead, DeepseekV4RMSNorm)
        D, eps = config.hidden_size, config.rms_norm_eps
        self.layer_index = config.num_hidden_layers
        block_config = copy.deepcopy(config)  # the block reads its types at index L
        block_config.layer_types = list(config.layer_types) + [SWA]
        block_config.mlp_layer_types = list(config.mlp_layer_types) + ["moe"]
        self.block = DeepseekV4DecoderLayer(block_config, self.layer_index)
        self.e_proj = nn.Linear(D, D, bias=False)
        self.h_proj = nn.Linear(D, D, bias=False)
        self.enorm = DeepseekV4RMSNorm(D, eps=eps)
        self.hnorm = DeepseekV4RMSNorm(D, eps=eps)
        self.norm = DeepseekV4RMSNorm(D, eps=eps)
        self.hc_head = DeepseekV4HyperHead(config)

    def init_weights(self, model):
        """transformers' own initialisation for every submodule (the router bias starts at zero)."""
        for m in self.modules():
            model._init_weights(m)

    def forward(self, streams, next_ids, model, layer_kwargs):
        """MTP logits [B, S, V] for token t+2 from the main streams at t and token t+1 (next_ids [B, S]).

        layer_kwargs: the keyword arguments the main model passed to its decoder layers for this batch
        (position_embeddings, position_ids, attention_mask); the block, a sliding layer, uses the "main" rope.
        """
        e = self.e_proj(self.enorm(model.model.embed_tokens(next_ids)))
        x = e.unsqueeze(2) + self.h_proj(self.hnorm(streams))
        x = self.block(x, input_ids=next_ids, **layer_kwargs)
        return model.lm_head(self.norm(self.hc_head(x)))


class StreamTap:
    """Forward hooks that keep, for the latest main-model forward, the final residual streams (the input of
    model.model.hc_head) and the keyword arguments of the last decoder layer (rope, positions, mask)."""

    def __init__(self, model):
        self.streams = None
        self.layer_kwargs = None
        model.model.hc_head.register_forward_pre_hook(self._streams)
        model.model.layers[-1].register_forward_pre_hook(self._kwargs, with_kwargs=True)

    def _streams(self, mod, args):
        self.streams = args[0]

    def _kwargs(self, mod, args, kwargs):
        keep = ("position_embeddings", "position_ids", "attention_mask")
        self.layer_kwargs = {k: kwargs[k] for k in keep if k in kwargs}


def official_state_dict(mtp, dtype=torch.bfloat16):
    """{official name: tensor} of the MTP module: matrices in `dtype`, norms / mHC / sinks / bias in float32."""
    sd = {k: v.detach().float().cpu() for k, v in mtp.state_dict().items()}
    out = {}
    for ours, off in TOP_NAMES:
        out[off] = sd.pop(ours)
    for ours, off in LAYER_NAMES:
        out[off] = sd.pop("block." + ours)
    gate_up, down = sd.pop("block.mlp.experts.gate_up_proj"), sd.pop("block.mlp.experts.down_proj")
    inter = gate_up.shape[1] // 2
    for e in range(gate_up.shape[0]):  # transformers fuses [w1; w3] per expert
        out[f"ffn.experts.{e}.w1.weight"] = gate_up[e, :inter]
        out[f"ffn.experts.{e}.w3.weight"] = gate_up[e, inter:]
        out[f"ffn.experts.{e}.w2.weight"] = down[e]
    assert not sd, f"MTP tensors without an official name: {sorted(sd)}"
    return {"mtp.0." + k: (v if FP32_OFFICIAL.search(k) else v.to(dtype)).contiguous() for k, v in out.items()}


def load_official(mtp, tensors):
    """Fill the module from {official name: float tensor} (the inverse of official_state_dict)."""
    t = {k[len("mtp.0."):]: v.float() for k, v in tensors.items() if k.startswith("mtp.0.")}
    sd = {}
    for ours, off in TOP_NAMES:
        sd[ours] = t.pop(off)
    for ours, off in LAYER_NAMES:
        sd["block." + ours] = t.pop(off)
    E = mtp.block.mlp.experts.gate_up_proj.shape[0]
    sd["block.mlp.experts.gate_up_proj"] = torch.stack(
        [torch.cat([t.pop(f"ffn.experts.{e}.w1.weight"), t.pop(f"ffn.experts.{e}.w3.weight")]) for e in range(E)])
    sd["block.mlp.experts.down_proj"] = torch.stack([t.pop(f"ffn.experts.{e}.w2.weight") for e in range(E)])
    assert not t, f"unused MTP tensors: {sorted(t)}"
    mtp.load_state_dict(sd, strict=True)
    return mtp
