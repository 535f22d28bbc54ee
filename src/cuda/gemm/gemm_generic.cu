// gemm family, the fallback: any n, any weight format, any shape, sm_80+. A plain shared-memory tiled kernel
// with fp32 FMA (no tensor cores), so it computes the reference's function up to summation order.
//
// NOTE: tiles. A block computes 64 activation rows × 64 output rows of one group, stepping K by 32: x and
// the decoded W tile are staged K-major in shared memory (rows padded by 4 floats to spread the transposing
// stores over banks), and each of the 256 threads accumulates a 4 × 4 sub-tile from float4 reads. Fast
// numerics (GemmParams): at each 128-column block the tile rows' act_quant exponents are found first, and x is
// staged act_quant'ed; the output is rounded to bf16 as it is written.
#include <cstdint>

#include "cuda/common/check.h"
#include "cuda/common/dequant.cuh"
#include "cuda/common/fp_grid.cuh"
#include "cuda/gemm/gemm.h"

namespace dsv4::cuda {

namespace {

constexpr int kTileN = 64;  // activation rows per block
constexpr int kTileO = 64;  // output rows per block
constexpr int kTileK = 32;
constexpr int kThreads = 256;
constexpr int kPad = 4;     // keeps float4 alignment of the padded rows
constexpr int kQuantBlock = 128;  // act_quant's columns per scale; a multiple of kTileK

struct GenericParams {
  const float* x = nullptr;  // [n, ldx]; group g reads columns g·in_g ..
  int64_t ldx = 0;
  DeviceWeight w;            // [groups·out_g, in_g]
  int64_t n = 0;
  float* y = nullptr;        // [n, ldy]
  int64_t ldy = 0;
  int64_t out_g = 0;
  int64_t tiles_per_group = 0;  // ceil(out_g / kTileO)
  bool quant_x = false, bf16_out = false;
};

// Grid: (groups · tiles_per_group, ceil(n / kTileN)).
__global__ void __launch_bounds__(kThreads) gemm_generic_kernel(GenericParams p) {
  __shared__ __align__(16) float xs[kTileK][kTileN + kPad];  // xs[k][a] = x[a0 + a, g·in_g + k0 + k]
  __shared__ __align__(16) float ws[kTileK][kTileO + kPad];  // ws[k][o] = W[o0 + o, k0 + k]
  __shared__ int xe[kTileN];  // quant_x: act_quant exponent of row a0 + a in the current 128-column block

  const int64_t g = blockIdx.x / p.tiles_per_group;
  const int64_t o0 = g * p.out_g + (blockIdx.x % p.tiles_per_group) * kTileO;
  const int64_t o_end = (g + 1) * p.out_g;
  const int64_t a0 = int64_t(blockIdx.y) * kTileN;
  const int64_t K = p.w.cols;
  const float* xg = p.x + g * K;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;  // output rows tx·4.., activation rows ty·4..

  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kTileK) {
    if (p.quant_x && k0 % kQuantBlock == 0) {  // 4 threads (consecutive lanes) per row, 32 columns each
      static_assert(kTileN * 4 == kThreads, "one row per 4 threads");
      const int a = threadIdx.x / 4, part = threadIdx.x % 4;
      float amax = 0.0f;
      if (a0 + a < p.n)
        for (int64_t k = k0 + part * 32; k < min(K, k0 + part * 32 + 32); ++k)
          amax = fmaxf(amax, fabsf(xg[(a0 + a) * p.ldx + k]));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
      if (part == 0) xe[a] = e4m3_block_exponent(amax);
      __syncthreads();
    }
    // 32 consecutive threads cover one row's 32 K values: coalesced reads of x and of W's bytes.
#pragma unroll
    for (int j = 0; j < kTileN * kTileK / kThreads; ++j) {
      const int e = threadIdx.x + j * kThreads, a = e / kTileK, k = e % kTileK;
      const bool live = a0 + a < p.n && k0 + k < K;
      const float v = live ? xg[(a0 + a) * p.ldx + k0 + k] : 0.0f;
      xs[k][a] = p.quant_x ? e4m3_round_trip(v, xe[a]) : v;
    }
#pragma unroll
    for (int j = 0; j < kTileO * kTileK / kThreads; ++j) {
      const int e = threadIdx.x + j * kThreads, o = e / kTileK, k = e % kTileK;
      const bool live = o0 + o < o_end && k0 + k < K;
      ws[k][o] = live ? weight_at(p.w, o0 + o, k0 + k) : 0.0f;
    }
    __syncthreads();
#pragma unroll 8
    for (int k = 0; k < kTileK; ++k) {
      const float4 xa = *reinterpret_cast<const float4*>(&xs[k][ty * 4]);
      const float4 wb = *reinterpret_cast<const float4*>(&ws[k][tx * 4]);
      const float xv[4] = {xa.x, xa.y, xa.z, xa.w}, wv[4] = {wb.x, wb.y, wb.z, wb.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[i][c] = fmaf(xv[i], wv[c], acc[i][c]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t a = a0 + ty * 4 + i;
    if (a >= p.n) continue;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int64_t o = o0 + tx * 4 + c;
      if (o < o_end) p.y[a * p.ldy + o] = round_bf16_if(p.bf16_out, acc[i][c]);
    }
  }
}

}  // namespace

void gemm_generic(const GemmParams& gp, cudaStream_t stream) {
  DSV4_CHECK(gp.n >= 0, "gemm_generic: negative row count ", gp.n);
  DSV4_CHECK(gp.groups >= 1 && gp.w.rows % gp.groups == 0, "gemm_generic: ", gp.w.rows,
             " rows do not split into ", gp.groups, " groups");
  DSV4_CHECK(gp.ldx >= gp.groups * gp.w.cols && gp.ldy >= gp.w.rows, "gemm_generic: row strides ", gp.ldx, "/",
             gp.ldy, " too small for [", gp.w.rows, ", ", gp.w.cols, "] in ", gp.groups, " groups");
  if (gp.n == 0 || gp.w.rows == 0) return;
  DSV4_CHECK(gp.x && gp.y && gp.w.data, "gemm_generic: missing operand for [", gp.w.rows, ", ", gp.w.cols, "]");
  GenericParams p;
  p.x = gp.x;
  p.ldx = gp.ldx;
  p.w = gp.w;
  p.n = gp.n;
  p.y = gp.y;
  p.ldy = gp.ldy;
  p.out_g = gp.w.rows / gp.groups;
  p.tiles_per_group = ceil_div(p.out_g, kTileO);
  p.quant_x = gp.quant_x;
  p.bf16_out = gp.bf16_out;
  const int64_t tiles = gp.groups * p.tiles_per_group, row_tiles = ceil_div(gp.n, kTileN);
  DSV4_CHECK(tiles < (int64_t(1) << 31) && row_tiles <= 65535, "gemm_generic: [", gp.n, " x ", gp.w.rows,
             "] exceeds the grid limits");
  gemm_generic_kernel<<<dim3(unsigned(tiles), unsigned(row_tiles)), kThreads, 0, stream>>>(p);
  DSV4_LAUNCH_CHECK();
}

}  // namespace dsv4::cuda
