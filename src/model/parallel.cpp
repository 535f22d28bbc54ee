#include "model/parallel.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4 {

namespace {

// Bytes of `count` elements of a matrix's storage (packed FP4: two a byte; count is even there).
int64_t storage_bytes(DType dtype, int64_t count) { return dtype == DType::kI8 ? count / 2 : count * int64_t(dtype_size(dtype)); }
int64_t scale_bytes(const Weight& w) { return w.scale_dtype == DType::kF32 ? 4 : 1; }

// A slice [offset, offset + count) along one axis with scale block `block` keeps every element's scale only if
// it starts on a block boundary or lies inside one block; packed FP4 also needs whole blocks (its rows decode
// a block at a time).
void check_cut(const Weight& w, const char* what, const char* axis, int64_t offset, int64_t count, int64_t block) {
  if (!w.scale || block <= 1) return;
  const bool whole = w.dtype == DType::kI8 ? offset % block == 0 && count % block == 0
                                           : offset % block == 0 || offset % block + count <= block;
  DSV4_CHECK(whole, what, ": splitting its ", axis, " at ", offset, " (", count, " per rank) would cut its ", block,
             "-wide scale blocks; choose fewer ranks");
}

// Rows [r0, r0 + rows) of w, as a view.
Weight row_slice(const Weight& w, const char* what, int64_t r0, int64_t rows) {
  if (w.empty()) return w;
  check_cut(w, what, "rows", r0, rows, w.scale_block_rows);
  Weight v = w;
  v.rows = rows;
  v.data = w.data + r0 * w.row_stride;
  if (w.scale) v.scale = w.scale + (r0 / w.scale_block_rows) * w.scale_stride * scale_bytes(w);
  return v;
}

// Columns [c0, c0 + cols) of w, as a view (the row stride stays the full matrix's).
Weight col_slice(const Weight& w, const char* what, int64_t c0, int64_t cols) {
  if (w.empty()) return w;
  check_cut(w, what, "columns", c0, cols, w.scale_block_cols);
  DSV4_CHECK(w.dtype != DType::kI8 || c0 % 2 == 0, what, ": FP4 columns split at an odd column");
  Weight v = w;
  v.cols = cols;
  v.data = w.data + storage_bytes(w.dtype, c0);
  if (w.scale) v.scale = w.scale + (c0 / w.scale_block_cols) * scale_bytes(w);
  return v;
}

// Expert e's intermediate channels [i0, i0 + count): w1 and w3 rows, w2 columns.
ExpertWeights split_expert(const ExpertWeights& e, int64_t i0, int64_t count) {
  return {row_slice(e.w1, "expert w1", i0, count), row_slice(e.w3, "expert w3", i0, count),
          col_slice(e.w2, "expert w2", i0, count)};
}

void shard_layer(LayerWeights& l, const ModelConfig& full, const Parallelism& p, int rank) {
  if (p.tp > 1) {  // attention by heads: H/tp heads, G/tp output groups
    AttentionWeights& a = l.attn;
    const int64_t heads = full.n_heads / p.tp, h0 = rank * heads, d = full.head_dim;
    const int64_t groups = full.o_groups / p.tp, g0 = rank * groups, r_o = full.o_lora_rank;
    a.wq_b = row_slice(a.wq_b, "wq_b", h0 * d, heads * d);
    a.wo_a = row_slice(a.wo_a, "wo_a", g0 * r_o, groups * r_o);
    a.wo_b = col_slice(a.wo_b, "wo_b", g0 * r_o, groups * r_o);
    a.sinks.assign(a.sinks.begin() + h0, a.sinks.begin() + h0 + heads);
  }
  MoeWeights& m = l.moe;
  if (p.experts_whole()) {
    const int64_t per = full.n_routed_experts / p.ep, e0 = rank * per;
    for (int64_t e = 0; e < int64_t(m.experts.size()); ++e)
      if (e < e0 || e >= e0 + per) m.experts[size_t(e)] = ExpertWeights{};
    if (rank != 0) m.shared = ExpertWeights{};
  } else if (p.tp > 1) {
    const int64_t inter = full.moe_inter_dim / p.tp, i0 = rank * inter;
    for (ExpertWeights& e : m.experts) e = split_expert(e, i0, inter);
    m.shared = split_expert(m.shared, i0, inter);
  }
}

}  // namespace

void check_parallelism(const ModelWeights& model, const Parallelism& p) {
  const ModelConfig& c = model.config;
  const int n = p.ranks();
  DSV4_CHECK(p.tp >= 1 && p.ep >= 1, "--tp and --ep must be at least 1");
  DSV4_CHECK((p.tp == 1 || p.tp == n) && (p.ep == 1 || p.ep == n), "--tp ", p.tp, " --ep ", p.ep,
             ": each must be 1 or the number of ranks (", n, "); attention and experts split over the same ranks");
  DSV4_CHECK(c.n_heads % p.tp == 0 && c.o_groups % p.tp == 0, "--tp ", p.tp, ": the model's ", c.n_heads,
             " attention heads in ", c.o_groups, " output groups do not split into ", p.tp, " equal parts");
  DSV4_CHECK(c.n_routed_experts % p.ep == 0, "--ep ", p.ep, ": the model's ", c.n_routed_experts,
             " routed experts do not split into ", p.ep, " equal parts");
  if (!p.experts_whole())
    DSV4_CHECK(c.moe_inter_dim % p.tp == 0, "--tp ", p.tp, ": the experts' intermediate dimension ",
               c.moe_inter_dim, " does not split into ", p.tp, " equal parts");
  for (int r = 0; r < n; ++r) shard_model(model, p, r);  // every slice's scale blocks (throws)
}

std::unique_ptr<ModelWeights> shard_model(const ModelWeights& model, const Parallelism& p, int rank) {
  DSV4_ASSERT(rank >= 0 && rank < p.ranks());
  auto shard = std::make_unique<ModelWeights>(model);  // views and small vectors; the storage stays shared
  ModelWeights& s = *shard;
  ModelConfig& c = s.config;
  c.n_heads /= p.tp;
  c.o_groups /= p.tp;
  if (!p.experts_whole()) c.moe_inter_dim /= p.tp;
  // The LM head by vocabulary rows (every rank scores its share of the tokens; the embedding stays whole: a step
  // reads only its tokens' rows of it).
  const int64_t per = (c.vocab_size + p.ranks() - 1) / p.ranks(), v0 = std::min(c.vocab_size, rank * per);
  s.head = row_slice(model.head, "the LM head", v0, std::min(per, c.vocab_size - v0));
  for (LayerWeights& l : s.layers) shard_layer(l, model.config, p, rank);
  for (MtpWeights& t : s.mtp) shard_layer(t.block, model.config, p, rank);
  index_matrices(s);  // the copy's matrices still point into `model`
  return shard;
}

std::string parallelism_name(const Parallelism& p) {
  if (p.ranks() == 1) return "1 rank";
  if (p.tp > 1 && p.ep > 1) return cat("tp ", p.tp, " · ep ", p.ep);
  return p.tp > 1 ? cat("tp ", p.tp) : cat("ep ", p.ep);
}

}  // namespace dsv4
