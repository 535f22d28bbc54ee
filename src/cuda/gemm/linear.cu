// gemm family (CUDA)
#include "core/error.h"
#include "cuda/cuda_ops.h"

namespace dsv4 {

void CudaOps::linear(const float*, int64_t, const Weight&, int64_t, float*, int64_t) {
  fail("CUDA backend: linear is not implemented yet");
}

void CudaOps::linear_grouped(const float*, const Weight&, int64_t, int64_t, float*) {
  fail("CUDA backend: linear_grouped is not implemented yet");
}

}  // namespace dsv4
