#include "model/weights.h"

namespace dsv4 {

double stored_bytes(const Weight& w) {
  if (w.empty()) return 0;
  const auto blocks = [](int64_t n, int64_t block) { return double((n + block - 1) / block); };
  double bytes = double(w.rows) * double(w.dtype == DType::kI8 ? w.cols / 2 : w.cols * int64_t(dtype_size(w.dtype)));
  if (w.scale)
    bytes += blocks(w.rows, w.scale_block_rows) * blocks(w.cols, w.scale_block_cols) * double(dtype_size(w.scale_dtype));
  return bytes;
}

void index_matrices(ModelWeights& m) {
  m.matrices.clear();
  auto add = [&](const Weight& w) {
    if (w.empty()) return;
    if (m.matrices.size() <= size_t(w.id)) m.matrices.resize(size_t(w.id) + 1, nullptr);
    m.matrices[size_t(w.id)] = &w;
  };
  auto add_compressor = [&](const CompressorWeights& c) { add(c.wkv); add(c.wgate); };
  auto add_layer = [&](const LayerWeights& l) {
    add(l.hc_attn.fn); add(l.hc_ffn.fn);
    const AttentionWeights& a = l.attn;
    for (const Weight* w : {&a.wq_a, &a.wq_b, &a.wkv, &a.wo_a, &a.wo_b, &a.indexer.wq_b, &a.indexer.weights_proj})
      add(*w);
    add_compressor(a.compressor);
    add_compressor(a.indexer.compressor);
    add(l.moe.gate);
    for (const auto& e : l.moe.experts) { add(e.w1); add(e.w2); add(e.w3); }
    add(l.moe.shared.w1); add(l.moe.shared.w2); add(l.moe.shared.w3);
  };
  add(m.embed); add(m.head); add(m.hc_head.fn);
  for (const auto& l : m.layers) add_layer(l);
  for (const auto& t : m.mtp) { add(t.e_proj); add(t.h_proj); add(t.hc_head.fn); add_layer(t.block); }
}

}  // namespace dsv4
