// gemm family: y = x · Wᵀ with fp32 activations and W in its checkpoint format (common/device_weight.h).
// Three paths behind CudaOps::linear / linear_grouped (gemm/linear.cu chooses):
//   gemv              decode shapes (n ≤ kGemvMaxRows): memory-bound, every weight byte read once;
//   gemm_tensor_core  prefill shapes on sm_90a (wgmma + TMA); declines (returns false) what it does not cover;
//   gemm_generic      any shape and format on sm_80+: the fallback.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/device_weight.h"

namespace dsv4 {
class CudaOps;
}

namespace dsv4::cuda {

// y[r, c] (at y + r·ldy + c) = Σ_k x[r, g·in_g + k] (at x + r·ldx) · W[c, k], for r < n, c < w.rows,
// g = c / (w.rows / groups), in_g = w.cols. groups = 1 is a plain linear layer (then in_g = all of x's row).
struct GemmParams {
  const float* x = nullptr;
  int64_t ldx = 0;
  DeviceWeight w;
  int64_t n = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t groups = 1;
  // Fast numerics (docs/design/fast-numerics.md §1.4, §1.5), off for exact and reference:
  //   quant_x   the product reads x act_quant'ed: per row and 128 columns of the group, e4m3 with the scale
  //             2^ceil_log2(max(amax, 1e-4) / 448) (fp8_round_trip in src/cpu/quant.cpp); x is bf16-valued;
  //   bf16_out  y is rounded to bf16 (nearest even) as it is written.
  //   x_bf16    x is bf16-valued (fast numerics hand every op bf16 values): with BF16 weights each product is
  //             exact in fp32, so the bf16 tensor cores compute an fp32 projection up to summation order.
  bool quant_x = false;
  bool bf16_out = false;
  bool x_bf16 = false;
  // With quant_x, x's rows act_quant'ed already (model/ops.h's E4m3Rows: by their producer, or by
  // tc_round_activations): codes [n, w.cols] e4m3, scales [w.cols / 128, x_scale_ld]. The GEMV and the tensor-core
  // GEMM read them instead of quantising x (the same values); other paths read x. groups = 1.
  const uint8_t* x_codes = nullptr;
  const float* x_scales = nullptr;
  int64_t x_scale_ld = 0;
  // With bf16_out, y as bf16 rows here instead (y null; model/ops.h's Bf16Rows): the tensor-core GEMM's epilogue
  // writes them. CudaOps::linear sends only calls that take that path.
  uint16_t* y_bf16 = nullptr;
};

constexpr int64_t kGemvMaxRows = 16;

// Device scratch for the GEMV's split-K reduction (matrices with too few rows to fill the GPU): partial sums,
// and one arrival counter per row tile that must be zero before the first call (calls leave it zero).
struct GemvScratch {
  float* partials = nullptr;
  size_t partial_floats = 0;
  int32_t* arrivals = nullptr;
  size_t arrival_count = 0;
};
struct GemvScratchSize {
  size_t partial_floats = 0, arrival_count = 0;
};
GemvScratchSize gemv_scratch_size(const GemmParams& p);  // what gemv(p, ...) needs; zero when it splits nothing
void gemv(const GemmParams& p, const GemvScratch& scratch, cudaStream_t stream);
// gemv() runs this call on the tensor cores (gemv_mma.cu, fast numerics at 5 ≤ n ≤ 16: FP8 weights with quant_x
// and bf16_out; BF16 weights, or FP8 ones without quant_x (wo_a), with bf16-valued x).
bool gemv_mma_covers(const GemmParams& p);
// An FP8 GEMV of gemv_mma's whose x is worth quantising once when its producer did not (K ≥ kGemvCodesMinCols):
// every block of gemv_mma stages all of x, so at wo_b's K = 8192 its 256 blocks read 64 MB of fp32 x from L2 for
// 33.5 MB of weights. The caller then sets GemmParams::x_codes from tc_round_activations and calls gemv().
constexpr int64_t kGemvCodesMinCols = 8192;
bool gemv_codes_covers(const GemmParams& p);
// Two projections of the same x (one group each, the same weight format and width) as one GEMV launch, where
// the streaming kernel covers both (gemv_pair_covers); the caller runs them one by one otherwise.
bool gemv_pair_covers(const GemmParams& a, const GemmParams& b);
GemvScratchSize gemv_pair_scratch_size(const GemmParams& a, const GemmParams& b);
void gemv_pair(const GemmParams& a, const GemmParams& b, const GemvScratch& scratch, cudaStream_t stream);
bool gemm_tensor_core(const GemmParams& p, CudaOps& ops);
void gemm_generic(const GemmParams& p, cudaStream_t stream);

}  // namespace dsv4::cuda
