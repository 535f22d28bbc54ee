// hc family (CUDA)
#include "core/error.h"
#include "cuda/cuda_ops.h"

namespace dsv4 {

void CudaOps::hc_pre(const float*, const HcWeights&, int64_t, float*, float*, float*) {
  fail("CUDA backend: hc_pre is not implemented yet");
}

void CudaOps::hc_post(const float*, const float*, const float*, int64_t, float*) {
  fail("CUDA backend: hc_post is not implemented yet");
}

void CudaOps::hc_head(const float*, const HcHeadWeights&, int64_t, float*) {
  fail("CUDA backend: hc_head is not implemented yet");
}

}  // namespace dsv4
