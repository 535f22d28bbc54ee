#include "model/deepseek_v4.h"

#include <cmath>

#include "core/error.h"

namespace dsv4 {

namespace {

Activations plan_activations(const ModelConfig& c, Ops& ops, int64_t n) {
  const auto f = [&](int64_t count) { return ops.alloc(size_t(n * count)); };
  Activations a;
  a.max_step = n;
  a.tokens = ops.alloc_i32(size_t(n));
  a.X = f(c.hc_mult * c.dim);
  a.x = f(c.dim);
  a.xn = f(c.dim);
  a.post = f(c.hc_mult);
  a.comb = f(c.hc_mult * c.hc_mult);
  a.qr = f(c.q_lora_rank);
  a.q = f(c.n_heads * c.head_dim);
  a.kv = f(c.head_dim);
  a.o = f(c.n_heads * c.head_dim);
  a.z = f(c.o_groups * c.o_lora_rank);
  a.sub_out = f(c.dim);
  a.index_q = f(std::max<int64_t>(c.index_n_heads * c.index_head_dim, 1));
  a.index_w = f(std::max<int64_t>(c.index_n_heads, 1));
  a.selected = ops.alloc_i32(size_t(n * std::max<int64_t>(c.index_topk, 1)));
  a.y = f(c.dim);
  a.logits = f(c.vocab_size);
  a.mtp_e = f(c.dim);
  a.mtp_h = f(c.hc_mult * c.dim);
  return a;
}

RopeKind rope_kind(AttnType t) { return t == AttnType::kSliding ? RopeKind::kPlain : RopeKind::kCompressed; }

}  // namespace

DeepseekV4::DeepseekV4(const ModelWeights& model, Ops& ops, Numerics numerics, int64_t max_context,
                       int64_t max_step)
    : model_(model),
      ops_(ops),
      numerics_(numerics),
      state_(model, ops, max_context, max_step),
      act_(plan_activations(model.config, ops, max_step)) {}

void DeepseekV4::step(const int32_t* tokens, int64_t n, float* logits, bool all_rows) {
  const ModelConfig& c = model_.config;
  DSV4_ASSERT(n >= 1 && n <= act_.max_step);
  DSV4_CHECK(state_.position + n <= state_.max_context, "sequence of ", state_.position + n,
             " tokens exceeds the context limit of ", state_.max_context);
  for (int64_t i = 0; i < n; ++i)
    DSV4_CHECK(tokens[i] >= 0 && tokens[i] < c.vocab_size, "token id ", tokens[i], " is outside the vocabulary [0, ",
               c.vocab_size, ")");
  const int64_t pos0 = state_.position;
  ops_.upload_i32(act_.tokens, tokens, size_t(n));
  ops_.embed(model_.embed, act_.tokens, n, act_.x);
  ops_.broadcast_streams(act_.x, n, c.hc_mult, c.dim, act_.X);
  for (size_t i = 0; i < model_.layers.size(); ++i) block(model_.layers[i], state_.layers[i], pos0, n);
  state_.position += n;
  head(model_.hc_head, model_.norm, n, logits, all_rows);
}

void DeepseekV4::mtp_step(const int32_t* next_tokens, int64_t n, float* logits) {
  const ModelConfig& c = model_.config;
  DSV4_CHECK(has_mtp(), "this checkpoint has no MTP module (mtp.0.* tensors)");
  DSV4_ASSERT(n >= 1 && n <= act_.max_step);
  const MtpWeights& m = model_.mtp[0];
  const int64_t hc = c.hc_mult, D = c.dim;
  // h = h_proj · hnorm(streams) per stream; e = e_proj · enorm(embed(next token)), added to every stream.
  ops_.rms_norm(act_.X, &m.hnorm, n * hc, D, act_.X);
  ops_.linear(act_.X, D, m.h_proj, n * hc, act_.mtp_h, D);
  ops_.upload_i32(act_.tokens, next_tokens, size_t(n));
  ops_.embed(model_.embed, act_.tokens, n, act_.x);
  ops_.rms_norm(act_.x, &m.enorm, n, D, act_.x);
  ops_.linear(act_.x, D, m.e_proj, n, act_.mtp_e, D);
  ops_.broadcast_streams(act_.mtp_e, n, hc, D, act_.X);
  ops_.add(act_.X, act_.mtp_h, size_t(n * hc * D), act_.X);
  block(m.block, state_.mtp[0], state_.mtp_position, n);
  state_.mtp_position += n;
  head(m.hc_head, m.norm, n, logits, /*all_rows=*/true);
}

// One decoder layer: attention then MoE, each wrapped in an mHC pre-mix / post-mix (spec §4–§5).
void DeepseekV4::block(const LayerWeights& l, LayerState& s, int64_t pos0, int64_t n) {
  const ModelConfig& c = model_.config;
  ops_.hc_pre(act_.X, l.hc_attn, n, act_.x, act_.post, act_.comb);
  ops_.rms_norm(act_.x, &l.attn_norm, n, c.dim, act_.xn);
  attention(l, s, pos0, n);
  ops_.hc_post(act_.sub_out, act_.post, act_.comb, n, act_.X);

  ops_.hc_pre(act_.X, l.hc_ffn, n, act_.x, act_.post, act_.comb);
  ops_.rms_norm(act_.x, &l.ffn_norm, n, c.dim, act_.xn);
  moe(l, n);
  ops_.hc_post(act_.sub_out, act_.post, act_.comb, n, act_.X);
}

// Attention sub-block (spec §6): xn → sub_out.
void DeepseekV4::attention(const LayerWeights& l, LayerState& s, int64_t pos0, int64_t n) {
  const ModelConfig& c = model_.config;
  const AttentionWeights& w = l.attn;
  const RopeKind rope = rope_kind(l.attn_type);
  const bool reference = numerics_ == Numerics::kReference;
  query(w, rope, pos0, n);
  key_value(w, s, rope, pos0, n);
  if (l.attn_type != AttnType::kSliding)
    ops_.compressor(w.compressor, s.compressor, act_.xn, pos0, n, reference ? EntrySim::kFp8NoPe : EntrySim::kNone);
  if (l.attn_type == AttnType::kCsa) indexer(w.indexer, s, pos0, n);

  AttentionParams p;
  p.q = act_.q;
  p.window = s.window;
  p.ring_slots = state_.ring_slots;
  p.window_size = c.window;
  p.entries = l.attn_type == AttnType::kSliding ? nullptr : s.compressor.entries;
  p.selected = l.attn_type == AttnType::kCsa ? act_.selected : nullptr;
  p.top_k = c.index_topk;
  p.ratio = int64_t(l.attn_type);
  p.sinks = w.sinks.data();
  p.pos0 = pos0;
  p.n = n;
  p.heads = c.n_heads;
  p.head_dim = c.head_dim;
  p.scale = float(1.0 / std::sqrt(double(c.head_dim)));
  p.out = act_.o;
  ops_.attention(p);
  // K = V carries RoPE, so the output's rope channels are de-rotated at the query position (spec §6.5).
  ops_.rope(act_.o, n * c.n_heads, c.head_dim, c.nope_dim(), c.n_heads, pos0, 1, rope, /*inverse=*/true);
  output_projection(w, n);
}

// q = headRMS(wq_b · RMSNorm(wq_a · x)), RoPE on the last rope_dim channels; qr is kept for the indexer.
void DeepseekV4::query(const AttentionWeights& w, RopeKind rope, int64_t pos0, int64_t n) {
  const ModelConfig& c = model_.config;
  ops_.linear(act_.xn, c.dim, w.wq_a, n, act_.qr, c.q_lora_rank);
  ops_.rms_norm(act_.qr, &w.q_norm, n, c.q_lora_rank, act_.qr);
  ops_.linear(act_.qr, c.q_lora_rank, w.wq_b, n, act_.q, c.n_heads * c.head_dim);
  ops_.rms_norm(act_.q, nullptr, n * c.n_heads, c.head_dim, act_.q);
  ops_.rope(act_.q, n * c.n_heads, c.head_dim, c.nope_dim(), c.n_heads, pos0, 1, rope, false);
}

// The single shared K = V head, stored in the sliding-window ring.
void DeepseekV4::key_value(const AttentionWeights& w, LayerState& s, RopeKind rope, int64_t pos0, int64_t n) {
  const ModelConfig& c = model_.config;
  ops_.linear(act_.xn, c.dim, w.wkv, n, act_.kv, c.head_dim);
  ops_.rms_norm(act_.kv, &w.kv_norm, n, c.head_dim, act_.kv);
  ops_.rope(act_.kv, n, c.head_dim, c.nope_dim(), 1, pos0, 1, rope, false);
  if (numerics_ == Numerics::kReference) ops_.sim_fp8(act_.kv, n, c.head_dim, c.nope_dim(), 64);
  ops_.ring_store(act_.kv, n, c.head_dim, pos0, state_.ring_slots, s.window);
}

// Lightning indexer (spec §8): scores every visible compressed entry and keeps the top k per query.
void DeepseekV4::indexer(const IndexerWeights& w, LayerState& s, int64_t pos0, int64_t n) {
  const ModelConfig& c = model_.config;
  const bool reference = numerics_ == Numerics::kReference;
  const int64_t nI = c.index_n_heads, dI = c.index_head_dim;
  ops_.compressor(w.compressor, s.indexer, act_.xn, pos0, n, reference ? EntrySim::kHadamardFp4 : EntrySim::kNone);
  ops_.linear(act_.qr, c.q_lora_rank, w.wq_b, n, act_.index_q, nI * dI);
  ops_.rope(act_.index_q, n * nI, dI, dI - c.rope_dim, nI, pos0, 1, RopeKind::kCompressed, false);
  if (reference) ops_.hadamard_sim_fp4(act_.index_q, n * nI, dI);
  ops_.linear(act_.xn, c.dim, w.weights_proj, n, act_.index_w, nI);
  ops_.scale(act_.index_w, size_t(n * nI), float(1.0 / std::sqrt(double(dI) * double(nI))));

  IndexerParams p;
  p.q = act_.index_q;
  p.weights = act_.index_w;
  p.keys = s.indexer.entries;
  p.pos0 = pos0;
  p.n = n;
  p.heads = nI;
  p.head_dim = dI;
  p.ratio = 4;
  p.top_k = c.index_topk;
  p.selected = act_.selected;
  ops_.indexer_topk(p);
}

// Grouped low-rank output projection (spec §6.6): o [n, H·d] → z [n, G·r_o] → sub_out [n, D].
void DeepseekV4::output_projection(const AttentionWeights& w, int64_t n) {
  const ModelConfig& c = model_.config;
  ops_.linear_grouped(act_.o, w.wo_a, c.o_groups, n, act_.z);
  ops_.linear(act_.z, c.o_groups * c.o_lora_rank, w.wo_b, n, act_.sub_out, c.dim);
}

void DeepseekV4::moe(const LayerWeights& l, int64_t n) { ops_.moe(l.moe, act_.xn, act_.tokens, n, act_.sub_out); }

// Final hyper-connection collapse, norm and LM head (spec §5.4, §4).
void DeepseekV4::head(const HcHeadWeights& hc, const std::vector<float>& norm, int64_t n, float* logits,
                      bool all_rows) {
  const ModelConfig& c = model_.config;
  ops_.hc_head(act_.X, hc, n, act_.y);
  const int64_t first = all_rows ? 0 : n - 1, rows = all_rows ? n : 1;
  float* y = act_.y + first * c.dim;
  ops_.rms_norm(y, &norm, rows, c.dim, y);
  ops_.linear(y, c.dim, model_.head, rows, act_.logits, c.vocab_size);
  ops_.download(logits, act_.logits, size_t(rows * c.vocab_size));
}

}  // namespace dsv4
