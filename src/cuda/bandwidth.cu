#include "cuda/bandwidth.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/common/check.h"

namespace dsv4 {

double measure_copy_bandwidth(int device) {
  DSV4_CUDA_CHECK(cudaSetDevice(device));
  constexpr size_t kBytes = size_t(2) << 30;
  void* src = nullptr;
  void* dst = nullptr;
  if (cudaMalloc(&src, kBytes) != cudaSuccess || cudaMalloc(&dst, kBytes) != cudaSuccess) {
    const cudaError_t err = cudaGetLastError();  // also clears it: an allocation failure is not sticky
    if (src) cudaFree(src);
    fail(cat("copy bandwidth: cannot allocate 2 × 2 GiB on GPU ", device, " (", cudaGetErrorString(err), ")"));
  }
  cudaEvent_t start, stop;
  DSV4_CUDA_CHECK(cudaEventCreate(&start));
  DSV4_CUDA_CHECK(cudaEventCreate(&stop));
  // Pages are touched by the memset and the warm-up copy, so the timed copies see resident memory.
  DSV4_CUDA_CHECK(cudaMemset(src, 0x3C, kBytes));
  DSV4_CUDA_CHECK(cudaMemcpy(dst, src, kBytes, cudaMemcpyDeviceToDevice));
  float best_ms = 1e30f;
  for (int rep = 0; rep < 5; ++rep) {
    DSV4_CUDA_CHECK(cudaEventRecord(start));
    DSV4_CUDA_CHECK(cudaMemcpyAsync(dst, src, kBytes, cudaMemcpyDeviceToDevice));
    DSV4_CUDA_CHECK(cudaEventRecord(stop));
    DSV4_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    DSV4_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    best_ms = std::min(best_ms, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(src);
  cudaFree(dst);
  return 2.0 * double(kBytes) / (double(best_ms) * 1e-3);
}

bool device_memory_used(size_t* used, size_t* total, int device) {
  if (cudaSetDevice(device) != cudaSuccess) return false;
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return false;
  *used = total_bytes - free_bytes;
  *total = total_bytes;
  return true;
}

}  // namespace dsv4
