// The rounding points of fast numerics (docs/design/fast-numerics.md §1.2–§1.4) against independent
// formulations written here in double arithmetic: the bf16 round trip (RNE, ties, NaN, inf, subnormals),
// DeepSeek's act_quant (per block a power-of-two scale ≥ amax / 448, e4m3 RNE), fp4_act_quant, and the CPU
// backend's FP8 GEMM under kFast (bf16 activations, act_quant per 128, bf16 output).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "cpu/cpu_ops.h"

namespace dsv4 {
namespace {

float from_bits(uint32_t u) {
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}
uint32_t bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}

// x rounded to a grid of `mant_bits` fraction bits, exponent at least `min_exp` (subnormal steps below it), ties
// to even: nearbyint rounds half to even in the default mode, and every step here is exact in double.
double round_to_grid(double x, int mant_bits, int min_exp) {
  if (x == 0 || !std::isfinite(x)) return x;
  const int e = std::max(std::ilogb(x), min_exp);
  const double step = std::ldexp(1.0, e - mant_bits);
  return std::nearbyint(x / step) * step;
}

// bf16: 7 fraction bits, the exponent range of fp32 (min normal 2^-126); at or above 2^128 after rounding: inf.
float bf16_independent(float x) {
  if (std::isnan(x)) return x;
  const double r = round_to_grid(double(x), 7, -126);
  if (std::fabs(r) >= std::ldexp(1.0, 128)) return std::copysign(std::numeric_limits<float>::infinity(), x);
  return float(r);
}

// The smallest power of two s with s ≥ a.
double pow2_at_least(double a) {
  double s = 1.0;
  while (s < a) s *= 2;
  while (s / 2 >= a) s /= 2;
  return s;
}

// act_quant (block columns, e4m3: 3 fraction bits, min normal 2^-6, max 448) or fp4_act_quant (e2m1: 1 fraction
// bit, min normal 2^0, max 6), dequantised.
std::vector<float> quant_independent(const std::vector<float>& x, int64_t block, bool fp4) {
  const double max_code = fp4 ? 6.0 : 448.0, min_amax = fp4 ? 6.0 * std::ldexp(1.0, -126) : 1e-4;
  std::vector<float> out(x.size());
  for (size_t b0 = 0; b0 < x.size(); b0 += size_t(block)) {
    const size_t b1 = std::min(x.size(), b0 + size_t(block));
    double amax = min_amax;
    for (size_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(double(x[i])));
    const double s = pow2_at_least(amax / max_code);
    for (size_t i = b0; i < b1; ++i) {
      const double y = std::clamp(double(x[i]) / s, -max_code, max_code);
      out[i] = float(round_to_grid(y, fp4 ? 1 : 3, fp4 ? 0 : -6) * s);
    }
  }
  return out;
}

TEST(FastNumerics, Bf16RoundTripIsRoundToNearestEven) {
  std::mt19937 rng(1);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 1000000; ++i) {  // every class of fp32: normals, subnormals, inf, NaN
    const float x = from_bits(any(rng));
    const float got = round_bf16(x), want = bf16_independent(x);
    if (std::isnan(x)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << bits(x);
    } else {
      ASSERT_EQ(bits(got), bits(want)) << std::hex << bits(x);
    }
  }
  // Exact ties go to the even bf16 code, both ways; signs and zeros survive.
  EXPECT_EQ(bits(round_bf16(from_bits(0x3F808000))), 0x3F800000u);  // 1 + 2^-8 → 1
  EXPECT_EQ(bits(round_bf16(from_bits(0x3F818000))), 0x3F820000u);  // up to the even code
  EXPECT_EQ(bits(round_bf16(from_bits(0xBF818000))), 0xBF820000u);
  EXPECT_EQ(bits(round_bf16(from_bits(0x3F808001))), 0x3F810000u);  // just above the tie
  EXPECT_EQ(bits(round_bf16(from_bits(0x00008000))), 0x00000000u);  // subnormal tie → 0
  EXPECT_EQ(bits(round_bf16(from_bits(0x00018000))), 0x00020000u);
  EXPECT_EQ(bits(round_bf16(-0.0f)), 0x80000000u);
  // The largest finite bf16 stays; halfway to 2^128 overflows to inf; inf stays inf.
  EXPECT_EQ(bits(round_bf16(from_bits(0x7F7F0000))), 0x7F7F0000u);
  EXPECT_EQ(bits(round_bf16(from_bits(0x7F7F7FFF))), 0x7F7F0000u);
  EXPECT_TRUE(std::isinf(round_bf16(from_bits(0x7F7F8000))));
  EXPECT_EQ(round_bf16(-std::numeric_limits<float>::infinity()), -std::numeric_limits<float>::infinity());
  // A NaN whose payload is only in the low 16 bits stays NaN (plain truncation or rounding would make it inf).
  EXPECT_TRUE(std::isnan(round_bf16(from_bits(0x7F800001))));
  EXPECT_TRUE(std::isnan(round_bf16(from_bits(0xFF80FFFF))));
  // The array form is the scalar one.
  std::vector<float> v = {1.0f + 1.0f / 512, 3.14159f, -2.71828f};
  round_bf16(v.data(), v.size());
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], round_bf16(3.14159f));
  EXPECT_EQ(v[2], round_bf16(-2.71828f));
}

// Rows of random bf16 values over a wide range of magnitudes, each block its own scale.
std::vector<float> random_row(std::mt19937& rng, int64_t cols, int64_t block) {
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> magnitude(-30, 12);
  std::vector<float> x(static_cast<size_t>(cols));
  for (int64_t b0 = 0; b0 < cols; b0 += block) {
    const float s = std::ldexp(1.0f, magnitude(rng));
    for (int64_t i = b0; i < std::min(cols, b0 + block); ++i) x[size_t(i)] = round_bf16(normal(rng) * s);
  }
  return x;
}

void expect_same(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << what << " at " << i;
}

TEST(FastNumerics, ActQuantMatchesIndependentFormulation) {
  std::mt19937 rng(2);
  for (const int64_t block : {128, 64}) {
    for (const int64_t cols : {int64_t(1), int64_t(19), int64_t(128), int64_t(448), int64_t(989), int64_t(7168)}) {
      for (int rep = 0; rep < 20; ++rep) {
        const std::vector<float> x = random_row(rng, cols, block);
        std::vector<float> got = x;
        fp8_round_trip(got.data(), cols, block);
        expect_same(got, quant_independent(x, block, false), "cols " + std::to_string(cols));
      }
    }
  }
}

TEST(FastNumerics, ActQuantBoundaries) {
  const auto q = [](std::vector<float> x) {
    fp8_round_trip(x.data(), int64_t(x.size()), 128);
    return x;
  };
  // amax exactly 448·2^k: the scale is 2^k and amax maps to 448 exactly; one ulp above: the scale doubles.
  EXPECT_EQ(q({448.0f, 1.0f}), (std::vector<float>{448.0f, 1.0f}));
  EXPECT_EQ(q({-448.0f * 8, 8.5f}), (std::vector<float>{-448.0f * 8, 8.0f}));  // 8.5/8 = 1.0625 → 1 (tie, even)
  const float above = std::nextafter(448.0f, 1000.0f);
  EXPECT_EQ(q({above})[0], 448.0f);  // scale 2: above/2 rounds to 224
  EXPECT_EQ(q({above, 1.0f + 1.0f / 16})[1], 1.0f);  // with scale 2 the grid near 1 has step 1/8: 1.0625 → 1 (tie)
  // An all-zero block uses amax 1e-4: zeros stay zeros, and a tiny value is quantised on that scale's grid.
  EXPECT_EQ(q({0.0f, 0.0f}), (std::vector<float>{0.0f, 0.0f}));
  const float tiny = 1e-10f;  // scale 2^ceil(log2(1e-4 / 448)) = 2^-22; tiny / 2^-22 is far below e4m3's 2^-9 step
  EXPECT_EQ(q({tiny})[0], 0.0f);
  // Every result is e4m3 × a power of two, and bf16 holds it exactly (the in-place simulation of §1.2).
  std::mt19937 rng(3);
  const std::vector<float> x = q(random_row(rng, 1024, 128));
  for (const float v : x) EXPECT_EQ(round_bf16(v), v);
}

TEST(FastNumerics, Fp4QuantMatchesIndependentFormulation) {
  std::mt19937 rng(4);
  for (const int64_t cols : {int64_t(32), int64_t(128), int64_t(512)}) {
    for (int rep = 0; rep < 50; ++rep) {
      const std::vector<float> x = random_row(rng, cols, 32);
      std::vector<float> got = x;
      fp4_round_trip(got.data(), cols);
      expect_same(got, quant_independent(x, 32, true), "cols " + std::to_string(cols));
    }
  }
  std::vector<float> x(32, 0.0f);
  x[0] = 6.0f;
  x[1] = 2.5f;   // tie between 2 and 3: the even code, 2
  x[2] = 5.0f;   // tie between 4 and 6: 4
  x[3] = -0.25f; // tie between 0 and 0.5: 0
  fp4_round_trip(x.data(), 32);
  EXPECT_EQ(x[0], 6.0f);
  EXPECT_EQ(x[1], 2.0f);
  EXPECT_EQ(x[2], 4.0f);
  EXPECT_EQ(x[3], 0.0f);
}

// A kFast CpuOps with the shapes the ops below need (no vocab: no projection is the LM head).
ModelConfig small_config() {
  ModelConfig c;
  c.dim = 256;
  c.rope_dim = 64;
  return c;
}

// The Hadamard's butterflies need a power of two: another row width is refused with an error naming it (it once
// read and wrote past each row: a d = 192 test case overflowed the heap), a power of two of 32 or more is taken.
TEST(FastNumerics, HadamardSimFp4RefusesRowsThatAreNotAPowerOfTwo) {
  CpuOps ops(small_config());
  for (const int64_t dim : {int64_t(192), int64_t(96), int64_t(16)}) {
    std::vector<float> x(size_t(2 * dim), 1.0f);
    try {
      ops.hadamard_sim_fp4(x.data(), 2, dim);
      ADD_FAILURE() << "dim " << dim << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("power of two"), std::string::npos) << e.what();
    }
  }
  // A row of ones rotates onto its first channel, 64 / sqrt(64) = 8 = 4 · 2^1 on the FP4 grid, the rest zero.
  std::vector<float> x(2 * 64, 1.0f);
  ops.hadamard_sim_fp4(x.data(), 2, 64);
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t c = 0; c < 64; ++c) EXPECT_EQ(x[size_t(r * 64 + c)], c == 0 ? 8.0f : 0.0f) << r << ", " << c;
}

// sim_fp8 under kFast quantises the bf16-rounded row (§4.1); under kReference the fp32 row, as before.
TEST(FastNumerics, SimFp8RoundsToBf16FirstOnlyInFast) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> x(3 * 448);
  for (float& v : x) v = normal(rng);
  CpuOps fast(small_config()), reference(small_config());
  fast.set_numerics(Numerics::kFast);
  std::vector<float> got_fast = x, got_reference = x;
  fast.sim_fp8(got_fast.data(), 3, 448, 448, 64);
  reference.sim_fp8(got_reference.data(), 3, 448, 448, 64);
  std::vector<float> bf16 = x;
  for (float& v : bf16) v = round_bf16(v);
  for (int64_t r = 0; r < 3; ++r) {
    const auto row = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin() + r * 448, v.begin() + (r + 1) * 448);
    };
    expect_same(row(got_fast), quant_independent(row(bf16), 64, false), "fast");
    expect_same(row(got_reference), quant_independent(row(x), 64, false), "reference");
  }
}

// y = bf16(Σ_k Q8(bf16 x)·w) of a quantised weight whose value at (r, k) is weight(r, k). The sum here is in
// double, so the result may differ by one bf16 ulp where fp32 accumulation crosses a rounding boundary.
template <class WeightValue>
void check_quantised_linear(const Weight& w, WeightValue weight, std::mt19937& rng) {
  const int64_t n = 3, rows = w.rows, K = w.cols;
  std::normal_distribution<float> normal;
  std::vector<float> x(size_t(n * K));
  for (float& v : x) v = normal(rng) * 3.0f;
  CpuOps ops(small_config());
  ops.set_numerics(Numerics::kFast);
  std::vector<float> y(size_t(n * rows));
  ops.linear(x.data(), K, w, n, y.data(), rows);

  int differs_from_fp32 = 0;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float> xi(x.begin() + i * K, x.begin() + (i + 1) * K);
    for (float& v : xi) v = round_bf16(v);
    const std::vector<float> q = quant_independent(xi, 128, false);
    for (int64_t r = 0; r < rows; ++r) {
      double want = 0, fp32 = 0;
      for (int64_t k = 0; k < K; ++k) {
        want += double(q[size_t(k)]) * weight(r, k);
        fp32 += double(x[size_t(i * K + k)]) * weight(r, k);
      }
      const float got = y[size_t(i * rows + r)];
      EXPECT_EQ(round_bf16(got), got) << "output not bf16 at " << i << "," << r;
      const double ulp = std::ldexp(1.0, std::ilogb(want) - 7);
      EXPECT_LE(std::fabs(got - want), ulp) << i << "," << r << ": got " << got << " want " << want;
      differs_from_fp32 += float(fp32) != got;
    }
  }
  EXPECT_GT(differs_from_fp32, n * rows / 2);  // the rounding points are really there
}

// FP8 e4m3 with 128×128 ue8m0 scales (attention and shared-expert projections).
TEST(FastNumerics, Fp8LinearQuantisesActivationsAndRoundsOutput) {
  const int64_t rows = 19, K = 384;
  std::mt19937 rng(6);
  std::uniform_int_distribution<int> code(0, 255), exponent(120, 130);
  std::vector<uint8_t> data(size_t(rows * K)), scales(size_t(K / 128));
  for (uint8_t& b : data) {
    do b = uint8_t(code(rng));
    while ((b & 0x7F) == 0x7F);  // no NaN codes
  }
  for (uint8_t& s : scales) s = uint8_t(exponent(rng));
  const Weight w{.dtype = DType::kF8E4M3, .rows = rows, .cols = K, .data = data.data(), .row_stride = K,
                 .scale = scales.data(), .scale_dtype = DType::kF8E8M0, .scale_block_rows = 128,
                 .scale_block_cols = 128, .scale_stride = K / 128};
  check_quantised_linear(
      w,
      [&](int64_t r, int64_t k) {
        return double(e4m3_to_f32(data[size_t(r * K + k)])) * e8m0_to_f32(scales[size_t(k / 128)]);
      },
      rng);
}

// The typed seam's act_quant'ed rows (model/ops.h's E4m3Rows): code · scale is fp8_round_trip's value, a fast
// rms_norm writes them for the y it returns, and a fast FP8 linear reading them computes exactly what it computes
// quantising x itself (here: x poisoned to NaN, so only the codes can give that answer).
TEST(FastNumerics, ActQuantRowsFeedTheFp8Linear) {
  const int64_t rows = 5, K = 384, ld = 8;
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> value(-3.0f, 3.0f);
  std::vector<float> x(size_t(rows * K));
  for (size_t i = 0; i < x.size(); ++i) x[i] = round_bf16(value(rng) * (i % 128 == 5 ? 200.0f : 1.0f));
  std::vector<uint8_t> codes(size_t(rows * K));
  std::vector<float> scales(size_t(K / 128 * ld));
  const E4m3Rows q{codes.data(), scales.data(), rows, K, ld};
  act_quant_rows(x.data(), rows, K, K, q);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> want(x.begin() + r * K, x.begin() + (r + 1) * K);
    fp8_round_trip(want.data(), K, 128);
    for (int64_t k = 0; k < K; ++k)
      ASSERT_EQ(e4m3_to_f32(codes[size_t(r * K + k)]) * scales[size_t(k / 128 * ld + r)], want[size_t(k)])
          << r << "," << k;
  }

  ModelConfig config;
  CpuOps ops(config);
  ops.set_numerics(Numerics::kFast);
  std::vector<float> gamma(static_cast<size_t>(K)), y(x.size()), yq_codes_from(x.size());
  for (float& g : gamma) g = 0.5f + value(rng) / 6.0f;
  std::vector<uint8_t> norm_codes(codes.size());
  std::vector<float> norm_scales(scales.size());
  E4m3Rows nq{norm_codes.data(), norm_scales.data(), rows, K, ld};
  ops.rms_norm(x.data(), &gamma, rows, K, y.data(), &nq);
  ops.rms_norm(x.data(), &gamma, rows, K, yq_codes_from.data());
  EXPECT_EQ(y, yq_codes_from);
  act_quant_rows(y.data(), rows, K, K, q);
  EXPECT_EQ(norm_codes, codes);
  EXPECT_EQ(norm_scales, scales);

  std::vector<uint8_t> data(size_t(11 * K)), wscales(size_t(K / 128), 127);
  std::uniform_int_distribution<int> code(0, 255);
  for (uint8_t& b : data) {
    do b = uint8_t(code(rng));
    while ((b & 0x7F) == 0x7F);
  }
  const Weight w{.dtype = DType::kF8E4M3, .rows = 11, .cols = K, .data = data.data(), .row_stride = K,
                 .scale = wscales.data(), .scale_dtype = DType::kF8E8M0, .scale_block_rows = 128,
                 .scale_block_cols = 128, .scale_stride = K / 128};
  std::vector<float> self(size_t(rows * 11)), from_codes(self.size());
  ops.linear(y.data(), K, w, rows, self.data(), 11);
  std::vector<float> poisoned(y.size(), std::numeric_limits<float>::quiet_NaN());
  ops.linear(poisoned.data(), K, w, rows, from_codes.data(), 11, &nq);
  EXPECT_EQ(from_codes, self);
}

// A sliding-window attention step of n query rows at positions 5.. over a ring of `slots` rows, window 4, two
// heads' sinks, the output's rope channels rotated back: the step the bf16-rows tests below run.
AttentionParams sliding_step(const float* q, const float* ring, int64_t slots, int64_t n, int64_t heads, int64_t d) {
  static const std::vector<float> sinks = {0.5f, -1.0f};
  AttentionParams p;
  p.q = q;
  p.window = ring;
  p.ring_slots = slots;
  p.window_size = 4;
  p.sinks = sinks.data();
  p.pos0 = 5;
  p.n = n;
  p.heads = heads;
  p.head_dim = d;
  p.scale = 0.125f;
  p.derotate = true;
  return p;
}

// The attention's output as bf16 rows into wo_a (Bf16Rows, fast numerics): attention writes its fp32 output's
// values rounded to bf16 (after the derotation), and linear_grouped reads them as the same values in fp32 — bit
// for bit. A sliding-window step of 3 queries × 2 heads of 64 channels, the last 16 rotated back.
TEST(FastNumerics, AttentionFeedsWoAAsBf16Rows) {
  ModelConfig config;
  config.rope_dim = 16;
  CpuOps ops(config);
  ops.set_numerics(Numerics::kFast);
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  const auto bf16_values = [&](size_t count) {
    std::vector<float> v(count);
    for (float& f : v) f = round_bf16(value(rng));
    return v;
  };
  const int64_t n = 3, H = 2, d = 64, slots = 8, groups = 2;
  const std::vector<float> q = bf16_values(size_t(n * H * d)), ring = bf16_values(size_t(slots * d));
  AttentionParams p = sliding_step(q.data(), ring.data(), slots, n, H, d);
  std::vector<float> out(size_t(n * H * d));
  p.out = out.data();
  ops.attention(std::span<const AttentionParams>(&p, 1));
  std::vector<uint16_t> out_bits(out.size(), 0xFFFF);
  p.out = nullptr;
  p.out_bf16 = out_bits.data();
  ops.attention(std::span<const AttentionParams>(&p, 1));
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out_bits[i], f32_to_bf16(out[i])) << i;

  // wo_a-like: 2 groups of 64 inputs → 2 × 5 outputs, BF16 weights.
  std::vector<uint16_t> wdata(size_t(2 * 5 * d));
  for (uint16_t& b : wdata) b = f32_to_bf16(value(rng));
  const Weight w{.dtype = DType::kBF16, .rows = 2 * 5, .cols = d, .data = reinterpret_cast<const uint8_t*>(wdata.data()),
                 .row_stride = 2 * d};
  const Bf16Rows ob{out_bits.data(), n, H * d};
  std::vector<float> from_bits(size_t(n * 2 * 5)), from_f32(from_bits.size());
  ops.linear_grouped(nullptr, w, groups, n, from_bits.data(), &ob);
  ops.linear_grouped(out.data(), w, groups, n, from_f32.data());
  EXPECT_EQ(from_bits, from_f32);
}

// The query heads as bf16 rows (Bf16Rows, fast numerics' prefill): wq_b writes its output's bf16 bits,
// query_kv_finish norms and rotates them in place to the bf16 bits of what it computes from the same values in
// fp32, and the attention reads them as those values — bit for bit at each step. 3 tokens × 2 heads of 64
// channels (the last 16 rotated) from an FP8 wq_b of K = 128.
TEST(FastNumerics, QueryHeadsTravelAsBf16Rows) {
  ModelConfig config;
  config.rope_dim = 16;
  CpuOps ops(config);
  ops.set_numerics(Numerics::kFast);
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  const int64_t n = 3, H = 2, d = 64, K = 128, slots = 8;
  std::vector<float> x(size_t(n * K));
  for (float& v : x) v = round_bf16(value(rng));
  std::vector<uint8_t> data(size_t(H * d * K)), wscales(1, 127);
  std::uniform_int_distribution<int> code(0, 255);
  for (uint8_t& b : data) {
    do b = uint8_t(code(rng));
    while ((b & 0x7F) == 0x7F);
  }
  const Weight wq_b{.dtype = DType::kF8E4M3, .rows = H * d, .cols = K, .data = data.data(), .row_stride = K,
                    .scale = wscales.data(), .scale_dtype = DType::kF8E8M0, .scale_block_rows = 128,
                    .scale_block_cols = 128, .scale_stride = 1};
  std::vector<float> q(size_t(n * H * d));
  std::vector<uint16_t> q_bits(q.size(), 0xFFFF);
  Bf16Rows qb{q_bits.data(), n, H * d};
  ops.linear(x.data(), K, wq_b, n, q.data(), H * d);
  ops.linear(x.data(), K, wq_b, n, nullptr, H * d, nullptr, &qb);
  for (size_t i = 0; i < q.size(); ++i) ASSERT_EQ(q_bits[i], f32_to_bf16(q[i])) << "wq_b output " << i;

  std::vector<float> gamma(static_cast<size_t>(d));
  for (float& g : gamma) g = 0.5f + value(rng) / 4.0f;
  std::vector<float> kv(size_t(n * d)), kv_b(kv.size()), ring(size_t(slots * d), 0.0f), ring_b = ring;
  for (float& v : kv) v = round_bf16(value(rng));
  kv_b = kv;
  QueryKvParams fp32{q.data(), H, kv.data(), &gamma, n, d, d - config.rope_dim, 5, RopeKind::kPlain, true, slots,
                     ring.data()};
  QueryKvParams bf16 = fp32;
  bf16.q = nullptr;
  bf16.q_bf16 = q_bits.data();
  bf16.kv = kv_b.data();
  bf16.ring = ring_b.data();
  ops.query_kv_finish({&fp32, 1});
  ops.query_kv_finish({&bf16, 1});
  for (size_t i = 0; i < q.size(); ++i) ASSERT_EQ(q_bits[i], f32_to_bf16(q[i])) << "normed query " << i;
  EXPECT_EQ(ring_b, ring);

  AttentionParams p = sliding_step(q.data(), ring.data(), slots, n, H, d);
  std::vector<float> out(q.size()), out_b(q.size());
  p.out = out.data();
  ops.attention(std::span<const AttentionParams>(&p, 1));
  p.q = nullptr;
  p.q_bf16 = q_bits.data();
  p.out = out_b.data();
  ops.attention(std::span<const AttentionParams>(&p, 1));
  EXPECT_EQ(out_b, out);
}

// FP4 e2m1, two codes a byte (low nibble first), a ue8m0 scale per row and 32 columns (routed experts); K is not
// a multiple of 128, so the activations' last act_quant block is short.
TEST(FastNumerics, Fp4LinearQuantisesActivationsAndRoundsOutput) {
  const int64_t rows = 19, K = 352;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255), exponent(122, 130);
  std::vector<uint8_t> data(size_t(rows * K / 2)), scales(size_t(rows * K / 32));
  for (uint8_t& b : data) b = uint8_t(byte(rng));
  for (uint8_t& s : scales) s = uint8_t(exponent(rng));
  const Weight w{.dtype = DType::kI8, .rows = rows, .cols = K, .data = data.data(), .row_stride = K / 2,
                 .scale = scales.data(), .scale_dtype = DType::kF8E8M0, .scale_block_rows = 1,
                 .scale_block_cols = 32, .scale_stride = K / 32};
  check_quantised_linear(
      w,
      [&](int64_t r, int64_t k) {
        const uint8_t packed = data[size_t((r * K + k) / 2)];
        const uint8_t code = k % 2 == 0 ? packed & 0xF : packed >> 4;
        return double(e2m1_to_f32(code)) * e8m0_to_f32(scales[size_t(r * (K / 32) + k / 32)]);
      },
      rng);
}


// A bf16 projection rounds its output to bf16 under fast numerics; the LM head, with the same weight, keeps fp32
// logits (an fp32 GEMM of the widened weight), equal to the reference numerics' result.
TEST(FastNumerics, LmHeadKeepsFp32LogitsWhereLinearRounds) {
  const int64_t rows = 37, K = 64, n = 2;
  std::mt19937 rng(8);
  std::normal_distribution<float> normal;
  std::vector<uint16_t> data(size_t(rows * K));
  for (uint16_t& b : data) b = f32_to_bf16(normal(rng));
  std::vector<float> x(size_t(n * K));
  for (float& v : x) v = round_bf16(normal(rng));  // bf16 already, as the final norm writes it
  const Weight w{.dtype = DType::kBF16, .rows = rows, .cols = K,
                 .data = reinterpret_cast<const uint8_t*>(data.data()), .row_stride = K * 2};
  CpuOps fast(small_config()), reference(small_config());
  fast.set_numerics(Numerics::kFast);
  std::vector<float> head(size_t(n * rows)), projected(size_t(n * rows)), want(size_t(n * rows));
  fast.lm_head(x.data(), w, n, head.data());
  fast.linear(x.data(), K, w, n, projected.data(), rows);
  reference.linear(x.data(), K, w, n, want.data(), rows);
  int unrounded = 0;
  for (size_t i = 0; i < head.size(); ++i) {
    EXPECT_EQ(head[i], want[i]) << i;
    EXPECT_EQ(projected[i], round_bf16(want[i])) << i;
    unrounded += round_bf16(head[i]) != head[i];
  }
  EXPECT_GT(unrounded, int(head.size()) / 2);  // the head's logits are really not on the bf16 grid
}

}  // namespace
}  // namespace dsv4
