// attention family: attention (CUDA)
#include "core/error.h"
#include "cuda/cuda_ops.h"

namespace dsv4 {

void CudaOps::attention(const AttentionParams&) {
  fail("CUDA backend: attention is not implemented yet");
}

}  // namespace dsv4
