// Per-sequence inference state (spec §11): the sliding-window KV ring of every layer, the compressors'
// streaming state and emitted entries, the indexer keys. Sized once for a maximum context and step size;
// a new sequence only resets it.
#pragma once

#include <cstdint>
#include <vector>

#include "model/ops.h"

namespace dsv4 {

struct LayerState {
  float* window = nullptr;    // [ring_slots, head_dim], CacheFormat kFp8Kv when compact
  CompressorState compressor;  // CSA / HCA main compressor (width head_dim)
  CompressorState indexer;     // CSA indexer compressor (width index_head_dim); entries = indexer keys
};

struct SequenceState {
  int64_t ring_slots = 0;   // window + max_step: a step of n tokens still sees the n + window − 1 newest keys
  int64_t max_context = 0;
  int64_t position = 0;     // tokens consumed by the main model
  int64_t mtp_position = 0;  // tokens consumed by the MTP block
  std::vector<LayerState> layers;
  std::vector<LayerState> mtp;

  // compact: the caches may be stored in the lossless FP8 / FP4 formats (reference and fast numerics).
  SequenceState(const ModelWeights& model, Ops& ops, int64_t max_context, int64_t max_step, bool compact);
  void reset(const ModelWeights& model, Ops& ops);  // compressor kv 0 / score −inf, positions 0
};

}  // namespace dsv4
