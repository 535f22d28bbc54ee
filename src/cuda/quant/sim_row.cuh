// quant family: the steps of the simulation points on a row in memory (global or shared), shared by the quant ops'
// kernels (quant.cu) and the kernels that fuse a simulation into the op producing the row (the compressor's
// entries): the same arithmetic wherever the row lives, so the fused results are the ops' bit for bit.
#pragma once

#include <cstdint>

#include "cuda/common/fp_grid.cuh"

namespace dsv4::cuda {

// sim_fp8 of v[b0, b1) by one warp: the block's absmax (of the bf16-rounded values when bf16), its e4m3
// exponent, then each value's round trip.
__device__ __forceinline__ void sim_fp8_block(float* v, int64_t b0, int64_t b1, int lane, bool bf16) {
  float amax = 0.0f;
  for (int64_t i = b0 + lane; i < b1; i += 32) amax = fmaxf(amax, fabsf(round_bf16_if(bf16, v[i])));
  const int e = e4m3_block_exponent(warp_max_f32(amax));
  for (int64_t i = b0 + lane; i < b1; i += 32) v[i] = e4m3_round_trip(round_bf16_if(bf16, v[i]), e);
}

// Stage h of the Walsh–Hadamard butterflies on v [dim] (the CPU's stage order, so each element sees the same
// fp32 additions): element i pairs with i + h for every i whose bit h is clear, (a, b) → (a + b, a − b). This
// thread takes pairs t, t + threads, ... of the dim/2; the caller synchronises the threads between stages.
__device__ __forceinline__ void hadamard_stage(float* v, int dim, int h, int t, int threads) {
  for (int k = t; k < dim / 2; k += threads) {
    const int i = (k / h) * 2 * h + k % h;
    const float a = v[i], b = v[i + h];
    v[i] = a + b;
    v[i + h] = a - b;
  }
}

// hadamard_sim_fp4's FP4 step on the 32 transformed values v[b0, b0 + 32), by one warp: scaled by norm (then
// rounded to bf16 when bf16), e2m1 with an E8M0 scale per 32, into out[b0, b0 + 32) (which may alias v).
__device__ __forceinline__ void fp4_block_round_trip(const float* v, float* out, int b0, int lane, float norm,
                                                     bool bf16) {
  const float h = round_bf16_if(bf16, v[b0 + lane] * norm);
  const int e = e2m1_block_exponent(warp_max_f32(fabsf(h)));
  const float q = clamp_like_std(ldexpf(h, -e), -6.0f, 6.0f);
  out[b0 + lane] = ldexpf(round_e2m1(q), e);
}

}  // namespace dsv4::cuda
