// gemm family: CudaOps::linear / linear_grouped against CpuOps on fresh random weights in every checkpoint
// format (F32, BF16, FP8 e4m3 with E8M0 or F32 128×128 block scales, FP4 e2m1 with E8M0 per-32 scales).
// Covers the paths behind linear: the decode GEMVs (n ≤ 16: streaming for n ≤ 4 and FP8 / BF16 / F32 rows
// in multiples of 4 and 16 bytes, staged otherwise), the generic tiled kernel (n > 16, and rows that are not
// a multiple of 16 bytes); the tensor-core kernel (fast numerics) has its own test, test_gemm_tc.
//
// Tolerance: both sides compute the same fp32 products (the FP8 weight is e4m3 · scale rounded to fp32 on
// both; FP4 products are exact up to a power-of-two factor), so only the summation order differs. The
// rounding error of a K-term fp32 sum grows like ε·√K·|y|typ (random walk of K roundings of partial sums of
// size ≤ |y|typ), so |got − want| ≤ tol·(|y|typ + |want|) with tol = 1e-6·√K — about 16× that estimate
// (ε = 6e-8), and still 100× below the effect of a single wrong weight in K = 4096. |y|typ is the larger of
// rms(y) and √K·rms(x)·rms(w), the random walk's own size: with few outputs rms(y) alone can be far below the
// partial sums (one output of [1, 64] summed terms of ±1 to 0.24 and failed at 7.6e-6 on an H200, 2026-11-29).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/dtype.h"
#include "cpu/cpu_ops.h"
#include "cuda/gpu.h"

#if DSV4_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda/common/check.h"
#include "cuda/gemm/gemm.h"
#endif

namespace dsv4::test {
namespace {

#if DSV4_HAVE_CUDA

enum class Format { kF32, kBF16, kFP8, kFP8F32Scale, kFP4 };

const char* name(Format f) {
  switch (f) {
    case Format::kF32: return "F32";
    case Format::kBF16: return "BF16";
    case Format::kFP8: return "FP8";
    case Format::kFP8F32Scale: return "FP8/f32-scale";
    default: return "FP4";
  }
}

// A checkpoint matrix in host memory, with its Weight view.
struct HostWeight {
  std::vector<uint8_t> data, scale;
  Weight w;
};

// Random finite values around unit size; quantised formats get random codes and scales.
HostWeight make_weight(Format f, int64_t rows, int64_t cols, std::mt19937_64& rng) {
  HostWeight h;
  Weight& w = h.w;
  w.rows = rows;
  w.cols = cols;
  const auto bits = [&] { return uint64_t(rng()); };
  switch (f) {
    case Format::kF32: {
      w.dtype = DType::kF32;
      h.data.resize(size_t(rows * cols * 4));
      const std::vector<float> v = random_floats(size_t(rows * cols), rng);
      std::memcpy(h.data.data(), v.data(), h.data.size());
      w.row_stride = cols * 4;
      break;
    }
    case Format::kBF16: {
      w.dtype = DType::kBF16;
      h.data.resize(size_t(rows * cols * 2));
      // Sign, exponent 2^−7 .. 2^0, any mantissa: four values per 64 random bits (the LM head is 530M values).
      for (size_t i = 0; i < h.data.size(); i += 8) {
        const uint64_t r = bits();
        for (size_t j = 0; j < 8 && i + j < h.data.size(); j += 2) {
          const uint32_t b = uint32_t(r >> (8 * j)) & 0xFFFFu;
          const uint16_t v = uint16_t((b & 0x807Fu) | ((120u + ((b >> 7) & 7u)) << 7));
          std::memcpy(h.data.data() + i + j, &v, 2);
        }
      }
      w.row_stride = cols * 2;
      break;
    }
    case Format::kFP8:
    case Format::kFP8F32Scale: {
      w.dtype = DType::kF8E4M3;
      h.data.resize(size_t(rows * cols));
      for (size_t i = 0; i < h.data.size(); i += 8) {
        const uint64_t r = bits();
        for (size_t j = 0; j < 8 && i + j < h.data.size(); ++j) {
          uint8_t b = uint8_t(r >> (8 * j));
          if ((b & 0x7F) == 0x7F) b ^= 1;  // 0x7F / 0xFF are NaN
          h.data[i + j] = b;
        }
      }
      w.row_stride = cols;
      w.scale_block_rows = w.scale_block_cols = 128;
      const int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
      w.scale_stride = sc;
      if (f == Format::kFP8) {
        w.scale_dtype = DType::kF8E8M0;
        h.scale.resize(size_t(sr * sc));
        for (auto& s : h.scale) s = uint8_t(120 + bits() % 8);  // 2^−7 .. 2^0
      } else {
        // Not powers of two: the product e4m3 · scale rounds, on both sides alike.
        w.scale_dtype = DType::kF32;
        const std::vector<float> s = random_floats(size_t(sr * sc), rng, 0.001f, 0.1f);
        h.scale.resize(s.size() * 4);
        std::memcpy(h.scale.data(), s.data(), h.scale.size());
      }
      break;
    }
    case Format::kFP4: {
      w.dtype = DType::kI8;
      h.data.resize(size_t(rows * cols / 2));
      for (size_t i = 0; i < h.data.size(); i += 8) {
        const uint64_t r = bits();
        for (size_t j = 0; j < 8 && i + j < h.data.size(); ++j) h.data[i + j] = uint8_t(r >> (8 * j));
      }
      w.row_stride = cols / 2;
      w.scale_dtype = DType::kF8E8M0;
      w.scale_block_rows = 1;
      w.scale_block_cols = 32;
      w.scale_stride = cols / 32;
      h.scale.resize(size_t(rows * cols / 32));
      for (auto& s : h.scale) s = uint8_t(118 + bits() % 10);  // 2^−9 .. 2^0
      break;
    }
  }
  w.data = h.data.data();
  w.scale = h.scale.empty() ? nullptr : h.scale.data();
  return h;
}

struct Case {
  Format format;
  int64_t n, rows, cols;
  int64_t groups = 1;       // > 1: linear_grouped (cols = in_g)
  int64_t ldx_pad = 0, ldy_pad = 0;  // plain linear only: extra row stride, must stay untouched in y
};

std::string describe(const Case& c) {
  return std::string(name(c.format)) + " n=" + std::to_string(c.n) + " [" + std::to_string(c.rows) + ", " +
         std::to_string(c.cols) + "]" + (c.groups > 1 ? " groups=" + std::to_string(c.groups) : "") +
         (c.ldx_pad || c.ldy_pad ? " padded" : "");
}

// Runs one case on both backends; returns the GPU output for determinism checks. A fresh CudaOps per case:
// uploads are keyed by the host address, which a later case's weight may reuse.
std::vector<float> check_case(const Case& c, std::mt19937_64& rng) {
  SCOPED_TRACE(describe(c));
  const ModelConfig config;
  CpuOps cpu(config);
  CudaOps gpu(config);
  const HostWeight hw = make_weight(c.format, c.rows, c.cols, rng);
  const int64_t in_total = c.groups * c.cols;
  const int64_t ldx = in_total + c.ldx_pad, ldy = c.rows + c.ldy_pad;
  const std::vector<float> x = random_floats(size_t(c.n * ldx), rng);

  std::vector<float> want(size_t(c.n * ldy), NAN);
  if (c.groups > 1) cpu.linear_grouped(x.data(), hw.w, c.groups, c.n, want.data());
  else cpu.linear(x.data(), ldx, hw.w, c.n, want.data(), ldy);

  // NOTE: alloc() zero-fills asynchronously on the backend's non-blocking stream, which does not order with
  // the legacy stream of cudaMemcpy / cudaMemset (gpu.h's to_device / poison): fill on the backend stream.
  gpu.upload(hw.w);
  float* dx = gpu.alloc(x.size());
  float* dy = gpu.alloc(size_t(c.n * ldy));
  DSV4_CUDA_CHECK(cudaMemcpyAsync(dx, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice, gpu.stream()));
  DSV4_CUDA_CHECK(cudaMemsetAsync(dy, 0xFF, size_t(c.n * ldy) * sizeof(float), gpu.stream()));  // NaN poison
  if (c.groups > 1) gpu.linear_grouped(dx, hw.w, c.groups, c.n, dy);
  else gpu.linear(dx, ldx, hw.w, c.n, dy, ldy);
  const std::vector<float> got = to_host(gpu, dy, size_t(c.n * ldy));

  std::vector<float> got_rows, want_rows;  // the [n, rows] outputs
  for (int64_t i = 0; i < c.n; ++i)
    for (int64_t r = 0; r < c.rows; ++r) {
      got_rows.push_back(got[size_t(i * ldy + r)]);
      want_rows.push_back(want[size_t(i * ldy + r)]);
    }
  const auto rms_of = [](const std::vector<float>& v) {
    double sq = 0.0;
    for (float e : v) sq += double(e) * e;
    return std::sqrt(sq / double(v.size()));
  };
  std::vector<float> w_values(size_t(c.rows * c.cols));
  for (int64_t r = 0; r < c.rows; ++r) dequant_row(hw.w, r, w_values.data() + r * c.cols);
  const double walk = std::sqrt(double(c.cols)) * rms_of(x) * rms_of(w_values);
  const double tol = 1e-6 * std::sqrt(double(c.cols));
  EXPECT_TRUE(compare(got_rows, want_rows, {tol * std::max(rms_of(want_rows), walk), tol}, describe(c)));
  for (int64_t i = 0; i < c.n; ++i)
    for (int64_t r = c.rows; r < ldy; ++r)
      EXPECT_TRUE(std::isnan(got[size_t(i * ldy + r)])) << "padding y[" << i << ", " << r << "] was written";
  return got;
}

const Format kFormats[] = {Format::kF32, Format::kBF16, Format::kFP8, Format::kFP8F32Scale, Format::kFP4};

#endif  // DSV4_HAVE_CUDA

// Odd shapes through every path: n ≤ 16 is the GEMV (cols that are not a multiple of 16 bytes fall back to
// the generic kernel), n > 16 the tensor-core or generic kernel. FP4 needs cols % 32 == 0.
TEST(CudaGemm, OddShapesEveryFormat) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  const int64_t shapes[][2] = {{1, 64}, {7, 96}, {33, 160}, {129, 320}, {300, 544}, {257, 1056},
                               {19, 111}, {45, 200}, {300, 989}, {2, 4000}};
  for (Format f : kFormats)
    for (int64_t n : {1, 3, 16, 17, 64, 130})
      for (const auto& s : shapes) {
        if (f == Format::kFP4 && s[1] % 32 != 0) continue;
        const bool padded = (s[0] + n) % 2 == 1;
        check_case({f, n, s[0], s[1], 1, padded ? 3 : 0, padded ? 5 : 0}, rng);
      }
#endif
}

// Grouped projections: groups of odd sizes, x read at g·in_g.
TEST(CudaGemm, GroupedOddShapes) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  const int64_t shapes[][3] = {{8, 16, 128}, {3, 7, 96}, {5, 60, 64}, {2, 150, 288}, {4, 33, 1024}};
  for (Format f : kFormats)
    for (int64_t n : {1, 3, 16, 17, 64, 130})
      for (const auto& s : shapes) check_case({f, n, s[0] * s[1], s[2], s[0]}, rng);
#endif
}

// Every n the GEMV takes (kernels for 1, 2, 4 and 8 rows; 9..16 in two launches) on shapes that exercise
// several K stages, wide row groups (WK) and clusters: few rows with a long K, and many rows.
TEST(CudaGemm, GemvEveryRowCount) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  for (Format f : kFormats)
    for (int64_t n = 1; n <= 16; ++n) {
      check_case({f, n, 24, 16384}, rng);
      check_case({f, n, 1000, 2048}, rng);
    }
#endif
}

// The V4-Flash decode shapes (n = 1) and a small batch (n = 5).
TEST(CudaGemm, V4FlashShapes) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  const Case shapes[] = {
      {Format::kFP8, 0, 1024, 4096},          // wq_a
      {Format::kFP8, 0, 32768, 1024},         // wq_b: 64 heads × 512
      {Format::kFP8, 0, 512, 4096},           // wkv
      {Format::kFP8, 0, 8192, 1024},          // indexer wq_b: 64 heads × 128
      {Format::kFP8, 0, 8192, 4096, 8},       // wo_a: 8 groups × 1024, in_g = 8 heads × 512
      {Format::kFP8, 0, 4096, 8192},          // wo_b
      {Format::kBF16, 0, 64, 4096},           // indexer weights_proj
      {Format::kBF16, 0, 256, 4096},          // router
      {Format::kF32, 0, 24, 16384},           // mHC fn: (2 + 4)·4 mixes over 4 streams × 4096
      {Format::kFP4, 0, 2048, 4096},          // routed expert w1 / w3
      {Format::kFP4, 0, 4096, 2048},          // routed expert w2
      {Format::kBF16, 0, 129280, 4096},       // LM head
  };
  for (int64_t n : {1, 5})
    for (Case c : shapes) {
      c.n = n;
      check_case(c, rng);
    }
#endif
}

// linear_pair: both outputs match the CPU's linear, with check_case's tolerance, in padded output rows (the
// padding untouched). Pairs the streaming kernel runs as one launch (V4-Flash wq_a + wkv, a compressor's wkv +
// wgate in BF16, odd row counts, the split-K path) and pairs it does not (n > 4, two formats, two widths).
TEST(CudaGemm, LinearPairMatchesCpu) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  struct Pair {
    Format fa, fb;
    int64_t n, rows_a, rows_b, cols_a, cols_b;
  };
  const Pair pairs[] = {
      {Format::kFP8, Format::kFP8, 1, 1024, 512, 4096, 4096},   {Format::kFP8, Format::kFP8, 4, 1024, 512, 4096, 4096},
      {Format::kBF16, Format::kBF16, 1, 1024, 1024, 4096, 4096}, {Format::kFP8, Format::kFP8, 3, 36, 20, 256, 256},
      {Format::kF32, Format::kF32, 2, 8, 4, 8192, 8192},        {Format::kFP8, Format::kFP8, 5, 1024, 512, 4096, 4096},
      {Format::kFP8, Format::kBF16, 1, 128, 64, 512, 512},      {Format::kBF16, Format::kBF16, 1, 64, 64, 512, 256},
  };
  for (const Pair& c : pairs) {
    const std::string what = std::string(name(c.fa)) + "+" + name(c.fb) + " n=" + std::to_string(c.n) + " [" +
                             std::to_string(c.rows_a) + "+" + std::to_string(c.rows_b) + "]";
    SCOPED_TRACE(what);
    const ModelConfig config;
    CpuOps cpu(config);
    CudaOps gpu(config);
    const HostWeight wa = make_weight(c.fa, c.rows_a, c.cols_a, rng), wb = make_weight(c.fb, c.rows_b, c.cols_b, rng);
    const int64_t ldx = std::max(c.cols_a, c.cols_b), lda = c.rows_a + 3, ldb = c.rows_b + 5;
    const std::vector<float> x = random_floats(size_t(c.n * ldx), rng);
    std::vector<float> want_a(size_t(c.n * lda), NAN), want_b(size_t(c.n * ldb), NAN);
    cpu.linear(x.data(), ldx, wa.w, c.n, want_a.data(), lda);
    cpu.linear(x.data(), ldx, wb.w, c.n, want_b.data(), ldb);
    gpu.upload(wa.w);
    gpu.upload(wb.w);
    settle();
    float* dya = poisoned(gpu, want_a.size());
    float* dyb = poisoned(gpu, want_b.size());
    gpu.linear_pair(to_device(gpu, x), ldx, c.n, wa.w, dya, lda, wb.w, dyb, ldb);
    const auto check_out = [&](const std::vector<float>& got, const std::vector<float>& want, int64_t rows, int64_t ld,
                               int64_t cols, const char* which) {
      std::vector<float> got_rows, want_rows;
      for (int64_t i = 0; i < c.n; ++i)
        for (int64_t r = 0; r < ld; ++r) {
          if (r < rows) {
            got_rows.push_back(got[size_t(i * ld + r)]);
            want_rows.push_back(want[size_t(i * ld + r)]);
          } else {
            EXPECT_TRUE(std::isnan(got[size_t(i * ld + r)])) << which << " padding [" << i << ", " << r << "] written";
          }
        }
      double sq = 0.0;
      for (float v : want_rows) sq += double(v) * v;
      const double rms = std::sqrt(sq / double(want_rows.size())), tol = 1e-6 * std::sqrt(double(cols));
      EXPECT_TRUE(compare(got_rows, want_rows, {tol * rms, tol}, what + " " + which));
    };
    check_out(to_host(gpu, dya, want_a.size()), want_a, c.rows_a, lda, c.cols_a, "ya");
    check_out(to_host(gpu, dyb, want_b.size()), want_b, c.rows_b, ldb, c.cols_b, "yb");
  }
#endif
}

// A rank's share of a row-parallel product (Ops::linear_partial: wo_b when the ranks split the heads) in fast
// numerics: the product without its output rounding. The share rounded to bf16 is linear's output bit for bit on
// every path — FP8: the decode GEMV (1 row), the streaming GEMV (4), the FP8 mma GEMV (9), x act_quant'ed once
// (K 8192), the tensor-core GEMM split over K (40, 300) and not (512 rows of a 4096-row matrix, V4's wo_b
// prefill); BF16: the GEMVs and the tensor-core GEMM — it holds values off the bf16 grid, and the CPU's share
// agrees to the sums' order (LinearPairMatchesCpu's bound; test_gemm_tc's for the tensor cores).
TEST(CudaGemm, FastPartialIsTheProductUnrounded) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  struct Case {
    Format format;
    int64_t rows, cols, n;
  };
  const Case cases[] = {
      {Format::kFP8, 512, 1024, 1},  {Format::kFP8, 512, 1024, 4},    {Format::kFP8, 512, 1024, 9},
      {Format::kFP8, 512, 8192, 1},  {Format::kFP8, 512, 1024, 40},   {Format::kFP8, 512, 1024, 300},
      {Format::kFP8, 4096, 1024, 512}, {Format::kBF16, 512, 1024, 1}, {Format::kBF16, 512, 1024, 9},
      {Format::kBF16, 512, 1024, 40},
  };
  const ModelConfig config;
  CpuOps cpu(config);
  CudaOps gpu(config);
  cpu.set_numerics(Numerics::kFast);
  gpu.set_numerics(Numerics::kFast);
  // Every weight lives to the end: the backend finds an uploaded matrix by its host address, which a freed
  // matrix's successor may reuse.
  std::vector<HostWeight> weights;
  weights.reserve(std::size(cases));
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(name(c.format)) + " [" + std::to_string(c.rows) + ", " + std::to_string(c.cols) +
                 "] n=" + std::to_string(c.n));
    const HostWeight& hw = weights.emplace_back(make_weight(c.format, c.rows, c.cols, rng));
    gpu.upload(hw.w);
    settle();
    std::vector<float> x = random_floats(size_t(c.n * c.cols), rng);
    for (float& v : x) v = round_bf16(v);  // bf16 activations, as fast numerics hands them on
    const size_t count = size_t(c.n * c.rows);
    float* dx = to_device(gpu, x);
    float* dfull = poisoned(gpu, count);
    float* dpart = poisoned(gpu, count);
    gpu.linear(dx, c.cols, hw.w, c.n, dfull, c.rows);
    gpu.linear_partial(dx, c.cols, hw.w, c.n, dpart, c.rows);
    const std::vector<float> full = to_host(gpu, dfull, count), part = to_host(gpu, dpart, count);
    size_t unequal = 0, off_grid = 0;
    for (size_t i = 0; i < count; ++i) {
      const float r = round_bf16(part[i]);
      unequal += std::memcmp(&r, &full[i], sizeof r) != 0;
      off_grid += r != part[i];
    }
    EXPECT_EQ(unequal, 0u) << "the share rounded is not linear's output";
    EXPECT_GT(off_grid, count / 2) << "the share looks rounded";
    std::vector<float> want(count);
    cpu.linear_partial(x.data(), c.cols, hw.w, c.n, want.data(), c.rows);
    double sq = 0.0, err = 0.0;
    for (size_t i = 0; i < count; ++i) {
      sq += double(want[i]) * want[i];
      err += (double(part[i]) - want[i]) * (double(part[i]) - want[i]);
    }
    if (c.n <= cuda::kGemvMaxRows) {  // the GEMVs sum in fp32
      const double rms = std::sqrt(sq / double(count)), tol = 1e-6 * std::sqrt(double(c.cols));
      EXPECT_TRUE(compare(part, want, {tol * rms, tol}, "linear_partial against the CPU's"));
    } else {  // the FP8 tensor cores' ~14-bit accumulator: test_gemm_tc's whole-tensor bound
      EXPECT_LE(std::sqrt(err / sq), 2e-3) << "linear_partial against the CPU's, relative to its norm";
    }
  }
#endif
}

// The decode GEMV's split-K path (few rows, long K) keeps per-tile arrival counters in one CudaOps workspace
// that every call must leave zero: interleaved calls of different shapes on one backend, each repeated,
// must all match the CPU and repeat bit for bit.
TEST(CudaGemm, GemvSplitKCallsShareScratch) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  const ModelConfig config;
  CpuOps cpu(config);
  CudaOps gpu(config);
  const Case cases[] = {{Format::kFP8, 1, 24, 16384}, {Format::kBF16, 2, 512, 4096}, {Format::kFP8, 4, 8, 8192},
                        {Format::kF32, 3, 64, 2048}, {Format::kFP8, 1, 512, 4096, 8}};
  std::vector<HostWeight> weights;  // alive for the whole test: uploads are keyed by host address
  std::vector<std::vector<float>> xs, wants, firsts(std::size(cases));
  for (const Case& c : cases) {
    weights.push_back(make_weight(c.format, c.rows, c.cols, rng));
    xs.push_back(random_floats(size_t(c.n * c.groups * c.cols), rng));
    std::vector<float> want(size_t(c.n * c.rows));
    if (c.groups > 1) cpu.linear_grouped(xs.back().data(), weights.back().w, c.groups, c.n, want.data());
    else cpu.linear(xs.back().data(), c.cols, weights.back().w, c.n, want.data(), c.rows);
    wants.push_back(want);
    gpu.upload(weights.back().w);
  }
  for (int round = 0; round < 3; ++round)
    for (size_t k = 0; k < std::size(cases); ++k) {
      const Case& c = cases[k];
      SCOPED_TRACE(describe(c) + " round " + std::to_string(round));
      const float* dx = to_device(gpu, xs[k]);
      float* dy = poisoned(gpu, size_t(c.n * c.rows));
      if (c.groups > 1) gpu.linear_grouped(dx, weights[k].w, c.groups, c.n, dy);
      else gpu.linear(dx, c.groups * c.cols, weights[k].w, c.n, dy, c.rows);
      const std::vector<float> got = to_host(gpu, dy, size_t(c.n * c.rows));
      double sq = 0.0;
      for (float v : wants[k]) sq += double(v) * v;
      const double tol = 1e-6 * std::sqrt(double(c.cols)), rms = std::sqrt(sq / double(wants[k].size()));
      EXPECT_TRUE(compare(got, wants[k], {tol * rms, tol}, describe(c)));
      if (round == 0) firsts[k] = got;
      else EXPECT_EQ(std::memcmp(got.data(), firsts[k].data(), got.size() * sizeof(float)), 0);
    }
#endif
}

// No float atomics anywhere: the same inputs give bitwise the same outputs. The cases cover every GEMV variant
// (streaming with and without split K; staged with clusters, wide row groups, several K stages, two launches
// for n > 8) and the generic kernel, small enough to run under compute-sanitizer.
TEST(CudaGemm, Deterministic) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  for (const Case& c : {Case{Format::kF32, 1, 24, 16384}, Case{Format::kFP4, 3, 2048, 4096},
                        Case{Format::kFP4, 8, 24, 16384}, Case{Format::kBF16, 16, 200, 8192},
                        Case{Format::kFP8, 2, 1000, 2048}, Case{Format::kFP8, 40, 300, 989}}) {
    std::mt19937_64 a(rng()), b = a;
    const std::vector<float> first = check_case(c, a);
    const std::vector<float> second = check_case(c, b);
    EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)), 0) << describe(c);
  }
#endif
}

}  // namespace
}  // namespace dsv4::test
