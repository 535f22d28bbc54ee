#include "harness/gpu_skip.h"

#include "cuda/device.h"

namespace dsv4::test {

std::string gpu_unavailable_reason(int count) {
  std::string why;
  if (!cuda_compiled()) return "this build has no CUDA backend";
  const size_t found = cuda_devices(&why).size();
  if (found == 0) return why.empty() ? "no CUDA device" : why;
  if (found < size_t(count)) return "needs " + std::to_string(count) + " GPUs, " + std::to_string(found) + " usable";
  return "";
}

}  // namespace dsv4::test
