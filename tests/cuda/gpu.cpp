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

E4m3Rows poisoned_e4m3(CudaOps& ops, int64_t rows, int64_t cols) {
  const E4m3Rows q = ops.alloc_e4m3(rows, cols);
  settle();
  DSV4_CUDA_CHECK(cudaMemset(q.codes, 0x7F, size_t(rows * cols)));
  poison(q.scales, size_t(cols / 128 * q.scale_ld));
  return q;
}

::testing::AssertionResult e4m3_rows_match(CudaOps& ops, const E4m3Rows& q, const std::vector<float>& y, int64_t rows) {
  std::vector<uint8_t> want_codes(size_t(rows * q.cols)), got_codes(want_codes.size());
  std::vector<float> want_scales(size_t(q.cols / 128 * q.scale_ld), 0.0f);
  act_quant_rows(y.data(), rows, q.cols, q.cols, E4m3Rows{want_codes.data(), want_scales.data(), rows, q.cols, q.scale_ld});
  const std::vector<float> got_scales = to_host(ops, q.scales, want_scales.size());
  settle();
  DSV4_CUDA_CHECK(cudaMemcpy(got_codes.data(), q.codes, got_codes.size(), cudaMemcpyDeviceToHost));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < q.cols; ++c) {
      const size_t i = size_t(r * q.cols + c), b = size_t(c / 128 * q.scale_ld + r);
      if (got_codes[i] != want_codes[i])
        return ::testing::AssertionFailure() << "code [" << r << ", " << c << "] " << int(got_codes[i]) << ", want "
                                             << int(want_codes[i]) << " (y " << y[i] << ")";
      if (c % 128 == 0 && !(got_scales[b] == want_scales[b]))
        return ::testing::AssertionFailure() << "scale [" << r << ", block " << c / 128 << "] " << got_scales[b]
                                             << ", want " << want_scales[b];
    }
  return ::testing::AssertionSuccess();
}
#endif

}  // namespace dsv4::test
