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

// The number of key splits CudaOps::attention asks for this batch on this device (attention_split_kv may run
// fewer: the tensor-core kernels' splits hold whole 64-key tiles).
int attention_default_splits(const CudaOps& ops, std::span<const AttentionParams> batch);

// The kernel CudaOps::attention runs this batch on: "wg" (attention_wg.cu: V4's shape on Hopper, fast
// numerics), "tc" (attention_tc.cu: other tensor-core shapes) or "fp32" (attention.cu).
const char* attention_kernel(const CudaOps& ops, std::span<const AttentionParams> batch);

// CudaOps::attention with an explicit number of key splits (1 = each block finishes its query row itself).
void attention_split_kv(CudaOps& ops, std::span<const AttentionParams> batch, int splits);

// Compressor steps 2–3 (CudaOps::compressor's pooling of the windows each chunk completes and state update) of a
// batch, on precomputed projections kv, gate [Σ n, coff·c] (the batch's chunks in order): leaves the emitted
// entries raw (before norm, RoPE and simulation; rounded to bf16 under fast numerics) in fp32 `pooled`
// [entries, c], each sequence's in order, sequence after sequence; returns how many were emitted.
int64_t compressor_pool(CudaOps& ops, std::span<const CompressorParams> batch, const float* kv, const float* gate,
                        float* pooled);

}  // namespace dsv4::cuda
