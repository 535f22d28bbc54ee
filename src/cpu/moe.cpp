// moe family, CPU reference: sqrt-softplus router (hash or bias-adjusted top-k), experts grouped so each
// expert's weights are decoded once per step, clipped SwiGLU, and the shared expert (spec §9). Fast numerics
// (fast-numerics.md §2.4): bf16 expert GEMM outputs widened to fp32 for SwiGLU and the routing weight, a bf16
// hidden row into w2, an fp32 combine in ascending expert id then the shared expert, one bf16 rounding.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/dtype.h"
#include "cpu/cpu_ops.h"

namespace dsv4 {

namespace {

float softplus(float z) { return z > 20.0f ? z : std::log1p(std::exp(z)); }  // PyTorch's threshold

}  // namespace

void CpuOps::moe(const MoeWeights& w, const float* x, const int32_t* tokens, int64_t n, float* out) {
  moe_rounded(w, x, tokens, n, out, true);
}

void CpuOps::moe_partial(const MoeWeights& w, const float* x, const int32_t* tokens, int64_t n, float* out) {
  moe_rounded(w, x, tokens, n, out, false);
}

void CpuOps::moe_rounded(const MoeWeights& w, const float* x, const int32_t* tokens, int64_t n, float* out,
                         bool round_sum) {
  const int64_t D = config_.dim, I = config_.moe_inter_dim, E = config_.n_routed_experts;
  const int64_t k = config_.n_experts_per_tok;
  const float limit = float(config_.swiglu_limit);

  // Router: scores s = sqrt(softplus(gate · x)); the bias only affects which experts are chosen.
  std::vector<float>& logits = scratch(3, size_t(n * E));
  linear_f32(x, D, w.gate, n, logits.data(), E);  // the router is fp32 in every numerics
  // expert → (token, weight); thread_local keeps steady-state decode free of allocations.
  thread_local std::vector<std::vector<std::pair<int64_t, float>>> routed;
  thread_local std::vector<int32_t> order;
  routed.resize(size_t(E));
  for (auto& r : routed) r.clear();
  order.resize(size_t(E));
  for (int64_t t = 0; t < n; ++t) {
    float* s = logits.data() + t * E;
    for (int64_t e = 0; e < E; ++e) s[e] = std::sqrt(softplus(s[e]));
    const int32_t* chosen;
    if (!w.tid2eid.empty()) {
      chosen = w.tid2eid.data() + int64_t(tokens[t]) * k;
    } else {
      std::iota(order.begin(), order.end(), 0);
      const auto biased = [&](int32_t e) { return s[e] + w.gate_bias[size_t(e)]; };
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        return biased(a) > biased(b) || (biased(a) == biased(b) && a < b);
      });
      chosen = order.data();
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += s[chosen[j]];
    for (int64_t j = 0; j < k; ++j) {
      const float weight = s[chosen[j]] / sum;
      routed[size_t(chosen[j])].push_back({t, weight * float(config_.routed_scaling_factor)});
    }
  }

  std::fill(out, out + n * D, 0.0f);
  // An expert serves at most n·k rows: a hash table row may name the same expert more than once.
  const int64_t max_rows = n * k;
  std::vector<float>& xs = scratch(4, size_t(max_rows * D));
  std::vector<float>& gate = scratch(5, size_t(max_rows * I));
  std::vector<float>& up = scratch(6, size_t(max_rows * I));
  std::vector<float>& down = scratch(7, size_t(max_rows * D));
  // y = w2 · (silu(min(g, L)) · clamp(u, −L, L) · weight), weight applied before the down projection.
  const auto run_expert = [&](const ExpertWeights& ew, const std::vector<std::pair<int64_t, float>>& rows) {
    const int64_t m = int64_t(rows.size());
    if (m == 0 || ew.w1.empty()) return;  // empty: another rank's expert (model/parallel.h)
    for (int64_t r = 0; r < m; ++r) std::copy(x + rows[r].first * D, x + (rows[r].first + 1) * D, xs.data() + r * D);
    linear(xs.data(), D, ew.w1, m, gate.data(), I);
    linear(xs.data(), D, ew.w3, m, up.data(), I);
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t i = 0; i < I; ++i) {
        float g = gate[size_t(r * I + i)], u = up[size_t(r * I + i)];
        if (limit > 0.0f) {
          g = std::min(g, limit);
          u = std::clamp(u, -limit, limit);
        }
        gate[size_t(r * I + i)] = g / (1.0f + std::exp(-g)) * u * rows[r].second;
      }
    }
    if (fast()) round_bf16(gate.data(), size_t(m * I));  // x.to(dtype) before w2
    linear(gate.data(), I, ew.w2, m, down.data(), D);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t d = 0; d < D; ++d) out[rows[r].first * D + d] += down[size_t(r * D + d)];
  };
  for (int64_t e = 0; e < E; ++e) run_expert(w.experts[size_t(e)], routed[size_t(e)]);
  thread_local std::vector<std::pair<int64_t, float>> all;
  all.resize(size_t(n));
  for (int64_t t = 0; t < n; ++t) all[size_t(t)] = {t, 1.0f};
  run_expert(w.shared, all);
  if (fast() && round_sum) round_bf16(out, size_t(n * D));  // the fp32 combine, then one bf16 rounding
}

}  // namespace dsv4
