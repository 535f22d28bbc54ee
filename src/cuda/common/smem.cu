#include "cuda/common/smem.h"

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>

#include "cuda/common/check.h"

namespace dsv4::cuda {

void allow_dynamic_smem(const void* kernel, int bytes) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> allowed;  // (kernel, device) → bytes
  int device = 0;
  DSV4_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard lock(mutex);
  int& now = allowed[{kernel, device}];
  if (bytes <= now) return;
  DSV4_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  now = bytes;
}

}  // namespace dsv4::cuda
