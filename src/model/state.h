// Per-sequence inference state (spec §11): the sliding-window KV ring of every layer, the compressors'
// streaming state and emitted entries, the indexer keys. Sized once for a maximum context and step size;
// a new sequence only resets it. Every rank keeps its own copy of the caches (model/parallel.h: the single
// K = V head, the compressors and the indexer are replicated), in its backend's memory.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/ops.h"
#include "model/parallel.h"

namespace dsv4 {

struct LayerState {
  float* window = nullptr;    // [ring_slots, head_dim], CacheFormat kFp8Kv when compact
  CompressorState compressor;  // CSA / HCA main compressor (width head_dim)
  CompressorState indexer;     // CSA indexer compressor (width index_head_dim); entries = indexer keys
};

struct RankCaches {  // one rank's
  std::vector<LayerState> layers;
  std::vector<LayerState> mtp;
};

struct SequenceState {
  int64_t ring_slots = 0;   // window + max_step: a step of n tokens still sees the n + window − 1 newest keys
  int64_t max_context = 0;
  int64_t position = 0;     // tokens consumed by the main model
  int64_t mtp_position = 0;  // tokens consumed by the MTP block
  std::vector<RankCaches> ranks;  // one per shard, in rank order

  // compact: the caches may be stored in the lossless FP8 / FP4 formats (reference and fast numerics).
  SequenceState(std::span<const Shard> shards, int64_t max_context, int64_t max_step, bool compact);
  void reset(std::span<const Shard> shards);  // compressor kv 0 / score −inf, positions 0
};

// Makes dst a copy of src (the same context at the same position) on every rank: a batch of sequences at
// context C costs one prefill of C tokens. Both were made for the same shards; dst holds at least src's context.
void copy_sequence(std::span<const Shard> shards, const SequenceState& src, SequenceState& dst);

}  // namespace dsv4
