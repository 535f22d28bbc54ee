// gemm family (CUDA): CudaOps::linear, ::linear_pair, ::linear_grouped, ::linear_f32, ::linear_pair_f32 and
// ::lm_head validate the call, choose its numerics and a path (gemm.h).
// Numerics, as DeepSeek's linear() picks them by the weight (docs/design/fast-numerics.md §1.4, §2.5): in fast
// numerics FP8 / FP4 weights multiply act_quant'ed x and BF16 weights bf16 x (already bf16-valued), both writing
// bf16; fp32 weights, the *_f32 calls (the compressor's projections) and the LM head stay fp32 in every numerics.
// Paths: decode shapes (n ≤ kGemvMaxRows) take the memory-bound GEMV; larger n the tensor-core kernel in fast
// numerics where it covers the shape and computes the same function (its FP8 kernel always act_quant's x; its
// BF16 kernel is exact for bf16 x, also for the fp32 projections), else the generic fp32 tiles. wo_a, the one
// FP8 weight DeepSeek multiplies in bf16, gets a BF16 copy for the tensor cores (bf16_copy).
#include <cuda_bf16.h>

#include "cuda/common/dequant.cuh"
#include "cuda/common/check.h"
#include "cuda/common/launch.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/gemm/gemm.h"
#include "cuda/gemm/tc_gemm.h"

namespace dsv4 {

namespace {

// False when there is nothing to compute.
bool check(const cuda::GemmParams& p) {
  DSV4_CHECK(p.n >= 0, "linear: negative row count ", p.n);
  DSV4_CHECK(p.groups >= 1 && p.w.rows % p.groups == 0, "linear: ", p.w.rows, " rows do not split into ", p.groups,
             " groups");
  DSV4_CHECK(p.ldx >= p.groups * p.w.cols && p.ldy >= p.w.rows, "linear: row strides ", p.ldx, "/", p.ldy,
             " too small for [", p.w.rows, ", ", p.w.cols, "] in ", p.groups, " groups");
  DSV4_CHECK(!p.w.mma_tiles && !p.w.mma_bits, "linear: weight [", p.w.rows, ", ", p.w.cols, "] is a MoE expert "
             "matrix stored in the expert kernels' MMA tile order or bit order; it cannot also be used as a linear layer");
  if (p.n == 0 || p.w.rows == 0) return false;
  DSV4_CHECK(p.x && (p.y || p.y_bf16), "linear: null activation or output for [", p.w.rows, ", ", p.w.cols, "]");
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

// Whether the tensor-core kernel computes p's function: it rounds x to the weight's format, FP8 weights act_quant
// and BF16 ones bf16 (y rounded to bf16 or not: bf16_out).
bool tc_function(const cuda::GemmParams& p) {
  return p.w.format == cuda::WFormat::kFP8    ? p.quant_x
         : p.w.format == cuda::WFormat::kBF16 ? !p.quant_x && (p.bf16_out || p.x_bf16)
                                              : false;
}

void dispatch(cuda::GemmParams p, CudaOps& ops) {
  if (!check(p)) return;
  if (p.n <= cuda::kGemvMaxRows) {
    if (!p.x_codes && cuda::gemv_codes_covers(p) && cuda::tc_covers(p, ops)) {  // x act_quant'ed once, not by every block
      const cuda::TcActivations a = cuda::tc_round_activations(p, ops);
      p.x_codes = static_cast<const uint8_t*>(a.data);
      p.x_scales = a.scale;
      p.x_scale_ld = a.scale_ld;
    }
    cuda::gemv(p, gemv_scratch(cuda::gemv_scratch_size(p), ops), ops.stream());
    return;
  }
  const bool tc = tc_function(p);
  if (tc && p.x_codes && cuda::tc_covers(p, ops)) {  // x act_quant'ed by its producer
    cuda::tc_gemm(p, {p.x_codes, p.x_scales, p.x_scale_ld}, ops);
    return;
  }
  if (!tc || !cuda::gemm_tensor_core(p, ops)) cuda::gemm_generic(p, ops.stream());
}

void dispatch_pair(const cuda::GemmParams& a, const cuda::GemmParams& b, CudaOps& ops) {
  if (check(a) && check(b) && cuda::gemv_pair_covers(a, b)) {  // else each alone (check again: cheap)
    cuda::gemv_pair(a, b, gemv_scratch(cuda::gemv_pair_scratch_size(a, b), ops), ops.stream());
    return;
  }
  dispatch(a, ops);
  dispatch(b, ops);
}

// out[i] = the bf16 value of bits[i], for i < count. Launched under programmatic dependent launch: at decode it
// sits between the attention and wo_a's GEMV, whose weight loads start before it ends.
struct WidenParams {
  const uint16_t* bits;
  int64_t count;
  float* out;
};
__global__ void widen_bf16_kernel(WidenParams p) {
  cuda::pdl_wait();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < p.count) p.out[i] = __uint_as_float(uint32_t(p.bits[i]) << 16);
}

// bits[i] = the bf16 bits of x[i] (bf16 values: exact), for i < count.
struct NarrowParams {
  const float* x;
  int64_t count;
  uint16_t* bits;
};
__global__ void narrow_bf16_kernel(NarrowParams p) {
  cuda::pdl_wait();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < p.count) p.bits[i] = __bfloat16_as_ushort(__float2bfloat16_rn(p.x[i]));
}

// W [rows, cols] in BF16, from any format (one thread per element; once per weight).
__global__ void to_bf16_kernel(cuda::DeviceWeight w, __nv_bfloat16* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < w.rows * w.cols) out[i] = __float2bfloat16_rn(cuda::weight_at(w, i / w.cols, i % w.cols));
}

// y = x · Wᵀ as the model's numerics compute this projection. The grouped product (wo_a) is a bf16 einsum in
// DeepSeek's code, the FP8 weight dequantised to bf16 (exact): no act_quant — also where a rank holds one group
// (groups == 1 at G / tp = 1), which is why it is said by `grouped`, not read off `groups`. xq: x's rows
// act_quant'ed by their producer, read where the product act_quants x.
cuda::GemmParams params(const CudaOps& ops, const float* x, int64_t ldx, const Weight& w, int64_t n, float* y,
                        int64_t ldy, int64_t groups, bool grouped, const E4m3Rows* xq = nullptr) {
  cuda::GemmParams p{x, ldx, ops.dev(w), n, y, ldy, groups};
  if (ops.fast() && p.w.format != cuda::WFormat::kF32) {
    p.quant_x = !grouped && (p.w.format == cuda::WFormat::kFP8 || p.w.format == cuda::WFormat::kFP4);
    p.bf16_out = true;
  }
  if (p.quant_x && xq) {
    DSV4_CHECK(xq->cols == w.cols && xq->rows >= n && xq->cols % 128 == 0, "linear: act_quant'ed rows [", xq->rows,
               ", ", xq->cols, "] for ", n, " rows of [", w.rows, ", ", w.cols, "]");
    p.x_codes = xq->codes;
    p.x_scales = xq->scales;
    p.x_scale_ld = xq->scale_ld;
  }
  return p;
}

}  // namespace

void CudaOps::linear(const float* x, int64_t ldx, const Weight& w, int64_t n, float* y, int64_t ldy,
                     const E4m3Rows* xq, Bf16Rows* yb) {
  cuda::GemmParams p = params(*this, x, ldx, w, n, y, ldy, 1, false, xq);
  if (!yb) return dispatch(p, *this);
  DSV4_CHECK(p.bf16_out && !y && ldy == w.rows && yb->data && yb->cols == w.rows && yb->rows >= n, "linear: bf16 rows [",
             yb->rows, ", ", yb->cols, "] for ", n, " rows of [", w.rows, ", ", w.cols,
             "] (fast numerics, bf16-rounding products only)");
  // The tensor-core GEMM (dispatch's choice above kGemvMaxRows rows) writes bf16 as it stores; the other paths
  // write fp32, narrowed after.
  p.y_bf16 = yb->data;
  if (n > cuda::kGemvMaxRows && tc_function(p) && cuda::tc_covers(p, *this)) return dispatch(p, *this);
  p.y_bf16 = nullptr;
  p.y = static_cast<float*>(workspace(cuda::kWsGemmWidened, size_t(n * w.rows) * sizeof(float)));
  dispatch(p, *this);
  if (n > 0)
    cuda::launch_pdl(narrow_bf16_kernel, dim3(unsigned(cuda::ceil_div(n * w.rows, int64_t(256)))), dim3(256), 0,
                     stream_, pdl(), NarrowParams{p.y, n * w.rows, yb->data});
}

void CudaOps::linear_partial(const float* x, int64_t ldx, const Weight& w, int64_t n, float* y, int64_t ldy) {
  cuda::GemmParams p = params(*this, x, ldx, w, n, y, ldy, 1, false);
  p.bf16_out = false;  // the ranks' sum is rounded by hc_post (Ops::linear_partial)
  p.x_bf16 = fast();   // x is bf16-valued there: BF16 weights keep linear's kernels (tc_function, the GEMVs)
  dispatch(p, *this);
}

void CudaOps::linear_f32(const float* x, int64_t ldx, const Weight& w, int64_t n, float* y, int64_t ldy) {
  cuda::GemmParams p{x, ldx, dev(w), n, y, ldy, 1};
  p.x_bf16 = fast();
  dispatch(p, *this);
}

void CudaOps::lm_head(const float* x, const Weight& head, int64_t n, float* logits) {
  linear_f32(x, head.cols, head, n, logits, head.rows);
}

void CudaOps::linear_pair(const float* x, int64_t ldx, int64_t n, const Weight& wa, float* ya, int64_t ldya,
                          const Weight& wb, float* yb, int64_t ldyb, const E4m3Rows* xq) {
  dispatch_pair(params(*this, x, ldx, wa, n, ya, ldya, 1, false, xq),
                params(*this, x, ldx, wb, n, yb, ldyb, 1, false, xq), *this);
}

void CudaOps::linear_pair_f32(const float* x, int64_t ldx, int64_t n, const Weight& wa, float* ya, int64_t ldya,
                              const Weight& wb, float* yb, int64_t ldyb) {
  cuda::GemmParams a{x, ldx, dev(wa), n, ya, ldya, 1}, b{x, ldx, dev(wb), n, yb, ldyb, 1};
  a.x_bf16 = b.x_bf16 = fast();
  dispatch_pair(a, b, *this);
}

void CudaOps::linear_grouped(const float* x, const Weight& w, int64_t groups, int64_t n, float* y,
                             const Bf16Rows* xb) {
  const int64_t K = groups * w.cols;
  DSV4_CHECK(!xb || (fast() && xb->data && xb->cols == K && xb->rows >= n), "linear_grouped: bf16 rows [",
             xb ? xb->rows : 0, ", ", xb ? xb->cols : 0, "] for ", n, " rows of ", K);
  cuda::GemmParams p = params(*this, x, K, w, n, y, w.rows, groups, true);
  if (fast() && n > cuda::kGemvMaxRows && p.w.format == cuda::WFormat::kFP8 && props_.major == 9) p.w = bf16_copy(w);
  if (xb && n > 0) {
    // The tensor-core GEMM (dispatch's choice above kGemvMaxRows rows) reads bf16 x as it is (BF16 weights: wo_a's
    // copy); the other paths read fp32.
    if (n > cuda::kGemvMaxRows && p.w.format == cuda::WFormat::kBF16 && !p.quant_x && cuda::tc_covers(p, *this)) {
      cuda::tc_gemm(p, {xb->data}, *this);
      return;
    }
    auto* wide = static_cast<float*>(workspace(cuda::kWsGemmWidened, size_t(n * K) * sizeof(float)));
    cuda::launch_pdl(widen_bf16_kernel, dim3(unsigned(cuda::ceil_div(n * K, int64_t(256)))), dim3(256), 0, stream_,
                     pdl(), WidenParams{xb->data, n * K, wide});
    p.x = wide;
  }
  dispatch(p, *this);
}

bool CudaOps::bf16_rows_pay(int64_t n) const { return n > cuda::kGemvMaxRows && props_.major == 9; }

const cuda::DeviceWeight& CudaOps::bf16_copy(const Weight& w) {
  const auto it = bf16_copies_.find(w.data);
  if (it != bf16_copies_.end()) return it->second;
  const cuda::DeviceWeight& src = dev(w);
  cuda::DeviceWeight copy;
  copy.format = cuda::WFormat::kBF16;
  copy.rows = src.rows;
  copy.cols = src.cols;
  auto* data = static_cast<__nv_bfloat16*>(device_alloc(size_t(src.rows * src.cols) * 2));
  copy.data = reinterpret_cast<const uint8_t*>(data);
  const int64_t count = src.rows * src.cols;
  to_bf16_kernel<<<unsigned(cuda::ceil_div(count, 256)), 256, 0, stream_>>>(src, data);
  DSV4_LAUNCH_CHECK();
  return bf16_copies_.emplace(w.data, copy).first->second;
}

}  // namespace dsv4
