// gemm family (CUDA): CudaOps::linear and ::linear_grouped.
// Baseline: one thread per output element through weight_at(); correct for every format, slow. The decode
// GEMV, the generic tiled fallback and the tensor-core path replace it (gemm.h).
#include "cuda/common/check.h"
#include "cuda/common/dequant.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/gemm/gemm.h"

namespace dsv4 {

namespace {

__global__ void linear_naive_kernel(cuda::GemmParams p) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, r = blockIdx.y;
  if (c >= p.w.rows) return;
  const int64_t g = c / (p.w.rows / p.groups);
  const float* x = p.x + r * p.ldx + g * p.w.cols;
  float acc = 0.0f;
  for (int64_t k = 0; k < p.w.cols; ++k) acc += x[k] * cuda::weight_at(p.w, c, k);
  p.y[r * p.ldy + c] = acc;
}

void launch_linear(const cuda::GemmParams& p, cudaStream_t stream) {
  DSV4_CHECK(p.groups >= 1 && p.w.rows % p.groups == 0, "linear: ", p.w.rows, " rows do not split into ", p.groups,
             " groups");
  DSV4_CHECK(p.ldx >= p.groups * p.w.cols && p.ldy >= p.w.rows, "linear: row strides ", p.ldx, "/", p.ldy,
             " too small for [", p.w.rows, ", ", p.w.cols, "]");
  if (p.n == 0) return;
  const dim3 grid(unsigned(cuda::ceil_div(p.w.rows, 128)), unsigned(p.n));
  linear_naive_kernel<<<grid, 128, 0, stream>>>(p);
  DSV4_LAUNCH_CHECK();
}

}  // namespace

void CudaOps::linear(const float* x, int64_t ldx, const Weight& w, int64_t n, float* y, int64_t ldy) {
  launch_linear({x, ldx, dev(w), n, y, ldy, 1}, stream_);
}

void CudaOps::linear_grouped(const float* x, const Weight& w, int64_t groups, int64_t n, float* y) {
  launch_linear({x, groups * w.cols, dev(w), n, y, w.rows, groups}, stream_);
}

}  // namespace dsv4
