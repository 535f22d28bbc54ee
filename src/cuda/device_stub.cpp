// CPU-only build: the CUDA backend is not compiled in.
#include "cuda/device.h"

namespace dsv4 {

bool cuda_compiled() { return false; }

std::vector<CudaDevice> cuda_devices(std::string* why) {
  if (why) *why = "dsv4 was built without CUDA (configure with nvcc available, -DDSV4_CUDA=ON)";
  return {};
}

}  // namespace dsv4
