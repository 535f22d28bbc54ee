// elementwise family: fill, embed, broadcast_streams, add, scale and ring_store on the GPU against CpuOps.
// Every op here is a copy, one fp32 add, one fp32 multiply or an exact decode (FP8/FP4 values times power-of-
// two or fp32 scales, rounded once), so the GPU must match the CPU bit for bit: tolerance 0 throughout.
// Each case runs on a 16-byte-aligned buffer (the packed path) and, where the op takes a pointer, on a buffer
// shifted by one float (the element-wise path).
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>

#include "core/dtype.h"
#include "cuda/gpu.h"
#if DSV4_HAVE_CUDA
#include "cuda/common/check.h"
#endif

namespace dsv4::test {
namespace {

#if DSV4_HAVE_CUDA
constexpr Tolerance kExact{0.0, 0.0};

// A checkpoint table in host memory, in one of the storage formats the loader produces.
struct HostTable {
  std::vector<uint8_t> data, scale;
  Weight w;
};

HostTable random_table(DType dtype, DType scale_dtype, int64_t rows, int64_t cols, std::mt19937_64& rng) {
  HostTable t;
  t.w.dtype = dtype;
  t.w.rows = rows;
  t.w.cols = cols;
  const auto bytes = [&](size_t n, auto&& make) {
    std::vector<uint8_t> v(n);
    for (auto& b : v) b = make();
    return v;
  };
  switch (dtype) {
    case DType::kF32: {
      const auto f = random_floats(size_t(rows * cols), rng);
      t.data.resize(f.size() * 4);
      std::memcpy(t.data.data(), f.data(), t.data.size());
      t.w.row_stride = cols * 4;
      break;
    }
    case DType::kBF16: {
      t.data.resize(size_t(rows * cols) * 2);
      for (size_t i = 0; i < size_t(rows * cols); ++i) {
        const uint16_t b = f32_to_bf16(std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng));
        std::memcpy(t.data.data() + 2 * i, &b, 2);
      }
      t.w.row_stride = cols * 2;
      break;
    }
    case DType::kF8E4M3: {
      // Every finite e4m3 code (0x7F / 0xFF are NaN), fast: 8 random bytes per draw.
      t.data.resize(size_t(rows * cols));
      for (size_t i = 0; i < t.data.size(); i += 8) {
        uint64_t r = rng();
        for (size_t k = i; k < std::min(i + 8, t.data.size()); ++k, r >>= 8)
          t.data[k] = (r & 0x7F) == 0x7F ? uint8_t(r & 0x80) : uint8_t(r);
      }
      t.w.row_stride = cols;
      t.w.scale_block_rows = t.w.scale_block_cols = 128;
      t.w.scale_stride = (cols + 127) / 128;
      const size_t n_scales = size_t(((rows + 127) / 128) * t.w.scale_stride);
      if (scale_dtype == DType::kF32) {
        const auto s = random_floats(n_scales, rng, 0.01f, 2.0f);
        t.scale.resize(n_scales * 4);
        std::memcpy(t.scale.data(), s.data(), t.scale.size());
      } else {
        t.scale = bytes(n_scales, [&] { return uint8_t(115 + rng() % 20); });
      }
      break;
    }
    default: {  // packed FP4 e2m1 with E8M0 scales per 32 columns
      t.data = bytes(size_t(rows * cols / 2), [&] { return uint8_t(rng()); });
      t.w.row_stride = cols / 2;
      t.w.scale_block_rows = 1;
      t.w.scale_block_cols = 32;
      t.w.scale_stride = cols / 32;
      t.scale = bytes(size_t(rows * cols / 32), [&] { return uint8_t(115 + rng() % 20); });
      break;
    }
  }
  t.w.scale_dtype = scale_dtype;
  t.w.data = t.data.data();
  t.w.scale = t.scale.empty() ? nullptr : t.scale.data();
  return t;
}
#endif

TEST(CudaElementwise, FillWritesEveryElement) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  CudaOps ops(ModelConfig{});
  for (size_t count : {size_t(1), size_t(3), size_t(19), size_t(1001), size_t(64 * 4096 + 3)})
    for (size_t shift : {0, 1}) {
      const float value = random_floats(1, rng)[0];
      float* x = poisoned(ops, count, shift);
      ops.fill(x, count, value);
      EXPECT_TRUE(compare(to_host(ops, x, count), std::vector<float>(count, value), kExact,
                          cat("fill count=", count, " shift=", shift)));
    }
#endif
}

TEST(CudaElementwise, AddAndScaleMatchCpu) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  CudaOps ops(ModelConfig{});
  CpuOps cpu(ModelConfig{});
  for (size_t count : {size_t(1), size_t(7), size_t(989), size_t(4096), size_t(19 * 4096 + 5)})
    for (size_t shift : {0, 1}) {
      const auto a = random_floats(count, rng), b = random_floats(count, rng, -100.0f, 100.0f);
      const float factor = random_floats(1, rng, -3.0f, 3.0f)[0];
      std::vector<float> want(count), want_scaled = a;
      cpu.add(a.data(), b.data(), count, want.data());
      cpu.scale(want_scaled.data(), count, factor);
      const std::string what = cat("count=", count, " shift=", shift);

      float* da = to_device(ops, a, shift);
      float* db = to_device(ops, b, shift);
      float* out = poisoned(ops, count, shift);
      ops.add(da, db, count, out);
      EXPECT_TRUE(compare(to_host(ops, out, count), want, kExact, "add " + what));
      ops.add(da, db, count, da);  // in place, as the forward pass accumulates
      EXPECT_TRUE(compare(to_host(ops, da, count), want, kExact, "add in place " + what));

      float* x = to_device(ops, a, shift);
      ops.scale(x, count, factor);
      EXPECT_TRUE(compare(to_host(ops, x, count), want_scaled, kExact, "scale " + what));
    }
#endif
}

TEST(CudaElementwise, BroadcastStreamsMatchesCpu) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  CudaOps ops(ModelConfig{});
  CpuOps cpu(ModelConfig{});
  struct Case { int64_t n, hc, dim; size_t shift; };
  for (const Case& c : {Case{1, 4, 4096, 0}, Case{19, 4, 4096, 0}, Case{3, 4, 4096, 1}, Case{5, 1, 7, 0},
                        Case{2, 3, 129, 1}}) {
    const auto x = random_floats(size_t(c.n * c.dim), rng);
    std::vector<float> want(size_t(c.n * c.hc * c.dim));
    cpu.broadcast_streams(x.data(), c.n, c.hc, c.dim, want.data());
    float* X = poisoned(ops, want.size(), c.shift);
    ops.broadcast_streams(to_device(ops, x, c.shift), c.n, c.hc, c.dim, X);
    EXPECT_TRUE(compare(to_host(ops, X, want.size()), want, kExact,
                        cat("broadcast n=", c.n, " hc=", c.hc, " dim=", c.dim, " shift=", c.shift)));
  }
#endif
}

TEST(CudaElementwise, RingStoreMatchesCpu) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  CudaOps ops(ModelConfig{});
  CpuOps cpu(ModelConfig{});
  // The ring starts all NaN on both sides: slots the call does not write must stay NaN.
  struct Case { int64_t n, cols, pos0, slots; size_t shift; };
  for (const Case& c : {Case{1, 512, 4095, 128, 0},    // decode at V4 sizes (window 128, head_dim 512)
                        Case{19, 512, 120, 128, 0},    // wraps around the end of the ring
                        Case{300, 512, 77, 128, 0},    // more rows than slots: only the last 128 survive
                        Case{13, 13, 5, 7, 1},         // odd sizes, unaligned
                        Case{2, 4, 0, 1, 0}}) {
    const auto x = random_floats(size_t(c.n * c.cols), rng);
    std::vector<float> want(size_t(c.slots * c.cols), std::numeric_limits<float>::quiet_NaN());
    cpu.ring_store(x.data(), c.n, c.cols, c.pos0, c.slots, want.data());
    float* ring = poisoned(ops, want.size(), c.shift);
    ops.ring_store(to_device(ops, x, c.shift), c.n, c.cols, c.pos0, c.slots, ring);
    EXPECT_TRUE(compare(to_host(ops, ring, want.size()), want, kExact,
                        cat("ring_store n=", c.n, " cols=", c.cols, " pos0=", c.pos0, " slots=", c.slots)));
  }
#endif
}

TEST(CudaElementwise, EmbedDecodesEveryFormatLikeCpu) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  CudaOps ops(ModelConfig{});
  CpuOps cpu(ModelConfig{});
  std::deque<HostTable> tables;  // uploads are keyed by host address: keep every table alive
  struct Case { DType dtype, scale_dtype; int64_t V, D; size_t shift; };
  for (const Case& c : {Case{DType::kF8E4M3, DType::kF8E8M0, 129280, 4096, 0},  // V4-Flash vocabulary × dim
                        Case{DType::kBF16, DType::kF8E8M0, 1000, 4096, 0},
                        Case{DType::kBF16, DType::kF8E8M0, 257, 7, 0},          // odd dim: element-wise path
                        Case{DType::kF32, DType::kF8E8M0, 333, 100, 1},         // unaligned output
                        Case{DType::kF8E4M3, DType::kF32, 300, 260, 0},         // transformers-style F32 scales
                        Case{DType::kI8, DType::kF8E8M0, 300, 256, 0}}) {       // packed FP4
    const HostTable& t = tables.emplace_back(random_table(c.dtype, c.scale_dtype, c.V, c.D, rng));
    ops.upload(t.w);  // a synchronous copy from pageable memory: settle before a kernel reads it
    settle();
    std::vector<int32_t> tokens = {0, int32_t(c.V - 1)};  // both ends of the table, then random ids
    for (int i = 0; i < 17; ++i) tokens.push_back(int32_t(rng() % uint64_t(c.V)));
    const int64_t n = int64_t(tokens.size());
    std::vector<float> want(size_t(n * c.D));
    cpu.embed(t.w, tokens.data(), n, want.data());
    float* out = poisoned(ops, want.size(), c.shift);
    ops.embed(t.w, to_device(ops, tokens), n, out);
    EXPECT_TRUE(compare(to_host(ops, out, want.size()), want, kExact,
                        cat("embed ", dtype_name(c.dtype), " scales ", dtype_name(c.scale_dtype), " V=", c.V,
                            " D=", c.D, " shift=", c.shift)));
  }
#endif
}

TEST(CudaElementwise, EmbedOutOfRangeTokenGivesNanRow) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  CudaOps ops(ModelConfig{});
  const HostTable t = random_table(DType::kBF16, DType::kF8E8M0, 10, 64, rng);
  ops.upload(t.w);
  settle();
  float* out = poisoned(ops, 3 * 64, 0);
  ops.embed(t.w, to_device(ops, std::vector<int32_t>{3, 10, -1}), 3, out);
  const auto got = to_host(ops, out, 3 * 64);
  for (int64_t c = 0; c < 64; ++c) {
    EXPECT_FALSE(std::isnan(got[size_t(c)])) << c;
    EXPECT_TRUE(std::isnan(got[size_t(64 + c)])) << c;
    EXPECT_TRUE(std::isnan(got[size_t(128 + c)])) << c;
  }
#endif
}

}  // namespace
}  // namespace dsv4::test
