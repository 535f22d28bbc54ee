// gemm family, CPU reference: weights are decoded row by row from checkpoint storage (never expanded
// in memory), then dotted with every activation row in fp32.
#include <algorithm>
#include <array>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "cpu/cpu_ops.h"

namespace dsv4 {

namespace {

const std::array<float, 256>& e4m3_lut() {
  static const std::array<float, 256> lut = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) t[b] = e4m3_to_f32(uint8_t(b));
    return t;
  }();
  return lut;
}

float scale_at(const Weight& w, int64_t scale_row, int64_t scale_col) {
  const int64_t i = scale_row * w.scale_stride + scale_col;
  if (w.scale_dtype == DType::kF32) {
    float s;
    std::memcpy(&s, w.scale + 4 * i, 4);
    return s;
  }
  return e8m0_to_f32(w.scale[i]);
}

// Eight independent partial sums: keeps the loop vectorisable without reassociation flags.
float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

}  // namespace

void dequant_row(const Weight& w, int64_t r, float* out) {
  const uint8_t* row = w.data + r * w.row_stride;
  switch (w.dtype) {
    case DType::kF32:
      std::memcpy(out, row, size_t(w.cols) * 4);
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < w.cols; ++i) {
        uint16_t b;
        std::memcpy(&b, row + 2 * i, 2);
        out[i] = bf16_to_f32(b);
      }
      return;
    case DType::kF16:
      for (int64_t i = 0; i < w.cols; ++i) {
        uint16_t h;
        std::memcpy(&h, row + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
      return;
    case DType::kF8E4M3: {
      const auto& lut = e4m3_lut();
      for (int64_t c0 = 0; c0 < w.cols; c0 += w.scale_block_cols) {
        const float s = scale_at(w, r / w.scale_block_rows, c0 / w.scale_block_cols);
        const int64_t c1 = std::min(w.cols, c0 + w.scale_block_cols);
        for (int64_t i = c0; i < c1; ++i) out[i] = lut[row[i]] * s;
      }
      return;
    }
    case DType::kI8:  // packed fp4 e2m1, element 2j in the low nibble
      for (int64_t c0 = 0; c0 < w.cols; c0 += w.scale_block_cols) {
        const float s = scale_at(w, r / w.scale_block_rows, c0 / w.scale_block_cols);
        for (int64_t i = c0; i < c0 + w.scale_block_cols; i += 2) {
          const uint8_t byte = row[i / 2];
          out[i] = e2m1_to_f32(byte & 0xF) * s;
          out[i + 1] = e2m1_to_f32(byte >> 4) * s;
        }
      }
      return;
    default:
      DSV4_ASSERT(false && "unsupported weight dtype");
  }
}

// Threads only pay off above a few hundred thousand multiply-adds; below that the fork/join dominates.
constexpr int64_t kParallelWork = 1 << 18;

void CpuOps::linear(const float* x, int64_t ldx, const Weight& w, int64_t n, float* y, int64_t ldy,
                    const E4m3Rows* xq, Bf16Rows* yb) {
  DSV4_CHECK(!yb || (fast() && w.dtype != DType::kF32 && !y && ldy == w.rows && yb->cols == w.rows && yb->rows >= n),
             "linear: bf16 rows [", yb ? yb->rows : 0, ", ", yb ? yb->cols : 0, "] for ", n, " rows of [", w.rows, ", ",
             w.cols, "] (fast numerics, bf16-rounding products only)");
  // A bf16 output is the fast product's (bf16-valued) fp32 output, narrowed.
  thread_local std::vector<float> staged;
  if (yb) {
    staged.resize(size_t(n * w.rows));
    y = staged.data();
  }
  // DeepSeek's linear() picks the arithmetic by the weight's dtype; fp32 weights stay fp32.
  if (fast() && w.dtype != DType::kF32)
    linear_fast(x, ldx, w, n, y, ldy, xq);
  else
    linear_f32(x, ldx, w, n, y, ldy);
  if (yb)
    for (size_t i = 0; i < staged.size(); ++i) yb->data[i] = f32_to_bf16(staged[i]);
}

void CpuOps::linear_partial(const float* x, int64_t ldx, const Weight& w, int64_t n, float* y, int64_t ldy) {
  if (fast() && w.dtype != DType::kF32)
    linear_fast(x, ldx, w, n, y, ldy, nullptr, false);
  else
    linear_f32(x, ldx, w, n, y, ldy);
}

void CpuOps::linear_f32(const float* x, int64_t ldx, const Weight& w, int64_t n, float* y, int64_t ldy) {
#pragma omp parallel if (w.rows * w.cols * n > kParallelWork)
  {
    thread_local std::vector<float> row;  // one decoded weight row per thread, reused across calls
    row.resize(size_t(w.cols));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < w.rows; ++r) {
      dequant_row(w, r, row.data());
      for (int64_t i = 0; i < n; ++i) y[i * ldy + r] = dot(x + i * ldx, row.data(), w.cols);
    }
  }
}

// The LM head is an fp32 GEMM of the widened bf16 weight in every numerics (fast-numerics.md §2.5).
void CpuOps::lm_head(const float* x, const Weight& head, int64_t n, float* logits) {
  linear_f32(x, head.cols, head, n, logits, head.rows);
}

// FP8 (128×128 scales) and FP4 (1×32 scales) weights: the fp8_gemm / fp4_gemm of §1.4 / §1.5. Each scale tile's
// dot product in fp32, scaled by both powers of two (exact: here folded into the decoded values), the tiles
// added in K order in fp32. Other weights (bf16): F.linear in bf16, fp32 accumulation. Output bf16.
void CpuOps::linear_fast(const float* x, int64_t ldx, const Weight& w, int64_t n, float* y, int64_t ldy,
                         const E4m3Rows* xq, bool round_out) {
  const int64_t K = w.cols;
  const bool fp8_gemm = w.dtype == DType::kF8E4M3 || w.dtype == DType::kI8;
  const int64_t tile = fp8_gemm ? w.scale_block_cols : K;
  if (fp8_gemm && xq)
    DSV4_CHECK(xq->cols == K && xq->rows >= n, "linear: act_quant'ed rows [", xq->rows, ", ", xq->cols, "] for ", n,
               " rows of ", K);
  thread_local std::vector<float> a;  // the activations as the GEMM reads them
  a.resize(size_t(n * K));
  const auto& lut = e4m3_lut();
  for (int64_t i = 0; i < n; ++i) {
    float* ai = a.data() + i * K;
    if (fp8_gemm && xq) {  // act_quant'ed by the producer: code · scale
      for (int64_t k = 0; k < K; ++k) ai[k] = lut[xq->codes[i * K + k]] * xq->scales[(k / 128) * xq->scale_ld + i];
      continue;
    }
    std::copy(x + i * ldx, x + i * ldx + K, ai);
    round_bf16(ai, size_t(K));
    if (fp8_gemm) fp8_round_trip(ai, K, 128);  // act_quant: e4m3 with a ue8m0 scale per token per 128
  }
  const float* act = a.data();
#pragma omp parallel if (w.rows * w.cols * n > kParallelWork)
  {
    thread_local std::vector<float> row;
    row.resize(size_t(K));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < w.rows; ++r) {
      dequant_row(w, r, row.data());
      for (int64_t i = 0; i < n; ++i) {
        float acc = 0.0f;
        for (int64_t k0 = 0; k0 < K; k0 += tile) acc += dot(act + i * K + k0, row.data() + k0, std::min(tile, K - k0));
        y[i * ldy + r] = round_out ? round_bf16(acc) : acc;
      }
    }
  }
}

// wo_a: a bf16 einsum in fast numerics (the FP8 weight dequantised to bf16 is exact), bf16 in and out.
void CpuOps::linear_grouped(const float* x, const Weight& w, int64_t groups, int64_t n, float* y,
                            const Bf16Rows* xb) {
  const int64_t out_g = w.rows / groups, in_g = w.cols;
  DSV4_CHECK(!xb || (fast() && xb->cols == groups * in_g && xb->rows >= n), "linear_grouped: bf16 rows [",
             xb ? xb->rows : 0, ", ", xb ? xb->cols : 0, "] for ", n, " rows of ", groups * in_g);
  thread_local std::vector<float> rounded;  // x as the product reads it: bf16 values
  if (xb) {
    rounded.resize(size_t(n * groups * in_g));
    for (size_t i = 0; i < rounded.size(); ++i) rounded[i] = bf16_to_f32(xb->data[i]);
    x = rounded.data();
  } else if (fast()) {
    rounded.assign(x, x + n * groups * in_g);
    round_bf16(rounded.data(), rounded.size());
    x = rounded.data();
  }
#pragma omp parallel if (w.rows * w.cols * n > kParallelWork)
  {
    thread_local std::vector<float> row;  // one decoded weight row per thread, reused across calls
    row.resize(size_t(w.cols));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < w.rows; ++r) {
      dequant_row(w, r, row.data());
      const int64_t g = r / out_g;
      for (int64_t i = 0; i < n; ++i) y[i * w.rows + r] = dot(x + i * groups * in_g + g * in_g, row.data(), in_g);
    }
  }
  if (fast()) round_bf16(y, size_t(n * w.rows));
}

}  // namespace dsv4
