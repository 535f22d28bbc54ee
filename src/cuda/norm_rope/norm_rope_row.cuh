// norm_rope family: one row's RMSNorm then RoPE by one block, bit for bit the CPU's rms_norm (its 8 strided
// partial sums, their pairwise tree, unfused products; the gain-less bf16 norm of fast numerics in a warp's order,
// rms_norm_bf16's) followed by rope_kernel's rotation. Shared by
// norm_rope_kernel and the kernels that fuse it with what consumes the row (kv_finish's store into the FP8
// window ring, where a last-bit difference in the norm could move a value across a rounding boundary).
#pragma once

#include <cuda_bf16.h>

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

// x² of channel value v: bf16 arithmetic (bf16_math) squares a bf16 v and rounds the product.
__device__ __forceinline__ float row_square(float v, bool bf16_math) {
  if (!bf16_math) return __fmul_rn(v, v);
  v = round_bf16(v);
  return round_bf16(__fmul_rn(v, v));
}

// inv = 1 / sqrt(sum / dim + eps) from the row's sum of squares, each step rounded under bf16_math.
__device__ __forceinline__ float inv_rms_of(const NormRopeRow& p, float sum, bool bf16_math) {
  if (bf16_math)
    return round_bf16(__fdiv_rn(1.0f, __fsqrt_rn(round_bf16(__fadd_rn(round_bf16(__fdiv_rn(sum, float(p.dim))), p.eps)))));
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum, float(p.dim)), p.eps)));
}

// The row's sum of squares from its kNormLanes partial sums (the CPU's pairwise tree), the channels past the
// partials' body added in order, and its inv (fp32 arithmetic: the norms with a gain, and reference numerics).
__device__ __forceinline__ float row_inv_rms(const NormRopeRow& p, const float (&a)[kNormLanes], const float* row_s,
                                             int64_t body) {
  float sum = __fadd_rn(__fadd_rn(__fadd_rn(a[0], a[1]), __fadd_rn(a[2], a[3])),
                        __fadd_rn(__fadd_rn(a[4], a[5]), __fadd_rn(a[6], a[7])));
  for (int64_t i = body; i < p.dim; ++i) sum = __fadd_rn(sum, row_square(row_s[i], false));
  return inv_rms_of(p, sum, false);
}

// The gain-less norm of fast numerics (bf16 arithmetic: the query heads') sums its squares in a warp's order, which
// CpuOps::rms_norm_bf16 writes out: lane l sums channel pairs l, l + 32, l + 64, ... (channel 2q, then 2q + 1, of
// pair q), then the 32 partial sums meet in a butterfly (distances 16, 8, 4, 2, 1), so every lane of the warp
// holds the row's inv. All 32 lanes share the row, where the fp32 order's 8 strided partials leave 24 idle: at
// prefill the query heads' norm was bound by that serial chain (1600 instructions a row).
__device__ __forceinline__ float row_inv_rms_bf16_warp(const NormRopeRow& p, const float* row_s) {
  float acc = 0.0f;
  for (int64_t c = 2 * (threadIdx.x % 32); c < p.dim; c += 64) {
    acc = __fadd_rn(acc, row_square(row_s[c], true));
    if (c + 1 < p.dim) acc = __fadd_rn(acc, row_square(row_s[c + 1], true));
  }
#pragma unroll
  for (int d = 16; d >= 1; d /= 2) acc = __fadd_rn(acc, __shfl_xor_sync(0xFFFFFFFFu, acc, d));
  return inv_rms_of(p, acc, true);
}

// Channels c, c + 1 of row_s normed by inv, scaled by γ, rotated past the rope offset (each rounded to bf16 in
// fast numerics), back into row_s and into out when it is not null.
__device__ __forceinline__ void finish_row_pair(const NormRopeRow& p, float inv, bool bf16_math, int64_t c,
                                                const PairConsts& pc, float* row_s, float* out) {
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
  if (bf16_math) {
    if (threadIdx.x < 32) {
      const float inv = row_inv_rms_bf16_warp(p, row_s);
      if (threadIdx.x == 0) inv_s = inv;
    }
  } else {
    if (threadIdx.x < kNormLanes) {
      float acc = 0.0f;
#pragma unroll 8
      for (int64_t i = threadIdx.x; i < body; i += kNormLanes) acc = __fadd_rn(acc, row_square(row_s[i], false));
      partial[threadIdx.x] = acc;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float a[kNormLanes];
#pragma unroll
      for (int l = 0; l < kNormLanes; ++l) a[l] = partial[l];
      inv_s = row_inv_rms(p, a, row_s, body);
    }
  }
  __syncthreads();
  const float inv = inv_s;
#pragma unroll
  for (int i = 0; i < kRowPrefetch; ++i)
    if (row_pair_channel(i) < p.dim) finish_row_pair(p, inv, bf16_math, row_pair_channel(i), k.pair[i], row_s, out);
  for (int64_t c = row_pair_channel(kRowPrefetch); c < p.dim; c += 2 * kNormRopeThreads)
    finish_row_pair(p, inv, bf16_math, c, row_pair_consts(p, c, pos), row_s, out);
}

// norm_rope_row on one warp, for kernels that give each warp a row (many rows: a block's 128 threads per row
// leave its serial partial sums too few rows in flight). The same arithmetic in the same order; row_s is the
// warp's own [dim], its constants gathered here. Lane l owns the channel pairs 2l + 64i.
__device__ __forceinline__ void norm_rope_row_warp(const NormRopeRow& p, const float* x, int64_t pos, float* row_s,
                                                   float* out) {
  const int lane = int(threadIdx.x % 32);
  for (int64_t c = lane; c < p.dim; c += 32) row_s[c] = x[c];
  __syncwarp();
  const int64_t body = p.dim / kNormLanes * kNormLanes;
  const bool bf16_math = p.bf16 && !p.gamma;
  float inv;
  if (bf16_math) {
    inv = row_inv_rms_bf16_warp(p, row_s);
  } else {
    float acc = 0.0f;
    if (lane < kNormLanes) {
#pragma unroll 8
      for (int64_t i = lane; i < body; i += kNormLanes) acc = __fadd_rn(acc, row_square(row_s[i], false));
    }
    float a[kNormLanes];
#pragma unroll
    for (int l = 0; l < kNormLanes; ++l) a[l] = __shfl_sync(0xFFFFFFFFu, acc, l);
    inv = row_inv_rms(p, a, row_s, body);
  }
  for (int64_t c = 2 * lane; c < p.dim; c += 64)
    finish_row_pair(p, inv, bf16_math, c, row_pair_consts(p, c, pos), row_s, out);
}

// Fast numerics' query heads as bf16 rows (Bf16Rows), normed (gain-less: bf16 arithmetic) and rotated in place by
// one warp a row, in registers: rows [first, end) of a sequence's [n·heads, dim] rows, row i at position
// pos0 + i / heads. Lane l holds the row's channel pairs l, l + 32, ... as bf16x2 words (one warp load reads 128
// contiguous bytes); the sum of squares in row_inv_rms_bf16_warp's order and every rounding as norm_rope_row's,
// so the same bits. The rotation's (cos, sin) are computed once a position, not once a row, for the last
// kRopeWords words (the rope channels [offset, dim) lie in them: checked by the launcher). The next
// row's words are loaded before this row's are stored. dim a multiple of 64, at most 64·kWarpRowWords.
constexpr int kWarpRowWords = 8;
constexpr int kRopeWords = 2;
__device__ __forceinline__ void query_rows_bf16_warp(const NormRopeRow& p, uint32_t* q, int64_t first, int64_t end,
                                                     int64_t heads, int64_t pos0) {
  const int lane = int(threadIdx.x % 32), words = int(p.dim / 64), rope0 = int(p.offset / 64);
  const auto lo = [](uint32_t w) { return __uint_as_float(w << 16); };
  const auto hi = [](uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); };
  uint32_t next[kWarpRowWords];
  const auto load = [&](int64_t i) {
    const uint32_t* row = q + i * words * 32;
#pragma unroll
    for (int j = 0; j < kWarpRowWords; ++j)
      if (j < words) next[j] = row[lane + 32 * j];
  };
  if (first < end) load(first);
  float2 cs[kRopeWords];
  int64_t t = first / heads, h = first % heads;  // row i's position pos0 + t and head h, kept without dividing
  bool fresh = true;                               // cs is not yet t's
  for (int64_t i = first; i < end; ++i) {
    uint32_t w[kWarpRowWords];
#pragma unroll
    for (int j = 0; j < kWarpRowWords; ++j) w[j] = next[j];
    if (i + 1 < end) load(i + 1);
    if (fresh) {
#pragma unroll
      for (int r = 0; r < kRopeWords; ++r) {
        const int64_t c = 2 * (lane + 32 * (rope0 + r));
        cs[r] = rope0 + r < words && c >= p.offset
                    ? rope_cos_sin(pos0 + t, p.inv_freq[(c - p.offset) / 2], /*inverse=*/false)
                    : make_float2(1.0f, 0.0f);
      }
      fresh = false;
    }
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kWarpRowWords; ++j)
      if (j < words) {
        acc = __fadd_rn(acc, round_bf16(__fmul_rn(lo(w[j]), lo(w[j]))));
        acc = __fadd_rn(acc, round_bf16(__fmul_rn(hi(w[j]), hi(w[j]))));
      }
#pragma unroll
    for (int d = 16; d >= 1; d /= 2) acc = __fadd_rn(acc, __shfl_xor_sync(0xFFFFFFFFu, acc, d));
    const float inv = inv_rms_of(p, acc, true);
    uint32_t* row = q + i * words * 32;
#pragma unroll
    for (int j = 0; j < kWarpRowWords; ++j)
      if (j < words) {
        float a = round_bf16(__fmul_rn(lo(w[j]), inv)), b = round_bf16(__fmul_rn(hi(w[j]), inv));
#pragma unroll
        for (int r = 0; r < kRopeWords; ++r)  // cs[r] by a constant index: registers, not a stack frame
          if (j == rope0 + r && 2 * (lane + 32 * j) >= p.offset) {
            rotate(a, b, cs[r]);
            a = round_bf16(a);
            b = round_bf16(b);
          }
        const __nv_bfloat162 out = __floats2bfloat162_rn(a, b);
        row[lane + 32 * j] = *reinterpret_cast<const uint32_t*>(&out);
      }
    if (++h == heads) {
      h = 0;
      ++t;
      fresh = true;
    }
  }
}

}  // namespace dsv4::cuda
