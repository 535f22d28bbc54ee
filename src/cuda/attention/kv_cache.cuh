// attention family (CUDA): reading the compact caches (Ops::alloc_cache, spec §11) inside kernels. A row of a
// compact cache decodes to exactly the fp32 values the CPU stores for it (the simulated values), so kernels
// that read through these helpers compute what they compute on fp32 rows.
//
// Row layouts (CacheLayout, cuda_ops.h), rows row_bytes apart, every row 16-byte aligned:
//   kFp8Kv   [nope e4m3 bytes][⌈nope/64⌉ E8M0 scales] pad [rope_dim fp32 at byte `rope`, 16-aligned]
//   kFp4Keys [dim/2 bytes of e2m1 pairs, element 2j in the low nibble][dim/32 E8M0 scales] pad
#pragma once

#include <cstdint>

#include "cuda/common/fp_grid.cuh"
#include "cuda/cuda_ops.h"

namespace dsv4::cuda {

// Channels c .. c+3 (c a multiple of 4) of a kFp8Kv row.
__device__ __forceinline__ float4 load_fp8kv4(const uint8_t* row, int c, const CacheLayout& l) {
  if (c >= l.nope) return *reinterpret_cast<const float4*>(row + l.rope + 4 * (c - l.nope));
  const uint32_t codes = *reinterpret_cast<const uint32_t*>(row + c);
  const float s = e8m0_value(row[l.scales + c / 64]);
  return make_float4(e4m3_value(codes & 0xFF) * s, e4m3_value((codes >> 8) & 0xFF) * s,
                     e4m3_value((codes >> 16) & 0xFF) * s, e4m3_value(codes >> 24) * s);
}

// Channels c .. c+3 (c a multiple of 4) of a kFp4Keys row.
__device__ __forceinline__ float4 load_fp4key4(const uint8_t* row, int c, const CacheLayout& l) {
  const uint32_t pair = *reinterpret_cast<const uint16_t*>(row + c / 2);
  const float s = e8m0_value(row[l.scales + c / 32]);
  return make_float4(e2m1_value(pair & 0xF) * s, e2m1_value((pair >> 4) & 0xF) * s, e2m1_value((pair >> 8) & 0xF) * s,
                     e2m1_value(pair >> 12) * s);
}

// Rows n of fp32 src (row stride src_stride floats) into a compact cache, row i at row (row0 + i) % modulo,
// quantised exactly as the simulation points do (sim_fp8 on the non-rope channels; FP4 per 32) — lossless
// for rows that already went through the simulation.
void cache_store(CudaOps& ops, const CacheLayout& layout, float* cache, const float* src, int64_t src_stride,
                 int64_t n, int64_t row0, int64_t modulo);

}  // namespace dsv4::cuda
