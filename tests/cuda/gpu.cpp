#include "cuda/gpu.h"

#include <cstdlib>
#include <cstring>

#if DSV4_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda/common/check.h"
#endif

namespace dsv4::test {

uint64_t seed() {
  static const uint64_t s = [] {
    if (const char* env = std::getenv("DSV4_TEST_SEED")) return uint64_t(std::strtoull(env, nullptr, 10));
    return uint64_t(std::random_device{}()) << 32 | std::random_device{}();
  }();
  return s;
}

std::vector<float> random_floats(size_t n, std::mt19937_64& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

#if DSV4_HAVE_CUDA
void settle() { DSV4_CUDA_CHECK(cudaDeviceSynchronize()); }

float* to_device(CudaOps& ops, const std::vector<float>& host, size_t shift) {
  float* d = settled(ops.alloc(host.size() + shift) + shift);
  DSV4_CUDA_CHECK(cudaMemcpy(d, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  return settled(d);
}

int32_t* to_device(CudaOps& ops, const std::vector<int32_t>& host) {
  int32_t* d = settled(ops.alloc_i32(host.size()));
  DSV4_CUDA_CHECK(cudaMemcpy(d, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  return settled(d);
}

std::vector<float> to_host(CudaOps& ops, const float* device, size_t n) {
  std::vector<float> h(n);
  settle();
  ops.download(h.data(), device, n);
  return h;
}

std::vector<int32_t> to_host(CudaOps& ops, const int32_t* device, size_t n) {
  std::vector<int32_t> h(n);
  settle();
  ops.download_i32(h.data(), device, n);
  return h;
}

void poison(float* device, size_t n) {
  settle();
  DSV4_CUDA_CHECK(cudaMemset(device, 0xFF, n * sizeof(float)));
  settle();
}

void poison(int32_t* device, size_t n) {
  settle();
  DSV4_CUDA_CHECK(cudaMemset(device, 0x7F, n * sizeof(int32_t)));
  settle();
}

float* poisoned(CudaOps& ops, size_t count, size_t shift) {
  float* p = ops.alloc(count + shift) + shift;
  poison(p, count);
  return p;
}
#endif

}  // namespace dsv4::test
