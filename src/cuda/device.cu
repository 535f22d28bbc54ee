#include <cuda_runtime.h>

#include "cuda/device.h"

namespace dsv4 {

bool cuda_compiled() { return true; }

std::vector<CudaDevice> cuda_devices(std::string* why) {
  std::vector<CudaDevice> devices;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why) *why = cudaGetErrorString(err);
    return devices;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    devices.push_back({i, prop.name, prop.major, prop.minor, prop.totalGlobalMem, prop.multiProcessorCount});
  }
  if (devices.empty() && why) *why = "no CUDA device";
  return devices;
}

}  // namespace dsv4
