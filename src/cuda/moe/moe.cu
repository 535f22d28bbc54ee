// moe family (CUDA)
#include "core/error.h"
#include "cuda/cuda_ops.h"

namespace dsv4 {

void CudaOps::moe(const MoeWeights&, const float*, const int32_t*, int64_t, float*) {
  fail("CUDA backend: moe is not implemented yet");
}

}  // namespace dsv4
