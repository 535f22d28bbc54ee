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

// The compact caches (reference numerics, spec §11): storing a row quantises it exactly as the simulation does, so
// the cache holds the simulated values bit for bit, and storing an already simulated row is lossless.
TEST(CudaQuant, CompactFp8KvCacheHoldsTheSimulation) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  ModelConfig config;
  config.rope_dim = 64;
  CudaOps ops(config);
  CpuOps cpu(config);
  struct Case { const char* what; int64_t rows, dim; bool midpoints; };
  for (const Case& c : {Case{"V4 KV rows: 448 e4m3 + 64 rope", 37, 512, false},
                        Case{"V4 KV rows on rounding midpoints", 37, 512, true},
                        Case{"partial last scale block (nope 36)", 19, 100, false},
                        Case{"partial block on midpoints (nope 132)", 19, 196, true}}) {
    std::vector<float> x = c.midpoints ? e4m3_midpoints(c.rows, c.dim, 64, rng) : wide_floats(size_t(c.rows * c.dim), rng);
    for (int64_t i = 0; i < 64; ++i) x[size_t(c.dim + i)] *= 1e-7f;  // row 1's first block: the 1e-4 floor
    // Row 2's first block peaks just above 448·2^3, so its scale is 2^4 and the peak rounds to 224·2^4: stored
    // again, that block's scale is re-derived one binade lower and every code doubles.
    x[size_t(2 * c.dim)] = 3584.0f * (1.0f + 0x1p-20f);
    for (int64_t i = 1; i < 64; ++i) x[size_t(2 * c.dim + i)] = std::fmod(x[size_t(2 * c.dim + i)], 200.0f);
    std::vector<float> want = x;
    cpu.sim_fp8(want.data(), c.rows, c.dim, c.dim - config.rope_dim, 64);
    float* cache = ops.alloc_cache(CacheFormat::kFp8Kv, c.rows, c.dim);
    std::vector<float> got(x.size());
    ops.write_cache(cache, c.rows, c.dim, x.data());
    ops.read_cache(cache, c.rows, c.dim, got.data());
    EXPECT_TRUE(bitwise_equal(got, want, std::string(c.what) + ": raw rows"));
    ops.write_cache(cache, c.rows, c.dim, want.data());
    ops.read_cache(cache, c.rows, c.dim, got.data());
    EXPECT_TRUE(bitwise_equal(got, want, std::string(c.what) + ": simulated rows"));
  }
#endif
}

TEST(CudaQuant, CompactFp4KeyCacheIsLossless) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  CudaOps ops(ModelConfig{});
  CpuOps cpu(ModelConfig{});
  for (int64_t dim : {32, 64, 128}) {
    const int64_t rows = 29;
    std::vector<float> x = wide_floats(size_t(rows * dim), rng);
    for (int64_t i = 0; i < dim; ++i) x[size_t(i)] *= 1e-36f;  // a row near the 6·2^−126 absmax floor
    cpu.hadamard_sim_fp4(x.data(), rows, dim);
    // Row 1's first block: grid values peaking at 3·2^−3 (half the e2m1 max at scale 2^−3), as the simulation
    // leaves a block whose absmax was just above 6·2^−4: stored, its scale is re-derived one binade lower.
    const float grid[] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f};
    for (int64_t i = 0; i < 32; ++i) x[size_t(dim + i)] = std::ldexp(i % 2 ? -grid[i % 6] : grid[i % 6], -3);
    float* cache = ops.alloc_cache(CacheFormat::kFp4Keys, rows, dim);
    std::vector<float> got(x.size());
    ops.write_cache(cache, rows, dim, x.data());
    ops.read_cache(cache, rows, dim, got.data());
    EXPECT_TRUE(bitwise_equal(got, x, "FP4 keys of dim " + std::to_string(dim)));
  }
#endif
}

TEST(CudaQuant, RingStoreIntoCompactRing) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  ModelConfig config;
  config.rope_dim = 64;
  CudaOps ops(config);
  CpuOps cpu(config);
  const int64_t slots = 13, cols = 196, n = 20, pos0 = 7;  // wraps, and rows 0..6 are overwritten by 13..19
  std::vector<float> rows = wide_floats(size_t(n * cols), rng);
  cpu.sim_fp8(rows.data(), n, cols, cols - config.rope_dim, 64);
  std::vector<float> want(size_t(slots * cols), 0.0f);
  cpu.ring_store(rows.data(), n, cols, pos0, slots, want.data());
  float* ring = ops.alloc_cache(CacheFormat::kFp8Kv, slots, cols);
  ops.ring_store(to_device(ops, rows), n, cols, pos0, slots, ring);
  std::vector<float> got(want.size());
  ops.read_cache(ring, slots, cols, got.data());
  EXPECT_TRUE(bitwise_equal(got, want, "compact ring"));
#endif
}

}  // namespace
}  // namespace dsv4::test
