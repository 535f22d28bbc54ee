// GPU test helpers. Every CUDA test starts with DSV4_REQUIRE_GPU() (harness/gpu_skip.h). Kernels are checked against the CPU
// reference (CpuOps) on fresh random inputs, with outputs poisoned (NaN) before the call so an unwritten
// element cannot pass.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_ops.h"
#include "harness/compare.h"
#include "harness/gpu_skip.h"
#include "model/ops.h"

#if DSV4_HAVE_CUDA
#include "cuda/cuda_ops.h"
#endif

namespace dsv4::test {

// Uniform in [lo, hi), from a seed that is fresh per run unless DSV4_TEST_SEED is set (printed on failure
// through the test's SCOPED_TRACE of seed()).
uint64_t seed();
std::vector<float> random_floats(size_t n, std::mt19937_64& rng, float lo = -1.0f, float hi = 1.0f);

#if DSV4_HAVE_CUDA
// ops.alloc() clears asynchronously on the ops' (non-blocking) stream, while these helpers copy and memset
// through the legacy stream, which is not ordered with it (and a pageable cudaMemcpy may return before its DMA
// lands): every helper settles the device before and after it writes.
void settle();  // cudaDeviceSynchronize, checked
template <class T>
T* settled(T* device) {
  settle();
  return device;
}
// ops.alloc + copy; `shift` floats into the allocation (shift 1 breaks 16-byte alignment).
float* to_device(CudaOps& ops, const std::vector<float>& host, size_t shift = 0);
int32_t* to_device(CudaOps& ops, const std::vector<int32_t>& host);
// Through the ops (download): ordered after every op, a deferred one (CudaOps::hc_post) included.
std::vector<float> to_host(CudaOps& ops, const float* device, size_t n);
std::vector<int32_t> to_host(CudaOps& ops, const int32_t* device, size_t n);
void poison(float* device, size_t n);    // every element NaN
void poison(int32_t* device, size_t n);  // every element 0x7F7F7F7F (not a valid index, not −1)
float* poisoned(CudaOps& ops, size_t count, size_t shift = 0);  // ops.alloc, `shift` in, then poison
// ops.alloc_e4m3 with every code and scale poisoned (codes 0x7F, e4m3's NaN; scales NaN).
E4m3Rows poisoned_e4m3(CudaOps& ops, int64_t rows, int64_t cols);
// The first `rows` rows of a producer's act_quant'ed output q against the CPU's act_quant_rows of the fp32 rows y
// it wrote beside them ([rows, q.cols], host): every code and scale bit for bit.
::testing::AssertionResult e4m3_rows_match(CudaOps& ops, const E4m3Rows& q, const std::vector<float>& y, int64_t rows);
#endif

}  // namespace dsv4::test
