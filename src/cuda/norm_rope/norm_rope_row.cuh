// norm_rope family: one row's RMSNorm then RoPE by one block, bit for bit the CPU's rms_norm (its 8 strided
// partial sums, their pairwise tree, unfused products) followed by rope_kernel's rotation. Shared by
// norm_rope_kernel and the kernels that fuse it with what consumes the row (kv_finish's store into the FP8
// window ring, where a last-bit difference in the norm could move a value across a rounding boundary).
#pragma once

#include <cstdint>

#include "cuda/common/fp_grid.cuh"
#include "cuda/norm_rope/rotate.cuh"

namespace dsv4::cuda {

constexpr int kNormRopeThreads = 128;  // the block norm_rope_row runs on
constexpr int kNormLanes = 8;          // the CPU's partial sums: lane k sums x[i + k]² for i = 0, 8, 16, ...
constexpr int64_t kNormRopeMaxDim = 12 * 1024;  // the row in 48 KiB of dynamic shared memory (launchers check)

struct NormRopeRow {
  const float* gamma;     // [dim] or nullptr
  const float* inv_freq;  // [(dim − offset) / 2]
  int64_t dim, offset;    // rope channels [offset, dim), offset even
  float eps;
  // Fast numerics: the norm's and the rotation's outputs rounded to bf16; without a gain the norm is bf16
  // arithmetic throughout (CpuOps::rms_norm_bf16: squares, mean, rsqrt and product each rounded).
  bool bf16 = false;
};

// Thread t's constants of a row at position pos — γ and the rotation's (cos, sin) for its first kRowPrefetch
// channel pairs — gathered before the kernel waits for its predecessor: they do not depend on it, and at
// decode a weight read after the wait is an HBM round trip (and the fp64 sin/cos a chain) on the step's path.
constexpr int kRowPrefetch = 4;  // covers rows of up to 2·kNormRopeThreads·4 = 1024 channels

// The constants of channels c, c + 1 (c even, c < dim): γ ((1, 1) without a gain) and the rotation's (cos, sin)
// at position pos ((1, 0), unused, before the rope offset).
struct PairConsts {
  float2 gamma, cs;
};
__device__ __forceinline__ PairConsts row_pair_consts(const NormRopeRow& p, int64_t c, int64_t pos) {
  PairConsts k{make_float2(1.0f, 1.0f), make_float2(1.0f, 0.0f)};
  if (p.gamma) k.gamma = make_float2(p.gamma[c], c + 1 < p.dim ? p.gamma[c + 1] : 1.0f);
  if (c >= p.offset) k.cs = rope_cos_sin(pos, p.inv_freq[(c - p.offset) / 2], /*inverse=*/false);
  return k;
}

struct NormRopeRowConsts {
  PairConsts pair[kRowPrefetch];
};

// Channel pair i of thread t: channels 2t + 2·kNormRopeThreads·i and the next one.
__device__ __forceinline__ int64_t row_pair_channel(int i) { return 2 * (int64_t(threadIdx.x) + int64_t(kNormRopeThreads) * i); }

__device__ __forceinline__ NormRopeRowConsts norm_rope_row_consts(const NormRopeRow& p, int64_t pos) {
  NormRopeRowConsts k;
#pragma unroll
  for (int i = 0; i < kRowPrefetch; ++i)
    if (row_pair_channel(i) < p.dim) k.pair[i] = row_pair_consts(p, row_pair_channel(i), pos);
  return k;
}

// x [dim] → row_s [dim] (shared memory): γ·(x·inv), inv = 1 / sqrt(Σx²/dim + eps), channels [offset, dim)
// rotated at position pos (k = norm_rope_row_consts(p, pos)); also into out [dim] when out is not null (out may
// alias x). Thread t owns the channel pairs row_pair_channel(i) of row_s and out: a rope pair stays with one
// thread. Other threads' channels of row_s may be read after a barrier.
__device__ __forceinline__ void norm_rope_row(const NormRopeRow& p, const NormRopeRowConsts& k, const float* x,
                                              int64_t pos, float* row_s, float* out) {
  __shared__ float partial[kNormLanes];
  __shared__ float inv_s;
  for (int64_t c = threadIdx.x; c < p.dim; c += kNormRopeThreads) row_s[c] = x[c];
  __syncthreads();
  const int64_t body = p.dim / kNormLanes * kNormLanes;
  const bool bf16_math = p.bf16 && !p.gamma;  // block-uniform
  // x² of channel i: bf16 arithmetic squares a bf16 x and rounds the product.
  const auto square = [&](int64_t i) {
    if (!bf16_math) return __fmul_rn(row_s[i], row_s[i]);
    const float v = round_bf16(row_s[i]);
    return round_bf16(__fmul_rn(v, v));
  };
  if (threadIdx.x < kNormLanes) {
    float acc = 0.0f;
#pragma unroll 8
    for (int64_t i = threadIdx.x; i < body; i += kNormLanes) acc = __fadd_rn(acc, square(i));
    partial[threadIdx.x] = acc;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const float* a = partial;
    float sum = __fadd_rn(__fadd_rn(__fadd_rn(a[0], a[1]), __fadd_rn(a[2], a[3])),
                          __fadd_rn(__fadd_rn(a[4], a[5]), __fadd_rn(a[6], a[7])));
    for (int64_t i = body; i < p.dim; ++i) sum = __fadd_rn(sum, square(i));
    if (bf16_math)
      inv_s = round_bf16(__fdiv_rn(1.0f, __fsqrt_rn(round_bf16(__fadd_rn(round_bf16(__fdiv_rn(sum, float(p.dim))), p.eps)))));
    else
      inv_s = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum, float(p.dim)), p.eps)));
  }
  __syncthreads();
  const float inv = inv_s;
  const auto finish_pair = [&](int64_t c, const PairConsts& pc) {
    const float x0 = bf16_math ? round_bf16(row_s[c]) : row_s[c];
    const float x1 = c + 1 < p.dim ? (bf16_math ? round_bf16(row_s[c + 1]) : row_s[c + 1]) : 0.0f;
    float a = __fmul_rn(x0, inv), b = __fmul_rn(x1, inv);
    if (p.gamma) {
      a = __fmul_rn(pc.gamma.x, a);
      b = __fmul_rn(pc.gamma.y, b);
    }
    a = round_bf16_if(p.bf16, a);
    b = round_bf16_if(p.bf16, b);
    if (c >= p.offset) {
      rotate(a, b, pc.cs);
      a = round_bf16_if(p.bf16, a);
      b = round_bf16_if(p.bf16, b);
    }
    row_s[c] = a;
    if (c + 1 < p.dim) row_s[c + 1] = b;
    if (out) {
      out[c] = a;
      if (c + 1 < p.dim) out[c + 1] = b;
    }
  };
#pragma unroll
  for (int i = 0; i < kRowPrefetch; ++i)
    if (row_pair_channel(i) < p.dim) finish_pair(row_pair_channel(i), k.pair[i]);
  for (int64_t c = row_pair_channel(kRowPrefetch); c < p.dim; c += 2 * kNormRopeThreads)
    finish_pair(c, row_pair_consts(p, c, pos));
}

}  // namespace dsv4::cuda
