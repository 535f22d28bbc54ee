#include "model/state.h"

#include <limits>

#include "core/error.h"

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

SequenceState::SequenceState(std::span<const Shard> shards, int64_t max_ctx, int64_t max_step, bool compact)
    : ring_slots(shards.front().model->config.window + max_step), max_context(max_ctx) {
  for (const Shard& s : shards) {
    s.ops->bind_thread();  // each rank's memory on its own device
    RankCaches& r = ranks.emplace_back();
    const ModelWeights& model = *s.model;
    for (const auto& l : model.layers)
      r.layers.push_back(make_layer(l, model.config, *s.ops, ring_slots, max_context, compact));
    for (const auto& t : model.mtp)
      r.mtp.push_back(make_layer(t.block, model.config, *s.ops, ring_slots, max_context, compact));
  }
  reset(shards);  // ends bound to rank 0, as it began
}

void SequenceState::reset(std::span<const Shard> shards) {
  position = 0;
  mtp_position = 0;
  for (size_t k = 0; k < shards.size(); ++k) {
    const ModelWeights& model = *shards[k].model;
    Ops& ops = *shards[k].ops;
    ops.bind_thread();
    const auto reset_layer = [&](const LayerWeights& l, LayerState& s) {
      reset_compressor(l.attn.compressor, s.compressor, ops);
      reset_compressor(l.attn.indexer.compressor, s.indexer, ops);
    };
    for (size_t i = 0; i < model.layers.size(); ++i) reset_layer(model.layers[i], ranks[k].layers[i]);
    for (size_t i = 0; i < model.mtp.size(); ++i) reset_layer(model.mtp[i].block, ranks[k].mtp[i]);
  }
  shards.front().ops->bind_thread();  // the caller's thread runs rank 0
}

void copy_sequence(std::span<const Shard> shards, const SequenceState& src, SequenceState& dst) {
  DSV4_ASSERT(src.ring_slots == dst.ring_slots && src.ranks.size() == shards.size() &&
              dst.ranks.size() == shards.size() && dst.max_context >= src.position);
  for (size_t k = 0; k < shards.size(); ++k) {
    const ModelWeights& m = *shards[k].model;
    Ops& ops = *shards[k].ops;
    ops.bind_thread();
    const auto compressor = [&](const CompressorWeights& w, const CompressorState& s, CompressorState& d,
                                int64_t position) {
      if (!s.kv) return;
      const size_t cells = size_t(compressor_rows(w) * compressor_cols(w));
      ops.copy(s.kv, cells, d.kv);
      ops.copy(s.score, cells, d.score);
      const int64_t entries = position / w.ratio;  // the entries emitted so far
      if (entries > 0) ops.copy_cache(s.entries, entries, w.width, d.entries);
    };
    const auto layer = [&](const LayerWeights& l, const LayerState& s, LayerState& d, int64_t position) {
      ops.copy_cache(s.window, src.ring_slots, m.config.head_dim, d.window);
      compressor(l.attn.compressor, s.compressor, d.compressor, position);
      compressor(l.attn.indexer.compressor, s.indexer, d.indexer, position);
    };
    const RankCaches& from = src.ranks[k];
    RankCaches& to = dst.ranks[k];
    for (size_t i = 0; i < from.layers.size(); ++i)
      layer(m.layers[i], from.layers[i], to.layers[i], src.position);
    for (size_t i = 0; i < from.mtp.size(); ++i)
      layer(m.mtp[i].block, from.mtp[i], to.mtp[i], src.mtp_position);
  }
  shards.front().ops->bind_thread();  // the caller's thread runs rank 0
  dst.position = src.position;
  dst.mtp_position = src.mtp_position;
}

}  // namespace dsv4
