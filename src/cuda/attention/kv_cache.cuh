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

// Writing one row of a compact cache from its fp32 values (in shared or global memory), one warp per item: an FP8
// KV row's items are its ⌈nope/64⌉ scale blocks and then its rope channels, an FP4 key row's its dim/32 blocks.
// A block's absmax, its E8M0 exponent, then each lane's codes: the rounding of sim_fp8 / hadamard_sim_fp4's FP4
// step, so a row that went through the simulation is stored without loss.
__host__ __device__ inline int cache_row_items(const CacheLayout& l) {
  return l.format == CacheFormat::kFp8Kv ? (l.nope + 63) / 64 + 1 : int(l.dim / 32);
}

__device__ __forceinline__ void cache_store_fp8_block(const CacheLayout& l, const float* v, uint8_t* row, int b0,
                                                      int lane) {
  const int b1 = min(l.nope, b0 + 64);
  const int c0 = b0 + lane, c1 = b0 + 32 + lane;
  const float x0 = c0 < b1 ? v[c0] : 0.0f, x1 = c1 < b1 ? v[c1] : 0.0f;
  const int e = e4m3_block_exponent(warp_max_f32(fmaxf(fabsf(x0), fabsf(x1))));
  if (c0 < b1) row[c0] = e4m3_code(round_e4m3(clamp_like_std(ldexpf(x0, -e), -448.0f, 448.0f)));
  if (c1 < b1) row[c1] = e4m3_code(round_e4m3(clamp_like_std(ldexpf(x1, -e), -448.0f, 448.0f)));
  if (lane == 0) row[l.scales + b0 / 64] = uint8_t(e + 127);
}

__device__ __forceinline__ void cache_store_fp4_block(const CacheLayout& l, const float* v, uint8_t* row, int b0,
                                                      int lane) {
  const float x = v[b0 + lane];
  const int e = e2m1_block_exponent(warp_max_f32(fabsf(x)));
  const uint32_t code = e2m1_code(round_e2m1(clamp_like_std(ldexpf(x, -e), -6.0f, 6.0f)));
  const uint32_t odd = __shfl_down_sync(0xffffffffu, code, 1);
  if (lane % 2 == 0) row[(b0 + lane) / 2] = uint8_t(code | (odd << 4));
  if (lane == 0) row[l.scales + b0 / 32] = uint8_t(e + 127);
}

// Item `item` (< cache_row_items) of the fp32 row v [dim] into the cache row, by one whole warp.
__device__ __forceinline__ void cache_store_item(const CacheLayout& l, const float* v, uint8_t* row, int item,
                                                 int lane) {
  if (l.format == CacheFormat::kFp4Keys) return cache_store_fp4_block(l, v, row, 32 * item, lane);
  if (item < cache_row_items(l) - 1) return cache_store_fp8_block(l, v, row, 64 * item, lane);
  auto* rope = reinterpret_cast<float*>(row + l.rope);
  for (int64_t j = lane; j < l.dim - l.nope; j += 32) rope[j] = v[l.nope + j];
}

// Rows n of fp32 src (row stride src_stride floats) into a compact cache, row i at row (row0 + i) % modulo,
// quantised exactly as the simulation points do (sim_fp8 on the non-rope channels; FP4 per 32) — lossless
// for rows that already went through the simulation.
void cache_store(CudaOps& ops, const CacheLayout& layout, float* cache, const float* src, int64_t src_stride,
                 int64_t n, int64_t row0, int64_t modulo);

}  // namespace dsv4::cuda
