// attention family: compressor (CUDA)
#include "core/error.h"
#include "cuda/cuda_ops.h"

namespace dsv4 {

void CudaOps::compressor(const CompressorWeights&, CompressorState&, const float*, int64_t, int64_t, EntrySim) {
  fail("CUDA backend: compressor is not implemented yet");
}

}  // namespace dsv4
