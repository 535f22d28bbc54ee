// quant family, CPU reference: the quantise-dequantise simulation points of the official numerics
// (spec §3.4, §3.5). Scales are powers of two, so x / s and q · s are exact.
#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "core/error.h"
#include "cpu/cpu_ops.h"

namespace dsv4 {

namespace {

// Walsh–Hadamard transform in natural (Sylvester) order, scaled by 1/sqrt(n); n is a power of two.
void hadamard(float* v, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const float a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
  const float s = float(1.0 / std::sqrt(double(n)));
  for (int64_t i = 0; i < n; ++i) v[i] *= s;
}

// act_quant's block scale 2^e of `count` values: e = ceil_log2(max(amax, 1e-4) / 448).
int e4m3_block_exponent(const float* v, int64_t count) {
  float amax = 1e-4f;
  for (int64_t i = 0; i < count; ++i) amax = std::max(amax, std::fabs(v[i]));
  return ceil_log2(amax / 448.0f);
}

// A value's e4m3 code in a block of exponent e: e4m3_RNE(clamp(v · 2^−e, ±448)).
uint8_t e4m3_block_code(float v, int e) { return f32_to_e4m3(std::clamp(std::ldexp(v, -e), -448.0f, 448.0f)); }

}  // namespace

void round_bf16(float* x, size_t count) {
  for (size_t i = 0; i < count; ++i) x[i] = round_bf16(x[i]);
}

void fp8_round_trip(float* v, int64_t cols, int64_t block) {
  for (int64_t b0 = 0; b0 < cols; b0 += block) {
    const int64_t b1 = std::min(cols, b0 + block);
    const int e = e4m3_block_exponent(v + b0, b1 - b0);
    for (int64_t i = b0; i < b1; ++i) v[i] = std::ldexp(e4m3_to_f32(e4m3_block_code(v[i], e)), e);
  }
}

void act_quant_rows(const float* x, int64_t rows, int64_t cols, int64_t ldx, const E4m3Rows& q) {
  DSV4_CHECK(cols % 128 == 0 && cols == q.cols && rows <= q.rows, "act_quant_rows: [", rows, ", ", cols,
             "] into e4m3 rows [", q.rows, ", ", q.cols, "]");
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / 128; ++b) {
      const float* v = x + r * ldx + b * 128;
      const int e = e4m3_block_exponent(v, 128);
      for (int64_t i = 0; i < 128; ++i) q.codes[r * cols + b * 128 + i] = e4m3_block_code(v[i], e);
      q.scales[b * q.scale_ld + r] = std::ldexp(1.0f, e);
    }
}

void fp4_round_trip(float* v, int64_t cols) {
  const float min_amax = 6.0f * std::ldexp(1.0f, -126);
  for (int64_t b0 = 0; b0 < cols; b0 += 32) {
    float amax = min_amax;
    for (int64_t i = b0; i < b0 + 32; ++i) amax = std::max(amax, std::fabs(v[i]));
    const int e = ceil_log2(amax / 6.0f);
    for (int64_t i = b0; i < b0 + 32; ++i) {
      const float q = std::clamp(std::ldexp(v[i], -e), -6.0f, 6.0f);
      v[i] = std::ldexp(e2m1_to_f32(f32_to_e2m1(q)), e);
    }
  }
}

// Fast numerics quantise bf16 values (§4.1): amax and the codes come from the bf16-rounded row.
void CpuOps::sim_fp8(float* x, int64_t rows, int64_t row_stride, int64_t cols, int64_t block) {
#pragma omp parallel for schedule(static) if (rows > 64)
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * row_stride;
    if (fast()) round_bf16(v, size_t(cols));
    fp8_round_trip(v, cols, block);
  }
}

// Fast numerics: bf16 into the Hadamard transform and bf16 out of it, then Q4 (fast-numerics.md §1.6, §2.3).
void CpuOps::hadamard_sim_fp4(float* x, int64_t rows, int64_t dim) {
  // The butterflies need a power of two (another n would read and write past the row); FP4 blocks are 32 wide.
  DSV4_CHECK(dim >= 32 && (dim & (dim - 1)) == 0, "hadamard_sim_fp4: dim ", dim, " must be a power of two >= 32");
  DSV4_CHECK(rows >= 0, "hadamard_sim_fp4: negative row count ", rows);
#pragma omp parallel for schedule(static) if (rows > 64)
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * dim;
    if (fast()) round_bf16(v, size_t(dim));
    hadamard(v, dim);
    if (fast()) round_bf16(v, size_t(dim));
    fp4_round_trip(v, dim);
  }
}

}  // namespace dsv4
