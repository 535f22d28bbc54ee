#include "model/state.h"

#include <limits>

namespace dsv4 {

namespace {

int64_t compressor_rows(const CompressorWeights& w) { return (w.overlap ? 2 : 1) * w.ratio; }
int64_t compressor_cols(const CompressorWeights& w) { return (w.overlap ? 2 : 1) * w.width; }

CompressorState make_compressor(const CompressorWeights& w, Ops& ops, int64_t max_context, CacheFormat format) {
  CompressorState s;
  const size_t cells = size_t(compressor_rows(w) * compressor_cols(w));
  s.kv = ops.alloc(cells);
  s.score = ops.alloc(cells);
  s.max_entries = max_context / w.ratio;
  s.entries = ops.alloc_cache(format, std::max<int64_t>(s.max_entries, 1), w.width);
  return s;
}

void reset_compressor(const CompressorWeights& w, CompressorState& s, Ops& ops) {
  if (!s.kv) return;
  const size_t cells = size_t(compressor_rows(w) * compressor_cols(w));
  ops.fill(s.kv, cells, 0.0f);
  ops.fill(s.score, cells, -std::numeric_limits<float>::infinity());
}

LayerState make_layer(const LayerWeights& l, const ModelConfig& c, Ops& ops, int64_t ring_slots,
                      int64_t max_context, bool compact) {
  const CacheFormat kv = compact ? CacheFormat::kFp8Kv : CacheFormat::kF32;
  const CacheFormat keys = compact ? CacheFormat::kFp4Keys : CacheFormat::kF32;
  LayerState s;
  s.window = ops.alloc_cache(kv, ring_slots, c.head_dim);
  if (l.attn_type != AttnType::kSliding) s.compressor = make_compressor(l.attn.compressor, ops, max_context, kv);
  if (l.attn_type == AttnType::kCsa)
    s.indexer = make_compressor(l.attn.indexer.compressor, ops, max_context, keys);
  return s;
}

}  // namespace

SequenceState::SequenceState(const ModelWeights& model, Ops& ops, int64_t max_ctx, int64_t max_step, bool compact)
    : ring_slots(model.config.window + max_step), max_context(max_ctx) {
  for (const auto& l : model.layers)
    layers.push_back(make_layer(l, model.config, ops, ring_slots, max_context, compact));
  for (const auto& t : model.mtp)
    mtp.push_back(make_layer(t.block, model.config, ops, ring_slots, max_context, compact));
  reset(model, ops);
}

void SequenceState::reset(const ModelWeights& model, Ops& ops) {
  position = 0;
  mtp_position = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    reset_compressor(model.layers[i].attn.compressor, layers[i].compressor, ops);
    reset_compressor(model.layers[i].attn.indexer.compressor, layers[i].indexer, ops);
  }
}

}  // namespace dsv4
