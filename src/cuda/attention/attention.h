// attention family (CUDA): launch functions beyond the Ops seam, for benchmarks and tests, and the family's
// workspace slots.
#pragma once

#include <cstdint>
#include <span>

#include "model/ops.h"

namespace dsv4 {
class CudaOps;
}

namespace dsv4::cuda {

// Keys of query position t: its window plus its compressed entries (CSA: the top_k slots, −1 ones included).
int64_t attention_keys(const AttentionParams& p, int64_t t);

// The number of key splits CudaOps::attention uses for this batch on this device.
int attention_default_splits(const CudaOps& ops, std::span<const AttentionParams> batch);

// CudaOps::attention with an explicit number of key splits (1 = each block finishes its query row itself).
void attention_split_kv(CudaOps& ops, std::span<const AttentionParams> batch, int splits);

// One sequence's CudaOps::indexer_topk.
void indexer_topk_one(CudaOps& ops, const IndexerParams& p);

// Compressor steps 2–3 (pooling of the windows the chunk completes, state update) on precomputed projections
// kv, gate [n, coff·c]: leaves the pooled entries raw (before norm, RoPE and simulation; rounded to bf16 under
// fast numerics) in fp32 `entries`, entry w at row w − entries_row0 (state.entries itself when it is an fp32
// cache).
struct CompressorChunk {
  int64_t first_entry = 0, count = 0;  // entries first_entry .. first_entry + count − 1 were emitted
};
CompressorChunk compressor_pool(CudaOps& ops, const CompressorWeights& w, CompressorState& state, const float* kv,
                                const float* gate, int64_t pos0, int64_t n, float* entries, int64_t entries_row0);

}  // namespace dsv4::cuda
