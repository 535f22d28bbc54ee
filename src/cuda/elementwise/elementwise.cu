// elementwise family (CUDA)
#include "core/error.h"
#include "cuda/cuda_ops.h"

namespace dsv4 {

void CudaOps::fill(float*, size_t, float) {
  fail("CUDA backend: fill is not implemented yet");
}

void CudaOps::embed(const Weight&, const int32_t*, int64_t, float*) {
  fail("CUDA backend: embed is not implemented yet");
}

void CudaOps::broadcast_streams(const float*, int64_t, int64_t, int64_t, float*) {
  fail("CUDA backend: broadcast_streams is not implemented yet");
}

void CudaOps::add(const float*, const float*, size_t, float*) {
  fail("CUDA backend: add is not implemented yet");
}

void CudaOps::scale(float*, size_t, float) {
  fail("CUDA backend: scale is not implemented yet");
}

void CudaOps::ring_store(const float*, int64_t, int64_t, int64_t, int64_t, float*) {
  fail("CUDA backend: ring_store is not implemented yet");
}

}  // namespace dsv4
