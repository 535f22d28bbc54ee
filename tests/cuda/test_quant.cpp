// quant family: sim_fp8 and hadamard_sim_fp4 on the GPU against CpuOps.
// EXACT equality is expected, bit for bit: the scales are powers of two read from the block absmax's IEEE
// bits, the rounding is round-to-nearest-even onto the e4m3 / e2m1 grids, and the Hadamard butterflies run in
// the CPU's stage order, so every element goes through the same fp32 operations. A one-ulp difference here
// would move a value across a rounding midpoint in the model, so no tolerance is allowed.
#include <cmath>
#include <cstring>

#include "cuda/gpu.h"
#if DSV4_HAVE_CUDA
#include "cuda/common/check.h"
#endif

namespace dsv4::test {
namespace {

// Bitwise equality; on failure names the first differing element, both values and their bits.
::testing::AssertionResult bitwise_equal(const std::vector<float>& got, const std::vector<float>& want,
                                         const std::string& what) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << what << ": size mismatch";
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], 4) != 0 && bad++ == 0) first = i;
  if (bad == 0) return ::testing::AssertionSuccess();
  uint32_t g, w;
  std::memcpy(&g, &got[first], 4);
  std::memcpy(&w, &want[first], 4);
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << got.size()
                                       << " elements differ; first at " << first << ": got " << got[first] << " (0x"
                                       << std::hex << g << "), want " << want[first] << " (0x" << w << ")";
}

// Values spread over many binades (sign, magnitude 10^[−6, 4)): each scale block then holds elements that
// land on every part of the e4m3 grid, subnormals included.
std::vector<float> wide_floats(size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f), exp10(-6.0f, 4.0f);
  std::vector<float> v(n);
  for (float& x : v) x = mant(rng) * std::pow(10.0f, exp10(rng));
  return v;
}

// Rows whose blocks sit exactly on e4m3 rounding midpoints: element 0 of each block is ±448·2^s (so the block
// scale is 2^s), the others are midpoints (grid value + half step)·2^s of random binades, subnormals included.
std::vector<float> e4m3_midpoints(int64_t rows, int64_t cols, int64_t block, std::mt19937_64& rng) {
  std::vector<float> v(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b0 = 0; b0 < cols; b0 += block) {
      const int s = int(rng() % 21) - 10;
      for (int64_t c = b0; c < std::min(cols, b0 + block); ++c) {
        float q;
        if (c == b0) {
          q = 448.0f;
        } else {
          const int e = int(rng() % 15) - 6;            // binades 2^−6 .. 2^8 (the e4m3 normals)
          const int m = int(rng() % (e == 8 ? 6 : 8));  // in 2^8, midpoints up to 432 (416 | 448)
          q = (rng() % 8 == 0) ? std::ldexp(float(m) + 0.5f, -9)                   // subnormal midpoint
                               : std::ldexp(1.0f + (float(m) + 0.5f) / 8.0f, e);   // normal midpoint
        }
        v[size_t(r * cols + c)] = std::ldexp(rng() % 2 ? -q : q, s);
      }
    }
  return v;
}

TEST(CudaQuant, SimFp8IsBitIdenticalToCpu) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  CudaOps ops(ModelConfig{});
  CpuOps cpu(ModelConfig{});
  struct Case { const char* what; int64_t rows, row_stride, cols, block; bool midpoints; };
  for (const Case& c : {Case{"kv decode: 448 no-pe channels of 512, blocks of 64", 1, 512, 448, 64, false},
                        Case{"kv prefill", 67, 512, 448, 64, false},
                        Case{"kv ties", 67, 512, 448, 64, true},
                        Case{"activation rows, blocks of 128", 5, 4096, 4096, 128, false},
                        Case{"odd: partial last block", 19, 100, 97, 64, false},
                        Case{"odd ties, partial last block", 19, 100, 97, 32, true},
                        Case{"block wider than a warp's sweep", 3, 300, 300, 200, false}}) {
    std::vector<float> x = c.midpoints ? e4m3_midpoints(c.rows, c.row_stride, c.block, rng)
                                       : wide_floats(size_t(c.rows * c.row_stride), rng);
    if (!c.midpoints)  // one all-small block per case: the 1e-4 absmax floor decides its scale
      for (int64_t i = 0; i < std::min<int64_t>(c.block, c.cols); ++i) x[size_t(i)] *= 1e-7f;
    std::vector<float> want = x;
    cpu.sim_fp8(want.data(), c.rows, c.row_stride, c.cols, c.block);
    float* dx = to_device(ops, x);
    ops.sim_fp8(dx, c.rows, c.row_stride, c.cols, c.block);
    EXPECT_TRUE(bitwise_equal(to_host(ops, dx, x.size()), want, c.what));
  }
#endif
}

TEST(CudaQuant, HadamardSimFp4IsBitIdenticalToCpu) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  CudaOps ops(ModelConfig{});
  CpuOps cpu(ModelConfig{});
  struct Case { const char* what; int64_t rows, dim; };
  for (const Case& c : {Case{"indexer q decode: 64 heads × 128", 64, 128},
                        Case{"indexer q prefill", 19 * 64, 128},
                        Case{"indexer compressor entry", 1, 128},
                        Case{"dim 32 (one scale block)", 19, 32},
                        Case{"dim 512", 7, 512},
                        Case{"dim 1024", 3, 1024}}) {
    std::vector<float> x = wide_floats(size_t(c.rows * c.dim), rng);
    for (size_t i = 0; i < size_t(c.dim); ++i) x[i] *= 1e-36f;  // a row near the 6·2^−126 absmax floor
    std::vector<float> want = x;
    cpu.hadamard_sim_fp4(want.data(), c.rows, c.dim);
    float* dx = to_device(ops, x);
    ops.hadamard_sim_fp4(dx, c.rows, c.dim);
    EXPECT_TRUE(bitwise_equal(to_host(ops, dx, x.size()), want, c.what));
  }
#endif
}

}  // namespace
}  // namespace dsv4::test
