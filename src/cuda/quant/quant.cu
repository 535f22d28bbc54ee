// quant family (CUDA): the quantise-dequantise simulation points of the official numerics, in place, bit-identical
// to src/cpu/quant.cpp.
//
// Both ops work one warp per scale block: the block absmax by warp shuffles, the power-of-two scale from its
// IEEE bits (ceil_log2 as the reference), then round-to-nearest-even onto the FP8 e4m3 / FP4 e2m1 grid
// (common/fp_grid.cuh, shared with the compact caches).
// hadamard_sim_fp4 first applies the Walsh–Hadamard butterflies to the row in shared memory (the CPU's stage
// order, so each element sees the same fp32 additions) and the 1/sqrt(dim) scaling. The per-block steps live in
// sim_row.cuh, which kernels fusing a simulation share.
// Fast numerics (`bf16`): the values are rounded to bf16 first (they are bf16 tensors there), and the Hadamard
// transform's output too (src/cpu/quant.cpp).
#include <cmath>

#include "cuda/common/check.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/fp_grid.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/quant/sim_row.cuh"

namespace dsv4 {

namespace {

using namespace cuda;

constexpr int kWarpsPerBlock = 8;

// ---- sim_fp8

struct SimFp8Params {
  float* x;  // [rows, row_stride], columns [0, cols) simulated in blocks of `block`
  int64_t rows, row_stride, cols, block;
  int64_t blocks_per_row;
  bool bf16;
};

__global__ void __launch_bounds__(kWarpsPerBlock * 32) sim_fp8_kernel(SimFp8Params p) {
  cuda::pdl_wait();
  const int64_t item = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (item >= p.rows * p.blocks_per_row) return;
  const int64_t r = item / p.blocks_per_row, b0 = (item % p.blocks_per_row) * p.block;
  sim_fp8_block(p.x + r * p.row_stride, b0, min(p.cols, b0 + p.block), lane, p.bf16);
}

// ---- hadamard_sim_fp4

struct HadamardFp4Params {
  float* x;  // [rows, dim], dim a power of two and a multiple of 32
  int64_t rows;
  int dim;
  float norm;  // 1 / sqrt(dim) rounded to fp32, computed on the host as the CPU does
  bool bf16;
};

__global__ void __launch_bounds__(kWarpsPerBlock * 32) hadamard_sim_fp4_kernel(HadamardFp4Params p) {
  cuda::pdl_wait();
  extern __shared__ float rows_smem[];  // [kWarpsPerBlock, dim]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (r >= p.rows) return;  // warp-uniform; no block-wide barrier below
  float* v = rows_smem + int64_t(warp) * p.dim;
  float* xr = p.x + r * p.dim;
  for (int i = lane; i < p.dim; i += 32) v[i] = round_bf16_if(p.bf16, xr[i]);
  __syncwarp();
  for (int h = 1; h < p.dim; h *= 2) {
    hadamard_stage(v, p.dim, h, lane, 32);
    __syncwarp();
  }
  for (int b0 = 0; b0 < p.dim; b0 += 32) fp4_block_round_trip(v, xr, b0, lane, p.norm, p.bf16);
}

}  // namespace

void CudaOps::sim_fp8(float* x, int64_t rows, int64_t row_stride, int64_t cols, int64_t block) {
  DSV4_CHECK(rows >= 0 && cols >= 0 && block >= 1 && row_stride >= cols, "sim_fp8: bad arguments rows=", rows,
             " row_stride=", row_stride, " cols=", cols, " block=", block);
  if (rows == 0 || cols == 0) return;
  const SimFp8Params p{x, rows, row_stride, cols, block, cuda::ceil_div(cols, block), fast()};
  const unsigned grid = unsigned(cuda::ceil_div(rows * p.blocks_per_row, kWarpsPerBlock));
  cuda::launch_pdl(sim_fp8_kernel, dim3(grid), dim3(kWarpsPerBlock * 32), 0, stream_, pdl(), p);
}

void CudaOps::hadamard_sim_fp4(float* x, int64_t rows, int64_t dim) {
  constexpr int64_t kMaxDim = 1024;  // kWarpsPerBlock rows of kMaxDim floats: 32 KiB of shared memory
  DSV4_CHECK(dim >= 32 && dim <= kMaxDim && (dim & (dim - 1)) == 0, "hadamard_sim_fp4: dim ", dim,
             " must be a power of two in [32, ", kMaxDim, "]");
  DSV4_CHECK(rows >= 0, "hadamard_sim_fp4: negative row count ", rows);
  if (rows == 0) return;
  const HadamardFp4Params p{x, rows, int(dim), float(1.0 / std::sqrt(double(dim))), fast()};
  const size_t smem = size_t(kWarpsPerBlock) * size_t(dim) * sizeof(float);
  cuda::launch_pdl(hadamard_sim_fp4_kernel, dim3(unsigned(cuda::ceil_div(rows, kWarpsPerBlock))), dim3(kWarpsPerBlock * 32), smem, stream_, pdl(), p);
}

}  // namespace dsv4
