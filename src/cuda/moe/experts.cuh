// moe family (CUDA): what the two kinds of expert kernels share. launch_expert_up / launch_expert_down
// (experts_items.cu) run the item kernels there, which take any step, or for one token whose matrices all go
// through the tensor cores the decode kernels of experts_decode.cu.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cuda/moe/moe_kernels.h"

namespace dsv4::cuda::moe {

constexpr int kExpertThreads = kExpertWarps * 32;

struct Chunk {
  int pair0, count, expert;  // expert −1 = shared
};

__device__ __forceinline__ Chunk chunk_at(const Plan& plan, int c) {
  return {plan.chunk_pair[c], plan.chunk_count[c], plan.chunk_expert[c]};
}

// The shared expert's chunk c (of ceil(n / kChunk)): known without the plan (pairs P + t, t = token).
__device__ __forceinline__ Chunk shared_chunk(const ExpertParams& p, int c) {
  return {int(p.n * p.k) + c * kChunk, int(std::min<int64_t>(kChunk, p.n - int64_t(c) * kChunk)), -1};
}

__device__ __forceinline__ float swiglu(float g, float u, float limit, float weight) {
  if (limit > 0.0f) {  // the CPU's std::min / std::clamp, NaN handling included
    g = limit < g ? limit : g;
    u = u < -limit ? -limit : (limit < u ? limit : u);
  }
  return g / (1.0f + expf(-g)) * u * weight;
}

// Fast numerics at one expert matrix of format f, as CpuOps::linear computes it (fast-numerics.md §7 step 15):
// F32 weights stay fp32 in and out; BF16 ones take bf16 activations, FP8 and FP4 ones act_quant'ed ones, and
// both give bf16 outputs. Reference and exact numerics: fp32 throughout.
__device__ __forceinline__ StageRounding stage_rounding(bool fast, WFormat f) {
  if (!fast || f == WFormat::kF32) return StageRounding::kNone;
  return f == WFormat::kBF16 ? StageRounding::kBf16 : StageRounding::kActQuant;
}
__device__ __forceinline__ bool bf16_output(bool fast, WFormat f) { return fast && f != WFormat::kF32; }

// A pair's h from its w1 and w3 outputs g and u (fp32 sums over K) and its routing weight. Fast numerics round
// g and u as the GEMM's output (bf16_output), take the SwiGLU and the weight in fp32, and round h to bf16: the
// hidden row enters w2 as bf16 (CpuOps::moe).
__device__ __forceinline__ float hidden(const ExpertParams& p, WFormat f, float g, float u, float weight) {
  const bool bf16 = bf16_output(p.fast, f);
  return round_bf16_if(p.fast, swiglu(round_bf16_if(bf16, g), round_bf16_if(bf16, u), p.swiglu_limit, weight));
}

// Blocks of `kernel` (kExpertThreads threads, `smem` dynamic bytes) that the device holds at once: the size of a
// persistent grid.
int resident_blocks(const void* kernel, size_t smem, int sm_count);

// The decode kernels (experts_decode.cu): whether one fits the step, and its launch. The caller has checked p.
bool expert_up_decode_fits(const ExpertParams& p);
bool expert_down_decode_fits(const ExpertParams& p);
void launch_expert_up_decode(const ExpertParams& p, int sm_count, bool pdl, cudaStream_t stream);
void launch_expert_down_decode(const ExpertParams& p, int sm_count, bool pdl, cudaStream_t stream);

}  // namespace dsv4::cuda::moe
