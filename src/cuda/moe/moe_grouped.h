// moe family (CUDA), host-only: the token count from which CudaOps::moe takes the grouped FP8 GEMM path in fast
// numerics (experts_grouped.cu; the crossover against the item kernels is measured in docs/design/moe.md).
// Tests and benchmarks move it to force either path.
#pragma once

#include <cstdint>

namespace dsv4::cuda::moe {

int64_t grouped_min_tokens();
void set_grouped_min_tokens(int64_t n);  // n ≤ 0: the default again

}  // namespace dsv4::cuda::moe
