// Scalar format conversions (see dtype.h). The fp8/fp4 encoders search the format's value table,
// which makes round-to-nearest-even obviously correct: codes are monotonic in magnitude, so an
// exact tie is broken towards the even code.
#include "core/dtype.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

namespace dsv4 {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: return 2;
    case DType::kF8E4M3: case DType::kF8E8M0: case DType::kI8: case DType::kU8: return 1;
    case DType::kI64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kF8E8M0: return "F8_E8M0";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
  }
  return "?";
}

bool parse_dtype(const std::string& label, DType* out) {
  static const std::pair<const char*, DType> kLabels[] = {
      {"F32", DType::kF32},         {"F16", DType::kF16},         {"BF16", DType::kBF16},
      {"F8_E4M3", DType::kF8E4M3},  {"F8_E8M0", DType::kF8E8M0},  {"I8", DType::kI8},
      {"U8", DType::kU8},           {"I32", DType::kI32},         {"I64", DType::kI64},
  };
  for (const auto& [name, t] : kLabels) {
    if (label == name) {
      *out = t;
      return true;
    }
  }
  return false;
}

static uint32_t bits_of(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}
static float float_of(uint32_t u) {
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

float bf16_to_f32(uint16_t bits) { return float_of(uint32_t(bits) << 16); }

uint16_t f32_to_bf16(float value) {
  uint32_t u = bits_of(value);
  if (std::isnan(value)) return uint16_t((u >> 16) | 0x40);
  u += 0x7FFF + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

float round_bf16(float value) { return bf16_to_f32(f32_to_bf16(value)); }

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const int exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  if (exp == 0x1F) return float_of(sign | 0x7F800000 | (mant << 13));
  if (exp == 0) {
    const float v = std::ldexp(float(mant), -24);
    return sign ? -v : v;
  }
  return float_of(sign | (uint32_t(exp - 15 + 127) << 23) | (mant << 13));
}

uint16_t f32_to_f16(float value) {
  const uint16_t sign = (bits_of(value) >> 16) & 0x8000;
  const float a = std::fabs(value);
  if (std::isnan(value)) return sign | 0x7E00;
  if (a >= 65520.0f) return sign | 0x7C00;  // rounds to infinity
  if (a < std::ldexp(1.0f, -14)) {          // subnormal: multiples of 2^-24
    const float q = std::nearbyint(a * std::ldexp(1.0f, 24));  // default rounding mode is RNE
    return sign | uint16_t(q);
  }
  int e;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  const float step = std::ldexp(1.0f, e - 11);
  const float q = std::nearbyint(a / step) * step;
  int e2;
  const float f2 = std::frexp(q, &e2);
  const uint16_t exp_bits = uint16_t(e2 - 1 + 15);
  const uint16_t mant_bits = uint16_t(std::ldexp(f2 * 2.0f - 1.0f, 10));
  return sign | uint16_t(exp_bits << 10) | mant_bits;
}

namespace {

// Positive e4m3 values for codes 0..126 (127 is NaN).
const std::array<float, 127>& e4m3_table() {
  static const std::array<float, 127> table = [] {
    std::array<float, 127> t{};
    for (int c = 0; c < 127; ++c) {
      const int exp = c >> 3, mant = c & 7;
      t[c] = exp == 0 ? std::ldexp(float(mant), -9) : std::ldexp(1.0f + mant / 8.0f, exp - 7);
    }
    return t;
  }();
  return table;
}

constexpr std::array<float, 8> kE2m1Values = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// Index of the table entry nearest to a (a >= 0, a <= last entry), ties to the even index.
template <size_t N>
int nearest_even(const std::array<float, N>& table, float a) {
  const auto it = std::lower_bound(table.begin(), table.end(), a);
  int hi = int(it - table.begin());
  if (hi == 0) return 0;
  if (hi == int(N)) return int(N) - 1;
  const int lo = hi - 1;
  const float d_lo = a - table[lo], d_hi = table[hi] - a;
  if (d_lo < d_hi) return lo;
  if (d_hi < d_lo) return hi;
  return (lo % 2 == 0) ? lo : hi;
}

}  // namespace

float e4m3_to_f32(uint8_t bits) {
  const int code = bits & 0x7F;
  if (code == 0x7F) return std::numeric_limits<float>::quiet_NaN();
  const float v = e4m3_table()[code];
  return (bits & 0x80) ? -v : v;
}

uint8_t f32_to_e4m3(float value) {
  if (std::isnan(value)) return 0x7F;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0;
  const float a = std::min(std::fabs(value), 448.0f);
  return sign | uint8_t(nearest_even(e4m3_table(), a));
}

float e2m1_to_f32(uint8_t code) {
  const float v = kE2m1Values[code & 7];
  return (code & 8) ? -v : v;
}

uint8_t f32_to_e2m1(float value) {
  const uint8_t sign = std::signbit(value) ? 8 : 0;
  const float a = std::min(std::fabs(value), 6.0f);
  return sign | uint8_t(nearest_even(kE2m1Values, a));
}

float e8m0_to_f32(uint8_t bits) {
  if (bits == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, int(bits) - 127);
}

int ceil_log2(float a) {
  const uint32_t u = bits_of(a);
  const int exp = int((u >> 23) & 0xFF) - 127;
  const uint32_t mant = u & 0x7FFFFF;
  return exp + (mant != 0 ? 1 : 0);
}

}  // namespace dsv4
