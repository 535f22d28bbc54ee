// Weight upload: checkpoint precision is kept byte for byte, scales land in the device formats.
#include <cuda_runtime.h>

#include <cstring>

#include "core/dtype.h"
#include "cuda/gpu.h"

namespace dsv4::test {
namespace {

#if DSV4_HAVE_CUDA
template <class T>
std::vector<T> fetch(const T* device, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}
#endif

TEST(CudaUpload, Fp8RowsAndScalesSurviveUpload) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  const int64_t rows = 200, cols = 300, stride = 320;  // odd sizes, padded source rows
  std::vector<uint8_t> data(size_t(rows * stride));
  for (auto& b : data) b = uint8_t(rng() % 0x7E);  // finite e4m3 codes
  const int64_t sr = 2, sc = 3;
  std::vector<uint8_t> scales(size_t(sr * sc));
  for (auto& s : scales) s = uint8_t(120 + rng() % 10);
  Weight w;
  w.dtype = DType::kF8E4M3;
  w.rows = rows;
  w.cols = cols;
  w.data = data.data();
  w.row_stride = stride;
  w.scale = scales.data();
  w.scale_dtype = DType::kF8E8M0;
  w.scale_block_rows = w.scale_block_cols = 128;
  w.scale_stride = sc;
  ModelConfig config;
  CudaOps ops(config);
  const cuda::DeviceWeight& d = ops.upload(w);
  ASSERT_EQ(d.format, cuda::WFormat::kFP8);
  const auto bytes = fetch(d.data, size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    ASSERT_EQ(std::memcmp(bytes.data() + r * cols, data.data() + r * stride, size_t(cols)), 0) << "row " << r;
  const auto s = fetch(d.scale_f32, size_t(sr * sc));
  for (size_t i = 0; i < s.size(); ++i) EXPECT_EQ(s[i], e8m0_to_f32(scales[i])) << i;
#endif
}

}  // namespace
}  // namespace dsv4::test
