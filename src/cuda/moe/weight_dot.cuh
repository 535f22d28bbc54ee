// moe family: the inner loop shared by the router and the expert kernels. A warp dots R rows of NM
// checkpoint matrices (any device format) with up to MC activation rows staged in shared memory. Each lane
// reads one 16-byte chunk of every row per step (32 FP4 / 16 FP8 / 8 BF16 / 4 F32 elements), decodes it in
// registers and accumulates in fp32. A chunk never straddles a scale block (32 columns for FP4, 128 for
// FP8), so its block scale multiplies the chunk's partial sum once instead of every element; scales are
// powers of two for FP4 (exact) and per 128x128 block for FP8.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/common/dequant.cuh"
#include "cuda/common/device_weight.h"
#include "cuda/common/fp_grid.cuh"

namespace dsv4::cuda::moe {

// One matrix as the kernels read it: `rows` rows of row_bytes each, compact (cuda::DeviceWeight storage).
struct MatView {
  const uint8_t* data = nullptr;  // [rows, row_bytes]
  const void* scale = nullptr;    // kFP8: float [ceil(rows/128), scale_cols]; kFP4: uint8 e8m0 [rows, scale_cols]
  int64_t row_bytes = 0;
  int64_t scale_cols = 0;
  bool tiled = false;  // data (and FP4 scales) in the MMA tile order (weight_mma.cuh); tensor-core path only
};

template <WFormat F>
constexpr int kChunkElems = F == WFormat::kFP4 ? 32 : F == WFormat::kFP8 ? 16 : F == WFormat::kBF16 ? 8 : 4;

// Activations staged in shared memory: element k of a row sits at padded(k). Four pad floats per 32 make
// the 16-byte reads of the 32 lanes (one chunk each, chunks consecutive) hit distinct banks in every
// format, and keep every 4-element group 16-byte aligned.
__host__ __device__ constexpr int64_t padded(int64_t k) { return k + 4 * (k / 32); }
// Row stride of a staged activation row of `cols` elements (zero-filled up to a multiple of 32).
__host__ __device__ constexpr int64_t staged_stride(int64_t cols) { return padded((cols + 31) / 32 * 32); }

// 16-byte chunks in a row of `cols` elements of format F.
template <WFormat F>
__host__ __device__ constexpr int64_t chunks_per_row(int64_t cols) {
  return (cols + kChunkElems<F> - 1) / kChunkElems<F>;
}

// Weights are streamed once per step: keep them out of L1 so the staged activations and tables stay.
__device__ __forceinline__ uint4 load_stream16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Chunk q of a row. Rows whose length is not a multiple of 16 bytes (odd F32/BF16/FP8 widths) are not
// 16-byte aligned: those are assembled byte by byte, zero past the row end (zero weights contribute 0).
__device__ __forceinline__ uint4 load_chunk(const uint8_t* row, int64_t q, int64_t row_bytes, bool aligned) {
  if (aligned) return load_stream16(row + 16 * q);
  uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
  for (int b = 0; b < 16; ++b) {
    const int64_t i = 16 * q + b;
    if (i < row_bytes) w[b / 4] |= uint32_t(row[i]) << (8 * (b % 4));
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t two_bytes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two_bytes), __NV_E4M3);
  return __half22float2(__half2(h));
}

// Eight FP4 e2m1 codes (element 2j in the low nibble of byte j) → the values × 2^-6, in element order.
// Each code is rewritten as the e4m3 byte of the same value × 2^-6 (exponent and mantissa bits move
// down into e4m3's fields, subnormals included), then converted two at a time by the hardware.
__device__ __forceinline__ void fp4_word_to_floats(uint32_t w, float (&f)[8]) {
  const uint32_t even = ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u);  // elements 0, 2, 4, 6
  const uint32_t odd = ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u);           // elements 1, 3, 5, 7
  const float2 a = e4m3x2_to_float2(even & 0xFFFFu), b = e4m3x2_to_float2(even >> 16);
  const float2 c = e4m3x2_to_float2(odd & 0xFFFFu), d = e4m3x2_to_float2(odd >> 16);
  f[0] = a.x; f[1] = c.x; f[2] = a.y; f[3] = c.y;
  f[4] = b.x; f[5] = d.x; f[6] = b.y; f[7] = d.y;
}

// The block scale of chunk q of row `row`, folded with the decoder's 2^-6 for FP4. Exact for FP4 (powers of
// two); 1 for the unscaled formats.
template <WFormat F>
__device__ __forceinline__ float chunk_scale(const MatView& m, int64_t row, int64_t q) {
  if constexpr (F == WFormat::kFP4) {
    return e8m0_bits_to_f32(static_cast<const uint8_t*>(m.scale)[row * m.scale_cols + q]) * 64.0f;
  } else if constexpr (F == WFormat::kFP8) {
    return static_cast<const float*>(m.scale)[(row / 128) * m.scale_cols + (q * 16) / 128];
  } else {
    return 1.0f;
  }
}

// part[i][r][m] += Σ over the chunk's elements of decoded(raw[i][r]) · x[m], x = xs + m·xs_stride pointing at
// the chunk's first (padded) element.
template <WFormat F, int NM, int R, int MC>
__device__ __forceinline__ void dot_chunk(const uint4 (&raw)[NM][R], const float* xs, int64_t xs_stride,
                                          float (&part)[NM][R][MC]) {
  if constexpr (F == WFormat::kFP4) {
#pragma unroll
    for (int wi = 0; wi < 4; ++wi) {
      float xv[MC][8];
#pragma unroll
      for (int m = 0; m < MC; ++m) {
        const float4 a = *reinterpret_cast<const float4*>(xs + m * xs_stride + 8 * wi);
        const float4 b = *reinterpret_cast<const float4*>(xs + m * xs_stride + 8 * wi + 4);
        xv[m][0] = a.x; xv[m][1] = a.y; xv[m][2] = a.z; xv[m][3] = a.w;
        xv[m][4] = b.x; xv[m][5] = b.y; xv[m][6] = b.z; xv[m][7] = b.w;
      }
#pragma unroll
      for (int i = 0; i < NM; ++i)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const uint32_t word = wi == 0 ? raw[i][r].x : wi == 1 ? raw[i][r].y : wi == 2 ? raw[i][r].z : raw[i][r].w;
          float f[8];
          fp4_word_to_floats(word, f);
#pragma unroll
          for (int m = 0; m < MC; ++m)
#pragma unroll
            for (int e = 0; e < 8; ++e) part[i][r][m] = fmaf(f[e], xv[m][e], part[i][r][m]);
        }
    }
  } else if constexpr (F == WFormat::kFP8) {
#pragma unroll
    for (int wi = 0; wi < 4; ++wi) {
      float4 xv[MC];
#pragma unroll
      for (int m = 0; m < MC; ++m) xv[m] = *reinterpret_cast<const float4*>(xs + m * xs_stride + 4 * wi);
#pragma unroll
      for (int i = 0; i < NM; ++i)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const uint32_t word = wi == 0 ? raw[i][r].x : wi == 1 ? raw[i][r].y : wi == 2 ? raw[i][r].z : raw[i][r].w;
          const float2 lo = e4m3x2_to_float2(word & 0xFFFFu), hi = e4m3x2_to_float2(word >> 16);
#pragma unroll
          for (int m = 0; m < MC; ++m) {
            float acc = part[i][r][m];
            acc = fmaf(lo.x, xv[m].x, acc);
            acc = fmaf(lo.y, xv[m].y, acc);
            acc = fmaf(hi.x, xv[m].z, acc);
            acc = fmaf(hi.y, xv[m].w, acc);
            part[i][r][m] = acc;
          }
        }
    }
  } else if constexpr (F == WFormat::kBF16) {
#pragma unroll
    for (int g = 0; g < 2; ++g) {  // two words = four elements per x group
      float4 xv[MC];
#pragma unroll
      for (int m = 0; m < MC; ++m) xv[m] = *reinterpret_cast<const float4*>(xs + m * xs_stride + 4 * g);
#pragma unroll
      for (int i = 0; i < NM; ++i)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const uint32_t w0 = g == 0 ? raw[i][r].x : raw[i][r].z;
          const uint32_t w1 = g == 0 ? raw[i][r].y : raw[i][r].w;
          const float f0 = __uint_as_float(w0 << 16), f1 = __uint_as_float(w0 & 0xFFFF0000u);
          const float f2 = __uint_as_float(w1 << 16), f3 = __uint_as_float(w1 & 0xFFFF0000u);
#pragma unroll
          for (int m = 0; m < MC; ++m) {
            float acc = part[i][r][m];
            acc = fmaf(f0, xv[m].x, acc);
            acc = fmaf(f1, xv[m].y, acc);
            acc = fmaf(f2, xv[m].z, acc);
            acc = fmaf(f3, xv[m].w, acc);
            part[i][r][m] = acc;
          }
        }
    }
  } else {  // kF32
    float4 xv[MC];
#pragma unroll
    for (int m = 0; m < MC; ++m) xv[m] = *reinterpret_cast<const float4*>(xs + m * xs_stride);
#pragma unroll
    for (int i = 0; i < NM; ++i)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float f0 = __uint_as_float(raw[i][r].x), f1 = __uint_as_float(raw[i][r].y);
        const float f2 = __uint_as_float(raw[i][r].z), f3 = __uint_as_float(raw[i][r].w);
#pragma unroll
        for (int m = 0; m < MC; ++m) {
          float acc = part[i][r][m];
          acc = fmaf(f0, xv[m].x, acc);
          acc = fmaf(f1, xv[m].y, acc);
          acc = fmaf(f2, xv[m].z, acc);
          acc = fmaf(f3, xv[m].w, acc);
          part[i][r][m] = acc;
        }
      }
  }
}

// Per-lane partial dots of rows row0 .. row0+R−1 of the NM matrices with the MC staged rows, over the
// 16-byte chunks [q_begin, q_end) of the rows (lane l takes chunks q_begin + l, + 32, …). Rows at or past
// rows_valid read as zero. The caller reduces across the warp (warp_sum).
template <WFormat F, int NM, int R, int MC>
__device__ __forceinline__ void warp_dot(const MatView (&mats)[NM], int64_t row0, int rows_valid, int64_t q_begin,
                                         int64_t q_end, bool aligned, const float* xs, int64_t xs_stride,
                                         float (&acc)[NM][R][MC]) {
  // Chunks in flight per lane: 2·NM·R while registers allow; the 4-row passes do more math per byte.
  constexpr int kUnroll = MC >= 4 ? 1 : 2;
  const int lane = int(threadIdx.x & 31);
#pragma unroll
  for (int i = 0; i < NM; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < MC; ++m) acc[i][r][m] = 0.0f;

  for (int64_t q0 = q_begin + lane; q0 < q_end; q0 += 32 * kUnroll) {
    uint4 raw[kUnroll][NM][R];
    float scale[kUnroll][NM][R];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t q = q0 + 32 * u;
#pragma unroll
      for (int i = 0; i < NM; ++i)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const bool live = q < q_end && r < rows_valid;
          raw[u][i][r] = live ? load_chunk(mats[i].data + (row0 + r) * mats[i].row_bytes, q, mats[i].row_bytes, aligned)
                              : make_uint4(0, 0, 0, 0);
          scale[u][i][r] = live ? chunk_scale<F>(mats[i], row0 + r, q) : 0.0f;
        }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t q = q0 + 32 * u;
      if (q >= q_end) break;
      const float* xq = xs + padded(q * kChunkElems<F>);
      if constexpr (F == WFormat::kFP4 || F == WFormat::kFP8) {
        float part[NM][R][MC];
#pragma unroll
        for (int i = 0; i < NM; ++i)
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int m = 0; m < MC; ++m) part[i][r][m] = 0.0f;
        dot_chunk<F, NM, R, MC>(raw[u], xq, xs_stride, part);
#pragma unroll
        for (int i = 0; i < NM; ++i)
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int m = 0; m < MC; ++m) acc[i][r][m] = fmaf(part[i][r][m], scale[u][i][r], acc[i][r][m]);
      } else {
        dot_chunk<F, NM, R, MC>(raw[u], xq, xs_stride, acc);
      }
    }
  }
}

// Butterfly sum over the 32 lanes: every lane ends with the same, order-independent-of-lane total.
template <int NM, int R, int MC>
__device__ __forceinline__ void warp_sum(float (&acc)[NM][R][MC]) {
#pragma unroll
  for (int i = 0; i < NM; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < MC; ++m) {
        float v = acc[i][r][m];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
        acc[i][r][m] = v;
      }
}

// How a GEMM's activations are rounded as they are staged. Fast numerics round them as CpuOps::linear_fast does
// (fast-numerics.md §7 step 15): to bf16 for BF16 weights; to bf16 and then act_quant — e4m3 with a power-of-two
// scale per token per 128 columns — for FP8 and FP4 weights. kNone: reference and exact numerics, the router
// (fp32 in every numerics), F32 weights.
enum class StageRounding : uint8_t { kNone, kBf16, kActQuant };

// act_quant of four columns of one 128-column block; the warp's 32 lanes hold its 128 columns and call together:
// each value to bf16, the block's amax by shuffles, then the e4m3 round trip with the block's scale — bit for bit
// src/cpu/quant.cpp's fp8_round_trip of the bf16 row (zeros past the row end leave the amax as it is).
__device__ __forceinline__ void act_quant_lanes(float (&v)[4]) {
  float amax = 0.0f;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    v[e] = round_bf16(v[e]);
    amax = fmaxf(amax, fabsf(v[e]));
  }
  // The conversion instruction, not e4m3_round_trip's arithmetic: expert_down's decode kernel stages its h rows
  // act_quant'ed in a per-warp prologue before its first MMA (the same values, bit for bit).
  const float4 q = act_quant4(make_float4(v[0], v[1], v[2], v[3]), e4m3_block_exponent(warp_max_f32(amax)));
  v[0] = q.x;
  v[1] = q.y;
  v[2] = q.z;
  v[3] = q.w;
}

// Four columns as `rounding` says; kActQuant as act_quant_lanes (the whole warp calls).
__device__ __forceinline__ void round_staged(StageRounding rounding, float (&v)[4]) {
  if (rounding == StageRounding::kBf16) {
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = round_bf16(v[e]);
  } else if (rounding == StageRounding::kActQuant) {
    act_quant_lanes(v);
  }
}

// Copies `count` activation rows (row m at src + row_index(m)·cols), rounded as `rounding` says, into the padded
// layout at xs, zero-filling columns up to the staged stride and rows count .. rows_total−1. Called by the whole
// block (blockDim.x a multiple of 32); a warp copies 128 consecutive columns a round from a multiple of 128, one
// act_quant block, and every lane takes part in every round (the last may reach past the row).
template <class RowIndex>
__device__ __forceinline__ void stage_rows(const float* __restrict__ src, int64_t cols, int count, int rows_total,
                                           RowIndex row_index, StageRounding rounding, float* xs) {
  const int64_t stride = staged_stride(cols);
  const int64_t padded_cols = (cols + 31) / 32 * 32;
  const bool vec = cols % 4 == 0;  // rows 16-byte aligned in global memory
  const int64_t lane_col = 4 * int64_t(threadIdx.x % 32);
  for (int m = 0; m < rows_total; ++m) {
    float* dst = xs + m * stride;
    const float* row = m < count ? src + int64_t(row_index(m)) * cols : nullptr;
#pragma unroll 4
    for (int64_t k0 = 4 * int64_t(threadIdx.x) - lane_col; k0 < padded_cols; k0 += 4 * int64_t(blockDim.x)) {
      const int64_t k = k0 + lane_col;
      float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (row) {
        if (vec && k < cols) {
          const float4 q = *reinterpret_cast<const float4*>(row + k);
          v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) v[e] = k + e < cols ? row[k + e] : 0.0f;
        }
      }
      round_staged(rounding, v);
      if (k < padded_cols) *reinterpret_cast<float4*>(dst + padded(k)) = make_float4(v[0], v[1], v[2], v[3]);
    }
  }
}

// Asks for the 128-byte line holding p in L2, without waiting: a weight read after the wait for the predecessor
// (launch.cuh) is an HBM round trip on the decode step's path unless it was asked for before.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(reinterpret_cast<uint64_t>(p)));
}

}  // namespace dsv4::cuda::moe
