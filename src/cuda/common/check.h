// Every CUDA runtime call and every launch is checked; a failure becomes a dsv4::Error naming the call.
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

#define DSV4_CUDA_CHECK(call)                                                                           \
  do {                                                                                                  \
    const cudaError_t dsv4_err_ = (call);                                                               \
    if (dsv4_err_ != cudaSuccess)                                                                       \
      ::dsv4::fail(::dsv4::cat("CUDA error: ", #call, " returned ", cudaGetErrorName(dsv4_err_), " (",  \
                               cudaGetErrorString(dsv4_err_), ") at ", __FILE__, ":", __LINE__));      \
  } while (0)

// After every <<<...>>>: catches bad launch configurations at once (asynchronous faults surface at the next
// synchronising call, which is checked too).
#define DSV4_LAUNCH_CHECK() DSV4_CUDA_CHECK(cudaGetLastError())

namespace dsv4::cuda {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace dsv4::cuda
