// Number formats (spec §3.3): every code of FP8 e4m3, FP4 e2m1 and E8M0 against an independent bit-level
// decode, and the encoders' round-to-nearest-even against brute force over the whole code table.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/dtype.h"

namespace dsv4 {
namespace {

// Independent decoders written from the format definitions (not from dtype.cpp's tables).
double decode_e4m3_bits(uint8_t b) {
  const int sign = b >> 7, exp = (b >> 3) & 0xF, mant = b & 7;
  if (exp == 0xF && mant == 7) return NAN;
  const double mag = exp == 0 ? std::ldexp(mant / 8.0, -6) : std::ldexp(1.0 + mant / 8.0, exp - 7);
  return sign ? -mag : mag;
}

double decode_e2m1_bits(uint8_t code) {
  const int sign = (code >> 3) & 1, exp = (code >> 1) & 3, mant = code & 1;
  const double mag = exp == 0 ? mant * 0.5 : std::ldexp(1.0 + mant / 2.0, exp - 1);
  return sign ? -mag : mag;
}

TEST(Dtype, E4m3DecodeMatchesBitFormula) {
  for (int b = 0; b < 256; ++b) {
    const double want = decode_e4m3_bits(uint8_t(b));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(e4m3_to_f32(uint8_t(b)))) << b;
    } else {
      EXPECT_EQ(double(e4m3_to_f32(uint8_t(b))), want) << b;
    }
  }
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
}

TEST(Dtype, E2m1DecodeMatchesBitFormula) {
  for (int c = 0; c < 16; ++c) EXPECT_EQ(double(e2m1_to_f32(uint8_t(c))), decode_e2m1_bits(uint8_t(c))) << c;
  EXPECT_EQ(e2m1_to_f32(7), 6.0f);
  EXPECT_EQ(e2m1_to_f32(0xF), -6.0f);
}

TEST(Dtype, E8m0IsPowerOfTwo) {
  for (int b = 0; b < 255; ++b) EXPECT_EQ(e8m0_to_f32(uint8_t(b)), std::ldexp(1.0f, b - 127)) << b;
  EXPECT_TRUE(std::isnan(e8m0_to_f32(0xFF)));
}

// Brute-force nearest code (ties to the even code, i.e. even mantissa LSB) over all finite positive codes.
template <class Decode>
int brute_nearest(double a, int n_codes, Decode decode) {
  int best = 0;
  for (int c = 1; c < n_codes; ++c) {
    const double dc = std::fabs(decode(c) - a), db = std::fabs(decode(best) - a);
    if (dc < db || (dc == db && (c & 1) == 0)) best = c;
  }
  return best;
}

TEST(Dtype, E4m3EncodeIsRoundToNearestEven) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<double> logmag(-12.0, 9.5);
  for (int i = 0; i < 20000; ++i) {
    const float v = float(std::exp2(logmag(rng))) * (rng() & 1 ? -1.0f : 1.0f);
    const float a = std::min(std::fabs(v), 448.0f);
    const int want = brute_nearest(a, 127, [](int c) { return decode_e4m3_bits(uint8_t(c)); });
    EXPECT_EQ(f32_to_e4m3(v) & 0x7F, want) << v;
    EXPECT_EQ(f32_to_e4m3(v) >> 7, v < 0 ? 1 : 0) << v;
  }
  // Exact midpoints go to the even code: 144 | 160 at 152 → 160 (mantissa 010), 9 | 10 at 9.5 → 10? no:
  // 9 = 1.125·8 (odd), 10 = 1.25·8 (even) → 10; 17 between 16 (even) and 18 (odd) → 16.
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(152.0f)), 160.0f);
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(9.5f)), 10.0f);
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(17.0f)), 16.0f);
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(1000.0f)), 448.0f);  // saturates
}

TEST(Dtype, E2m1EncodeIsRoundToNearestEven) {
  const float cases[][2] = {{0.24f, 0.0f}, {0.25f, 0.0f}, {0.26f, 0.5f}, {0.75f, 1.0f}, {1.25f, 1.0f},
                            {1.75f, 2.0f}, {2.5f, 2.0f},  {3.5f, 4.0f},  {5.0f, 4.0f},  {5.1f, 6.0f},
                            {9.0f, 6.0f},  {-2.5f, -2.0f}, {-0.3f, -0.5f}};
  for (const auto& c : cases) EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(c[0])), c[1]) << c[0];
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> u(-7.0f, 7.0f);
  for (int i = 0; i < 5000; ++i) {
    const float v = u(rng);
    const int want = brute_nearest(std::min(std::fabs(double(v)), 6.0), 8, [](int c) { return decode_e2m1_bits(uint8_t(c)); });
    EXPECT_EQ(f32_to_e2m1(v) & 7, want) << v;
  }
}

TEST(Dtype, Bf16AndF16RoundTrip) {
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.0f, 10.0f);
  for (int i = 0; i < 10000; ++i) {
    const float v = n(rng);
    const float b = bf16_to_f32(f32_to_bf16(v));
    EXPECT_LE(std::fabs(b - v), std::ldexp(std::fabs(v), -8)) << v;
    EXPECT_EQ(f32_to_bf16(b), f32_to_bf16(v));  // idempotent
    const float h = f16_to_f32(f32_to_f16(v));
    EXPECT_LE(std::fabs(h - v), std::ldexp(std::fabs(v), -11) + std::ldexp(1.0f, -25)) << v;
  }
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3F80);  // tie 1 + 2^-8 rounds to even (1.0)
}

TEST(Dtype, CeilLog2MatchesLibm) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> e(-30.0, 30.0);
  for (int i = 0; i < 10000; ++i) {
    const float a = float(std::exp2(e(rng)));
    EXPECT_EQ(ceil_log2(a), int(std::ceil(std::log2(double(a))))) << a;
  }
  EXPECT_EQ(ceil_log2(1.0f), 0);
  EXPECT_EQ(ceil_log2(0.25f), -2);
  EXPECT_EQ(ceil_log2(3.0f), 2);
}

}  // namespace
}  // namespace dsv4
