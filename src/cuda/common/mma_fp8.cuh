// The FP8 tensor-core instruction the decode GEMV (gemm/gemv_mma.cu) and the grouped MoE GEMMs
// (moe/experts_grouped.cu) multiply with: mma.sync m16n8k32, e4m3 × e4m3 into fp32 (sm_89+; a no-op below).
// Register layout, lane (g, c) = (lane / 4, lane % 4): a[0] / a[1] rows g / g + 8 at k 4c .. 4c + 3, a[2] / a[3]
// the same rows at k 16 + 4c .. ; b0 / b1 column g at k 4c .. and 16 + 4c ..; d[0..1] row g, columns 2c, 2c + 1,
// d[2..3] row g + 8.
#pragma once

#include <cstdint>

namespace dsv4::cuda {

__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

}  // namespace dsv4::cuda
