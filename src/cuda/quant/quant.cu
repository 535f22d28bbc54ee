// quant family (CUDA)
#include "core/error.h"
#include "cuda/cuda_ops.h"

namespace dsv4 {

void CudaOps::sim_fp8(float*, int64_t, int64_t, int64_t, int64_t) {
  fail("CUDA backend: sim_fp8 is not implemented yet");
}

void CudaOps::hadamard_sim_fp4(float*, int64_t, int64_t) {
  fail("CUDA backend: hadamard_sim_fp4 is not implemented yet");
}

}  // namespace dsv4
