#include "harness/gpu_skip.h"

#include "cuda/device.h"

namespace dsv4::test {

std::string gpu_unavailable_reason() {
  std::string why;
  if (!cuda_compiled()) return "this build has no CUDA backend";
  if (cuda_devices(&why).empty()) return why.empty() ? "no CUDA device" : why;
  return "";
}

}  // namespace dsv4::test
