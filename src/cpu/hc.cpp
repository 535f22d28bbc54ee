// hc family, CPU reference: manifold-constrained hyper-connections (spec §5). Per token, the hc·D
// streams are mixed down to one sub-block input (pre), and the sub-block output is mixed back (post, comb).
// Fast numerics: the mixes, Sinkhorn, post and comb stay fp32; the collapsed row and the new streams are bf16.
#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "cpu/cpu_ops.h"

namespace dsv4 {

namespace {

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

// Sinkhorn–Knopp projection of an hc × hc logit matrix onto (approximately) doubly stochastic matrices,
// in the reference's exact order: row softmax + eps, column normalisation, then (iters − 1) × (rows, cols).
void sinkhorn(float* C, int64_t n, int64_t iters, float eps) {
  for (int64_t j = 0; j < n; ++j) {
    float* row = C + j * n;
    float mx = row[0];
    for (int64_t k = 1; k < n; ++k) mx = std::max(mx, row[k]);
    float sum = 0.0f;
    for (int64_t k = 0; k < n; ++k) sum += (row[k] = std::exp(row[k] - mx));
    for (int64_t k = 0; k < n; ++k) row[k] = row[k] / sum + eps;
  }
  const auto normalise_cols = [&] {
    for (int64_t k = 0; k < n; ++k) {
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) sum += C[j * n + k];
      for (int64_t j = 0; j < n; ++j) C[j * n + k] /= sum + eps;
    }
  };
  const auto normalise_rows = [&] {
    for (int64_t j = 0; j < n; ++j) {
      float sum = 0.0f;
      for (int64_t k = 0; k < n; ++k) sum += C[j * n + k];
      for (int64_t k = 0; k < n; ++k) C[j * n + k] /= sum + eps;
    }
  };
  normalise_cols();
  for (int64_t it = 1; it < iters; ++it) {
    normalise_rows();
    normalise_cols();
  }
}

// 1 / sqrt(mean(v²) + eps) over the flattened hc·D streams of one token.
float stream_rms_inv(const float* v, int64_t count, double eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < count; ++i) sum += double(v[i]) * v[i];
  return float(1.0 / std::sqrt(sum / double(count) + eps));
}

}  // namespace

void CpuOps::hc_pre(const float* X, const HcWeights& w, int64_t n, float* x, float* post, float* comb) {
  const int64_t hc = config_.hc_mult, D = config_.dim, mix = (2 + hc) * hc;
  std::vector<float>& m = scratch(0, size_t(n * mix));
  linear_f32(X, hc * D, w.fn, n, m.data(), mix);
  const float eps = float(config_.hc_eps);
#pragma omp parallel for schedule(static) if (n > 8)
  for (int64_t t = 0; t < n; ++t) {
    const float* Xt = X + t * hc * D;
    float* mt = m.data() + t * mix;
    const float rinv = stream_rms_inv(Xt, hc * D, config_.norm_eps);
    for (int64_t i = 0; i < mix; ++i) mt[i] *= rinv;
    float pre[16];
    for (int64_t j = 0; j < hc; ++j) {
      pre[j] = sigmoid(mt[j] * w.scale[0] + w.base[size_t(j)]) + eps;
      post[t * hc + j] = 2.0f * sigmoid(mt[hc + j] * w.scale[1] + w.base[size_t(hc + j)]);
    }
    float* C = comb + t * hc * hc;
    for (int64_t i = 0; i < hc * hc; ++i) C[i] = mt[2 * hc + i] * w.scale[2] + w.base[size_t(2 * hc + i)];
    sinkhorn(C, hc, config_.hc_sinkhorn_iters, eps);
    float* xt = x + t * D;
    for (int64_t d = 0; d < D; ++d) {
      float acc = 0.0f;
      for (int64_t j = 0; j < hc; ++j) acc += pre[j] * Xt[j * D + d];
      xt[d] = fast() ? round_bf16(acc) : acc;
    }
  }
}

// X'[k] = post[k] · f + Σ_j C[j][k] · X[j]   (C applied transposed: j = source, k = destination stream)
void CpuOps::hc_post(const float* f, const float* post, const float* comb, int64_t n, float* X) {
  const int64_t hc = config_.hc_mult, D = config_.dim;
#pragma omp parallel for schedule(static) if (n > 8)
  for (int64_t t = 0; t < n; ++t) {
    float* Xt = X + t * hc * D;
    const float* C = comb + t * hc * hc;
    const float* ft = f + t * D;
    float mixed[16];
    for (int64_t d = 0; d < D; ++d) {
      // Fast numerics: f is a bf16 sub-block output, or the ranks' fp32 sum of their shares (Ops::linear_partial),
      // rounded here once as one rank's producer rounds it.
      const float fd = fast() ? round_bf16(ft[d]) : ft[d];
      for (int64_t k = 0; k < hc; ++k) {
        float acc = post[t * hc + k] * fd;
        for (int64_t j = 0; j < hc; ++j) acc += C[j * hc + k] * Xt[j * D + d];
        mixed[k] = acc;
      }
      for (int64_t k = 0; k < hc; ++k) Xt[k * D + d] = fast() ? round_bf16(mixed[k]) : mixed[k];
    }
  }
}

void CpuOps::hc_head(const float* X, const HcHeadWeights& w, int64_t n, float* y) {
  const int64_t hc = config_.hc_mult, D = config_.dim;
  std::vector<float>& m = scratch(0, size_t(n * hc));
  linear_f32(X, hc * D, w.fn, n, m.data(), hc);
  const float eps = float(config_.hc_eps);
#pragma omp parallel for schedule(static) if (n > 8)
  for (int64_t t = 0; t < n; ++t) {
    const float* Xt = X + t * hc * D;
    const float rinv = stream_rms_inv(Xt, hc * D, config_.norm_eps);
    float pre[16];
    for (int64_t j = 0; j < hc; ++j) pre[j] = sigmoid(m[size_t(t * hc + j)] * rinv * w.scale[0] + w.base[size_t(j)]) + eps;
    for (int64_t d = 0; d < D; ++d) {
      float acc = 0.0f;
      for (int64_t j = 0; j < hc; ++j) acc += pre[j] * Xt[j * D + d];
      y[t * D + d] = fast() ? round_bf16(acc) : acc;
    }
  }
}

}  // namespace dsv4
