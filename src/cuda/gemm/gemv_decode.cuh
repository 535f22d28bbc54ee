// gemm family, decode path: what both GEMV kernels (gemv.cu: staged activations, any n ≤ 16 and every
// format; gemv_stream.cu: activations straight from L1, n ≤ 4) share — 16-byte streaming loads, the exact
// decoders of each weight format, and the warp reduce-scatter.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>

#include "cuda/common/device_weight.h"
#include "cuda/common/fp_grid.cuh"
#include "cuda/gemm/gemm.h"

namespace dsv4::cuda::gemv_detail {

constexpr int elems_per_chunk(WFormat f) {
  return f == WFormat::kF32 ? 4 : f == WFormat::kBF16 ? 8 : f == WFormat::kFP8 ? 16 : 32;
}

// Weights are streamed once: keep them out of L1.
__device__ __forceinline__ uint4 load_streaming(const uint8_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

__device__ __forceinline__ float abs_max4(float4 v) { return fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))); }

// FP4 nibbles k and k+4 of a word (elements k and k+4 of its 8) as a half2 holding e2m1 · 2^−14, exactly:
// the 3 magnitude bits land in the half's low exponent bits and top mantissa bit, the sign in bit 15. For
// exponent e ≥ 1 the half is 2^(e−15)·(1 + m/2) = e2m1 · 2^−14; for e = 0 the half subnormal m·2^−15 is too.
template <int k>
__device__ __forceinline__ float2 e2m1_pair_scaled(uint32_t w) {
  uint32_t mag;
  if constexpr (k == 3) mag = (w >> 3) & 0x0E000E00u;
  else mag = (w << (9 - 4 * k)) & 0x0E000E00u;
  const uint32_t bits = mag | ((w << (12 - 4 * k)) & 0x80008000u);
  __half2 h;
  memcpy(&h, &bits, sizeof h);
  return __half22float2(h);
}
constexpr float kE2m1Unscale = 16384.0f;  // 2^14: FP4 kernels stage x · 2^14 to undo it (exact)

// Butterfly reduce-scatter of V values over a warp: afterwards lane l holds the warp total of value
// l / (32/V); lanes with l mod (32/V) = 0 own a distinct value. V shuffles fewer than V plain reductions.
template <int V>
__device__ __forceinline__ float warp_reduce_scatter(float (&v)[V], int lane) {
  static_assert(V >= 1 && V <= 32 && (V & (V - 1)) == 0, "V must be a power of two ≤ 32");
  int count = V;  // values still held per lane; constant after unrolling
#pragma unroll
  for (int offset = 16; offset >= 1; offset /= 2) {
    if (count > 1) {
      // Lanes with this offset bit set keep the upper half and receive it from their partner.
      const bool upper = lane & offset;
      const int half = count / 2;
#pragma unroll
      for (int j = 0; j < V / 2; ++j)
        if (j < half) {
          const float send = upper ? v[j] : v[j + half];
          const float keep = upper ? v[j + half] : v[j];
          v[j] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, offset);
        }
      count = half;
    } else {
      v[0] += __shfl_xor_sync(0xFFFFFFFFu, v[0], offset);
    }
  }
  return v[0];
}

// Weights are decoded in groups that match whole float4s of x: 4 elements (x float4 j) for F32 / BF16 /
// FP8, 8 for FP4 (float4s 2j and 2j+1, from one 32-bit word).
template <WFormat F>
constexpr int kGroup = F == WFormat::kFP4 ? 8 : 4;
template <WFormat F>
constexpr int kGroupsPerChunk = F == WFormat::kFP4 ? 4 : elems_per_chunk(F) / 4;

// Group j of one row's chunk, times m. FP8: W = e4m3 · block scale rounded to fp32 per element, as the
// reference computes it (m = the scale). FP4: e2m1 · 2^−14 · m, exact (see fma_chunk).
template <WFormat F>
__device__ __forceinline__ void decode_group(const uint4& wv, float m, int j, float (&w)[kGroup<F>]) {
  if constexpr (F == WFormat::kF32) {
    w[0] = __uint_as_float(wv.x);
    w[1] = __uint_as_float(wv.y);
    w[2] = __uint_as_float(wv.z);
    w[3] = __uint_as_float(wv.w);
  } else if constexpr (F == WFormat::kBF16) {
    const uint32_t lo = word(wv, 2 * j), hi = word(wv, 2 * j + 1);
    w[0] = __uint_as_float(lo << 16);
    w[1] = __uint_as_float(lo & 0xFFFF0000u);
    w[2] = __uint_as_float(hi << 16);
    w[3] = __uint_as_float(hi & 0xFFFF0000u);
  } else if constexpr (F == WFormat::kFP8) {
    const uint32_t u = word(wv, j);
    const float2 a = e4m3x2_to_float2(u), b = e4m3x2_to_float2(u >> 16);
    w[0] = a.x * m;
    w[1] = a.y * m;
    w[2] = b.x * m;
    w[3] = b.y * m;
  } else {
    const uint32_t u = word(wv, j);
    const float2 f0 = e2m1_pair_scaled<0>(u), f1 = e2m1_pair_scaled<1>(u);
    const float2 f2 = e2m1_pair_scaled<2>(u), f3 = e2m1_pair_scaled<3>(u);
    w[0] = f0.x * m;
    w[1] = f1.x * m;
    w[2] = f2.x * m;
    w[3] = f3.x * m;
    w[4] = f0.y * m;
    w[5] = f1.y * m;
    w[6] = f2.y * m;
    w[7] = f3.y * m;
  }
}

// The current device's attributes the launchers size their grids by, read once per device (gemv.cu).
struct DeviceInfo {
  int sms = 0, cc_major = 0, smem_per_sm = 0;
};
const DeviceInfo& device_info();

// The tensor-core kernel (gemv_mma.cu; gemm.h's gemv_mma_covers), which gemv() prefers where it covers the call.
// `second`: a matrix of the same width on the same x (mma_pair_covers), run in the same launch.
bool mma_shape(const GemmParams& p);
bool mma_pair_covers(const GemmParams& a, const GemmParams& b);
void mma(const GemmParams& p, cudaStream_t stream, const GemmParams* second = nullptr);

// The streaming kernel (gemv_stream.cu), which gemv() prefers next where it covers the call.
constexpr int64_t kStreamMaxRows = 4;
// `second`: a matrix of p's format and width on the same x (stream_pair_covers), run in the same launch.
bool stream_covers(const GemmParams& p);
bool stream_pair_covers(const GemmParams& a, const GemmParams& b);
GemvScratchSize stream_scratch_size(const GemmParams& p, const GemmParams* second = nullptr);
void stream(const GemmParams& p, const GemvScratch& scratch, cudaStream_t stream, const GemmParams* second = nullptr);

}  // namespace dsv4::cuda::gemv_detail
