// norm_rope family, CPU reference: RMSNorm (weighted and unweighted) and interleaved partial RoPE.
#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "core/error.h"
#include "cpu/cpu_ops.h"

namespace dsv4 {

std::vector<float> rope_inv_freq(int64_t rope_dim, double theta, const YarnConfig* yarn) {
  const int64_t pairs = rope_dim / 2;
  std::vector<float> f(static_cast<size_t>(pairs));
  for (int64_t i = 0; i < pairs; ++i) f[size_t(i)] = float(1.0 / std::pow(theta, double(2 * i) / double(rope_dim)));
  if (!yarn || !yarn->enabled) return f;
  // Static YaRN (spec §3.2): pairs below `low` keep their frequency, pairs above `high` are divided by the
  // factor, with a linear ramp between. No magnitude correction.
  const double two_pi = 2.0 * M_PI;
  const auto corr = [&](double rotations) {
    return double(rope_dim) * std::log(double(yarn->original_max_position) / (rotations * two_pi)) /
           (2.0 * std::log(theta));
  };
  const double low = std::max(std::floor(corr(yarn->beta_fast)), 0.0);
  double high = std::min(std::ceil(corr(yarn->beta_slow)), double(rope_dim - 1));
  if (high == low) high += 0.001;  // avoid a zero-width ramp
  for (int64_t i = 0; i < pairs; ++i) {
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    const double f0 = f[size_t(i)];
    f[size_t(i)] = float(f0 / yarn->factor * ramp + f0 * (1.0 - ramp));
  }
  return f;
}

// Fast numerics: the output is bf16 (RMSNorm.forward's `.to(dtype)`), and the gain-less norm, the per-head
// query re-norm, is bf16 arithmetic throughout (rms_norm_bf16).
void CpuOps::rms_norm(const float* x, const std::vector<float>* gamma, int64_t rows, int64_t dim, float* y,
                      E4m3Rows* yq) {
  if (yq) {  // the norm, then its rows act_quant'ed (the CUDA kernels do both in one pass)
    rms_norm(x, gamma, rows, dim, y);
    return act_quant_rows(y, rows, dim, dim, *yq);
  }
  if (fast() && !gamma) return rms_norm_bf16(x, rows, dim, y);
  // NOTE: fp32 throughout, in the reference's order (mean of squares, rsqrt, x·inv, then γ·): the official
  // numerics round window/compressed KV to FP8 right after this norm, and an fp64 mean moves enough values
  // across FP8 rounding boundaries to change the indexer's choices downstream.
  const float eps = float(config_.norm_eps);
#pragma omp parallel for schedule(static) if (rows > 64)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    float acc[8] = {};
    int64_t i = 0;
    for (; i + 8 <= dim; i += 8)
      for (int k = 0; k < 8; ++k) acc[k] += xr[i + k] * xr[i + k];
    float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < dim; ++i) sum += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(sum / float(dim) + eps);
    for (int64_t j = 0; j < dim; ++j) yr[j] = (gamma ? (*gamma)[size_t(j)] : 1.0f) * (xr[j] * inv);
    if (fast()) round_bf16(yr, size_t(dim));
  }
}

// DeepSeek's q *= torch.rsqrt(q.square().mean(-1, keepdim=True) + eps) on a bf16 q: every elementwise step
// rounds to bf16; the mean accumulates in fp32 (fast-numerics.md §2.3, checklist step 5) in an order PyTorch does
// not fix. Here a warp's, which the CUDA kernels reproduce with all 32 lanes of a row: 32 partial sums, partial l
// over channel pairs l, l + 32, l + 64, ... (channel 2q, then 2q + 1, of pair q), then a tree that adds partials 16
// apart, then 8, 4, 2, 1 (norm_rope_row.cuh, row_inv_rms_bf16_warp).
void CpuOps::rms_norm_bf16(const float* x, int64_t rows, int64_t dim, float* y) {
  const float eps = float(config_.norm_eps);
#pragma omp parallel for schedule(static) if (rows > 64)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    const auto square = [&](int64_t i) { return round_bf16(round_bf16(xr[i]) * round_bf16(xr[i])); };
    float acc[32] = {};
    for (int64_t c = 0; c < dim; c += 2) {
      float& a = acc[(c / 2) % 32];
      a += square(c);
      if (c + 1 < dim) a += square(c + 1);
    }
    for (int d = 16; d >= 1; d /= 2)
      for (int l = 0; l < d; ++l) acc[l] += acc[l + d];
    const float sum = acc[0];
    const float mean = round_bf16(sum / float(dim));
    const float inv = round_bf16(1.0f / std::sqrt(round_bf16(mean + eps)));
    for (int64_t j = 0; j < dim; ++j) yr[j] = round_bf16(round_bf16(xr[j]) * inv);
  }
}

void CpuOps::rope(float* x, int64_t rows, int64_t row_stride, int64_t offset, int64_t rows_per_pos, int64_t pos0,
                  int64_t pos_stride, RopeKind kind, bool inverse) {
  const std::vector<float>& freq = kind == RopeKind::kPlain ? inv_freq_plain_ : inv_freq_compressed_;
  const int64_t pairs = int64_t(freq.size());
#pragma omp parallel for schedule(static) if (rows > 64)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t pos = pos0 + (r / rows_per_pos) * pos_stride;
    float* v = x + r * row_stride + offset;
    for (int64_t i = 0; i < pairs; ++i) {
      const float angle = float(pos) * freq[size_t(i)];  // fp32 angle, as the reference computes it
      const float c = float(std::cos(double(angle)));
      const float s = inverse ? -float(std::sin(double(angle))) : float(std::sin(double(angle)));
      const float a = v[2 * i], b = v[2 * i + 1];
      v[2 * i] = a * c - b * s;
      v[2 * i + 1] = a * s + b * c;
    }
    if (fast()) round_bf16(v, size_t(2 * pairs));  // apply_rotary_emb writes back into the bf16 tensor
  }
}

void CpuOps::query_kv_finish(std::span<const QueryKvParams> batch) {
  for (const QueryKvParams& p : batch) {
    if (!p.q_bf16) {
      Ops::query_kv_finish({&p, 1});
      continue;
    }
    DSV4_CHECK(fast() && !p.q, "query_kv_finish: bf16 query heads outside fast numerics, or beside fp32 ones");
    const size_t count = size_t(p.n * p.heads * p.dim);
    std::vector<float>& wide = scratch(8, count);
    for (size_t i = 0; i < count; ++i) wide[i] = bf16_to_f32(p.q_bf16[i]);
    QueryKvParams f = p;
    f.q = wide.data();
    f.q_bf16 = nullptr;
    Ops::query_kv_finish({&f, 1});
    for (size_t i = 0; i < count; ++i) p.q_bf16[i] = f32_to_bf16(wide[i]);
  }
}

}  // namespace dsv4
