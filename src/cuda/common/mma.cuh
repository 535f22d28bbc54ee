// The tensor-core instructions the mma.sync kernels multiply with (sm_80+; no-ops below): the decode GEMV
// (gemm/gemv_mma.cu), the grouped MoE GEMMs (moe/experts_grouped.cu) and the tensor-core attention
// (attention/attention_tc.cu), and ldmatrix to feed them from shared memory.
// Register layout, lane (g, c) = (lane / 4, lane % 4), m16n8k16: a[0] / a[1] rows g / g + 8 at k 2c, 2c + 1,
// a[2] / a[3] the same rows at k 2c + 8, 2c + 9; b0 / b1 column g at the same k slices; d[0..1] row g, columns
// 2c, 2c + 1, d[2..3] row g + 8.
// e4m3 operands multiply as f16 (exact, e4m3x2_to_f16x2): sm_90 has no native mma.sync on e4m3 — the
// m16n8k32.e4m3 form compiles to f16 conversions of both operands, four f16 MMAs and fp32 adds of their results,
// ~5× the instructions (docs/design/moe.md); Hopper's native FP8 path is wgmma (gemm/tc_wgmma.cuh).
#pragma once

#include <cstdint>

namespace dsv4::cuda {

// f16 × f16 into fp32: every product of e4m3-valued (or other ≤ 11-bit-significand) halves exact.
__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// bf16 × bf16 into fp32: every product exact, the sums fp32.
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// ldmatrix: lanes 8j .. 8j + 7 address the 8 rows (16 bytes each) of 8×8 matrix j; register j of lane (g, c)
// receives row g, elements 2c, 2c + 1 of matrix j (.trans: column g, rows 2c, 2c + 1).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  const unsigned a = unsigned(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
  const unsigned a = unsigned(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t& r0, uint32_t& r1, const void* smem_row) {
  const unsigned a = unsigned(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(a));
}

}  // namespace dsv4::cuda
