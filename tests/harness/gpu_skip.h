// Skipping GPU tests visibly: without a usable GPU (CI) a GPU test reports itself skipped — ctest lists it
// under "did not run" — never passed.
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace dsv4::test {

// Empty when the CUDA backend is compiled in and `count` GPUs are usable, else why not.
std::string gpu_unavailable_reason(int count = 1);

}  // namespace dsv4::test

#define DSV4_REQUIRE_GPU()                                                          \
  do {                                                                              \
    const std::string dsv4_why_ = ::dsv4::test::gpu_unavailable_reason();           \
    if (!dsv4_why_.empty()) GTEST_SKIP() << "GPU test skipped: " << dsv4_why_;      \
  } while (0)

// For tests of several GPUs (model/parallel.h ranks): skipped, visibly, where fewer are usable.
#define DSV4_REQUIRE_GPUS(count)                                                    \
  do {                                                                              \
    const std::string dsv4_why_ = ::dsv4::test::gpu_unavailable_reason(count);      \
    if (!dsv4_why_.empty()) GTEST_SKIP() << "GPU test skipped: " << dsv4_why_;      \
  } while (0)
