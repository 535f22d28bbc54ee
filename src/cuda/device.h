// CUDA device discovery, compiled only in CUDA builds (DSV4_HAVE_CUDA); the CPU-only build reports none.
#pragma once

#include <string>
#include <vector>

namespace dsv4 {

struct CudaDevice {
  int index = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  size_t memory_bytes = 0;
  int multiprocessors = 0;
};

bool cuda_compiled();  // this binary was built with the CUDA backend
// Visible devices; empty (with `why` set) when there is no driver or no GPU.
std::vector<CudaDevice> cuda_devices(std::string* why);

}  // namespace dsv4
