// gemm family, tensor-core path: its two steps, for the benchmark and for callers that already hold
// activations in the weight's format. gemm_tensor_core(p) = tc_covers(p) ? tc_gemm(p, tc_round_activations(p)).
#pragma once

#include "cuda/gemm/gemm.h"

namespace dsv4::cuda {

// x rounded to the weight's format (what the tensor cores read). Both live in CudaOps workspaces: valid until
// the next tensor-core call.
struct TcActivations {
  const void* data = nullptr;    // [n, groups·K] bf16 (BF16 weights) or e4m3 codes (FP8 weights)
  const float* scale = nullptr;  // FP8 only: [groups·K / 128, scale_ld], powers of two: x ≈ code · scale
  int64_t scale_ld = 0;          // FP8: n rounded up to a multiple of 4 (16-byte rows for the TMA copies)
};

// Whether the tensor-core path takes this call (sm_90a, BF16/FP8 weights, K a multiple of 128, even output
// width and ldy, 16-byte aligned weights, FP8 groups aligned to the 128-row scale blocks).
bool tc_covers(const GemmParams& p, const CudaOps& ops);

// BF16: round to nearest even. FP8: e4m3 per (row, 128-column block) with a power-of-two scale — DeepSeek's
// act_quant, the same function as CpuOps::sim_fp8(x, block 128). Requires tc_covers(p).
TcActivations tc_round_activations(const GemmParams& p, CudaOps& ops);

// y = x · Wᵀ from activations rounded by tc_round_activations (p.x is not read). Requires tc_covers(p).
void tc_gemm(const GemmParams& p, const TcActivations& a, CudaOps& ops);

}  // namespace dsv4::cuda
