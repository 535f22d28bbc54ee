// gemm family (CUDA): CudaOps::linear, ::linear_pair and ::linear_grouped validate the call and choose a path (gemm.h):
// decode shapes (n ≤ kGemvMaxRows) take the memory-bound GEMV; larger n the tensor-core kernel where it
// covers the shape and the numerics allow rounding activations (fast), else the generic fp32 tiles.
#include "cuda/common/check.h"
#include "cuda/cuda_ops.h"
#include "cuda/gemm/gemm.h"

namespace dsv4 {

namespace {

// False when there is nothing to compute.
bool check(const cuda::GemmParams& p) {
  DSV4_CHECK(p.n >= 0, "linear: negative row count ", p.n);
  DSV4_CHECK(p.groups >= 1 && p.w.rows % p.groups == 0, "linear: ", p.w.rows, " rows do not split into ", p.groups,
             " groups");
  DSV4_CHECK(p.ldx >= p.groups * p.w.cols && p.ldy >= p.w.rows, "linear: row strides ", p.ldx, "/", p.ldy,
             " too small for [", p.w.rows, ", ", p.w.cols, "] in ", p.groups, " groups");
  DSV4_CHECK(!p.w.mma_tiles, "linear: weight [", p.w.rows, ", ", p.w.cols, "] is a MoE expert matrix stored in the "
             "expert kernels' MMA tile order; it cannot also be used as a linear layer");
  if (p.n == 0 || p.w.rows == 0) return false;
  DSV4_CHECK(p.x && p.y, "linear: null activation or output for [", p.w.rows, ", ", p.w.cols, "]");
  DSV4_CHECK(p.w.cols > 0, "linear: weight [", p.w.rows, ", 0] has no input columns");
  return true;
}

cuda::GemvScratch gemv_scratch(const cuda::GemvScratchSize& need, CudaOps& ops) {
  cuda::GemvScratch scratch;
  scratch.partial_floats = need.partial_floats;
  scratch.arrival_count = need.arrival_count;
  if (need.partial_floats > 0) {
    scratch.partials = static_cast<float*>(ops.workspace(cuda::kWsGemvPartials, need.partial_floats * sizeof(float)));
    scratch.arrivals = static_cast<int32_t*>(
        ops.workspace(cuda::kWsGemvArrivals, need.arrival_count * sizeof(int32_t), /*zeroed=*/true));
  }
  return scratch;
}

void dispatch(const cuda::GemmParams& p, CudaOps& ops) {
  if (!check(p)) return;
  if (p.n <= cuda::kGemvMaxRows) {
    cuda::gemv(p, gemv_scratch(cuda::gemv_scratch_size(p), ops), ops.stream());
  } else if (ops.numerics() != Numerics::kFast || !cuda::gemm_tensor_core(p, ops)) {
    cuda::gemm_generic(p, ops.stream());
  }
}

}  // namespace

void CudaOps::linear(const float* x, int64_t ldx, const Weight& w, int64_t n, float* y, int64_t ldy) {
  dispatch({x, ldx, dev(w), n, y, ldy, 1}, *this);
}

void CudaOps::linear_pair(const float* x, int64_t ldx, int64_t n, const Weight& wa, float* ya, int64_t ldya,
                          const Weight& wb, float* yb, int64_t ldyb) {
  const cuda::GemmParams a{x, ldx, dev(wa), n, ya, ldya, 1}, b{x, ldx, dev(wb), n, yb, ldyb, 1};
  if (check(a) && check(b) && cuda::gemv_pair_covers(a, b)) {  // else each alone (check again: cheap)
    cuda::gemv_pair(a, b, gemv_scratch(cuda::gemv_pair_scratch_size(a, b), *this), stream_);
    return;
  }
  dispatch(a, *this);
  dispatch(b, *this);
}

void CudaOps::linear_grouped(const float* x, const Weight& w, int64_t groups, int64_t n, float* y) {
  dispatch({x, groups * w.cols, dev(w), n, y, w.rows, groups}, *this);
}

}  // namespace dsv4
