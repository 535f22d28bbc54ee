// attention family, CPU reference: the KV compressor (spec §7), the lightning indexer (§8) and the
// sink softmax over window + compressed keys (§6.3–6.4).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <numeric>

#include "core/dtype.h"
#include "core/error.h"
#include "cpu/cpu_ops.h"

namespace dsv4 {

void CpuOps::compressor(std::span<const CompressorParams> batch) {
  for (const CompressorParams& p : batch) compressor(p);
}

void CpuOps::indexer_topk(std::span<const IndexerParams> batch) {
  for (const IndexerParams& p : batch) indexer_topk(p);
}

void CpuOps::attention(std::span<const AttentionParams> batch) {
  for (const AttentionParams& p : batch) attention(p);
}

void CpuOps::compressor(const CompressorParams& p) {
  const CompressorWeights& w = *p.weights;
  CompressorState& s = *p.state;
  const float* x = p.x;
  const int64_t pos0 = p.pos0, n = p.n;
  const EntrySim sim = p.sim;
  const int64_t m = w.ratio, c = w.width, width = (w.overlap ? 2 : 1) * c, D = config_.dim;
  std::vector<float>& kv = scratch(1, size_t(n * width));
  std::vector<float>& gate = scratch(2, size_t(n * width));
  linear_f32(x, D, w.wkv, n, kv.data(), width);  // fp32 projections and state in every numerics
  linear_f32(x, D, w.wgate, n, gate.data(), width);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = pos0 + i;
    const float* ape = w.ape.data() + (pos % m) * width;
    // Overlap: rows 0..m−1 hold the previous window, rows m..2m−1 the current one.
    const int64_t slot = (w.overlap ? m : 0) + pos % m;
    for (int64_t ch = 0; ch < width; ++ch) {
      s.kv[slot * width + ch] = kv[size_t(i * width + ch)];
      s.score[slot * width + ch] = gate[size_t(i * width + ch)] + ape[ch];
    }
    if ((pos + 1) % m != 0) continue;

    // Window w = pos / m is complete: softmax over positions, independently per channel.
    const int64_t entry = pos / m;
    float* out = s.entries + entry * c;
    for (int64_t ch = 0; ch < c; ++ch) {
      // Candidate k is state row k. Overlap: rows 0..m−1 (previous window) contribute their A-half
      // (columns [0, c)), rows m..2m−1 (current window) their B-half (columns [c, 2c)).
      const int64_t n_cand = w.overlap ? 2 * m : m;
      const auto cell = [&](int64_t k) { return k * width + ((w.overlap && k >= m) ? c + ch : ch); };
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t k = 0; k < n_cand; ++k) mx = std::max(mx, s.score[cell(k)]);
      float denom = 0.0f, num = 0.0f;
      for (int64_t k = 0; k < n_cand; ++k) {
        const float e = std::exp(s.score[cell(k)] - mx);
        denom += e;
        num += e * s.kv[cell(k)];
      }
      out[ch] = num / denom;
    }
    if (fast()) round_bf16(out, size_t(c));  // the pooled row becomes bf16 before its norm
    if (w.overlap) {  // the current window becomes the previous one
      std::copy(s.kv + m * width, s.kv + 2 * m * width, s.kv);
      std::copy(s.score + m * width, s.score + 2 * m * width, s.score);
    }
    rms_norm(out, &w.norm, 1, c, out);
    // RoPE at the window's FIRST token position.
    rope(out, 1, c, c - config_.rope_dim, 1, entry * m, 0, RopeKind::kCompressed, false);
    if (sim == EntrySim::kFp8NoPe) sim_fp8(out, 1, c, c - config_.rope_dim, 64);
    if (sim == EntrySim::kHadamardFp4) hadamard_sim_fp4(out, 1, c);
  }
}

void CpuOps::indexer_topk(const IndexerParams& p) {
#pragma omp parallel for schedule(dynamic) if (p.n > 1)
  for (int64_t i = 0; i < p.n; ++i) {
    const int64_t t = p.pos0 + i, visible = (t + 1) / p.ratio;
    const int64_t k = std::min(p.top_k, visible);
    // NOTE: thread_local scratch keeps steady-state decode free of allocations.
    thread_local std::vector<float> score;
    thread_local std::vector<int32_t> order;
    score.resize(size_t(visible));
    const float* q = p.q + i * p.heads * p.head_dim;
    const float* w = p.weights + i * p.heads;
    for (int64_t e = 0; e < visible; ++e) {
      const float* key = p.keys + e * p.head_dim;
      float total = 0.0f;
      for (int64_t h = 0; h < p.heads; ++h) {
        float d = 0.0f;
        for (int64_t j = 0; j < p.head_dim; ++j) d += q[h * p.head_dim + j] * key[j];
        if (fast())  // bf16 einsum, bf16 product with the weight (fast-numerics.md §2.3)
          total += round_bf16(w[h] * std::max(round_bf16(d), 0.0f));
        else
          total += w[h] * std::max(d, 0.0f);
      }
      score[size_t(e)] = fast() ? round_bf16(total) : total;  // fast: the head sum is a bf16 tensor
    }
    order.resize(size_t(visible));
    std::iota(order.begin(), order.end(), 0);
    // Deterministic ties: the lower entry index wins.
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return score[size_t(a)] > score[size_t(b)] || (score[size_t(a)] == score[size_t(b)] && a < b);
    });
    int32_t* sel = p.selected + i * p.top_k;
    for (int64_t j = 0; j < p.top_k; ++j) sel[j] = j < k ? order[size_t(j)] : -1;
  }
}

namespace {

// One head of sparse_attn_kernel (fast-numerics.md §2.3): bf16 q and keys, fp32 scores × scale, the softmax
// relative to the keys' maximum (the sink excluded), P rounded to bf16 for P·V while the denominator sums the
// fp32 P, the sink in the denominator only, a bf16 output. out [d] starts at zero; a null key is a masked slot.
//
// NOTE: where P is rounded. DeepSeek's kernel rounds P = e^(s − m) against its running maximum m, an artifact of
// its own partition of the keys (§4.6). Here, and in both CUDA kernels, the softmax runs in base-2 units
// (u = s · log2 e) and P = 2^(u − M) is rounded against M = ⌈max u⌉, an integer: bf16 rounding commutes with
// scaling by powers of two, so a backend whose running maximum is any integer when it meets a key rounds the
// same value, and rescaling by 2^(M_old − M_new) is exact. The rounding error per value is DeepSeek's; the
// values rounded do not depend on how a backend tiles or splits the keys (up to the fp32 rounding of u − M and
// of exp2 at another integer M: a last-bit difference that flips a P's rounding now and then).
void attend_fast(const float* q, const std::vector<const float*>& keys, float scale, float sink, int64_t d,
                 float* logit, float* out) {
  const float inf = std::numeric_limits<float>::infinity();
  const float log2e = std::numbers::log2e_v<float>;
  float mx = -inf;
  for (size_t j = 0; j < keys.size(); ++j) {
    float dot = 0.0f;
    if (keys[j])
      for (int64_t c = 0; c < d; ++c) dot += q[c] * keys[j][c];
    logit[j] = keys[j] ? dot * scale * log2e : -inf;
    mx = std::max(mx, logit[j]);
  }
  const float M = mx == -inf ? 0.0f : std::ceil(mx);
  float denom = 0.0f;
  for (size_t j = 0; j < keys.size(); ++j) {
    if (!keys[j]) continue;
    const float e = std::exp2(logit[j] - M);
    denom += e;
    const float w = round_bf16(e);
    for (int64_t c = 0; c < d; ++c) out[c] += w * keys[j][c];
  }
  denom += std::exp2(sink * log2e - M);
  for (int64_t c = 0; c < d; ++c) out[c] = round_bf16(out[c] / denom);
}

}  // namespace

void CpuOps::attention(const AttentionParams& p) {
  DSV4_CHECK(!p.entries || p.ratio >= 1, "attention: compressed entries need ratio >= 1, got ", p.ratio);
  DSV4_CHECK(!p.out_bf16 || fast(), "attention: a bf16 output outside fast numerics");
  DSV4_CHECK(!p.q_bf16 || (fast() && !p.q), "attention: bf16 query heads outside fast numerics, or beside fp32 ones");
  const int64_t d = p.head_dim;
  thread_local std::vector<float> wide_q;  // bf16 query heads widened (exact)
  if (p.q_bf16) {
    wide_q.resize(size_t(p.n * p.heads * d));
    for (size_t i = 0; i < wide_q.size(); ++i) wide_q[i] = bf16_to_f32(p.q_bf16[i]);
  }
  const float* const q_rows = p.q_bf16 ? wide_q.data() : p.q;
  // A bf16 output is computed in fp32 here first, then rounded (after the derotation, as the GPU rounds it).
  thread_local std::vector<float> staged;
  if (p.out_bf16) staged.resize(size_t(p.n * p.heads * d));
  float* const out_f32 = p.out_bf16 ? staged.data() : p.out;
#pragma omp parallel for collapse(2) schedule(static) if (p.n * p.heads > 8)
  for (int64_t i = 0; i < p.n; ++i) {
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t t = p.pos0 + i;
      const float* q = q_rows + (i * p.heads + h) * d;
      thread_local std::vector<const float*> keys;
      thread_local std::vector<float> logit;
      keys.clear();
      for (int64_t s = std::max<int64_t>(0, t - p.window_size + 1); s <= t; ++s)
        keys.push_back(p.window + (s % p.ring_slots) * d);
      if (p.entries && p.selected) {
        for (int64_t j = 0; j < std::min(p.top_k, (t + 1) / p.ratio); ++j) {
          const int32_t e = p.selected[i * p.top_k + j];
          keys.push_back(e >= 0 ? p.entries + int64_t(e) * d : nullptr);  // −1: a masked slot
        }
      } else if (p.entries) {
        for (int64_t e = 0; e < (t + 1) / p.ratio; ++e) keys.push_back(p.entries + e * d);
      }
      logit.resize(keys.size());
      float* out = out_f32 + (i * p.heads + h) * d;
      std::fill(out, out + d, 0.0f);
      if (fast()) {
        attend_fast(q, keys, p.scale, p.sinks[h], d, logit.data(), out);
        continue;
      }
      float mx = p.sinks[h];
      for (size_t j = 0; j < keys.size(); ++j) {
        if (!keys[j]) continue;
        float dot = 0.0f;
        for (int64_t c = 0; c < d; ++c) dot += q[c] * keys[j][c];
        logit[j] = dot * p.scale;
        mx = std::max(mx, logit[j]);
      }
      float denom = std::exp(p.sinks[h] - mx);  // the sink adds mass to the denominator only
      for (size_t j = 0; j < keys.size(); ++j) {
        if (!keys[j]) continue;
        const float e = std::exp(logit[j] - mx);
        denom += e;
        for (int64_t c = 0; c < d; ++c) out[c] += e * keys[j][c];
      }
      for (int64_t c = 0; c < d; ++c) out[c] /= denom;
    }
  }
  if (p.derotate) rope(out_f32, p.n * p.heads, d, d - config_.rope_dim, p.heads, p.pos0, 1, p.rope, /*inverse=*/true);
  if (p.out_bf16)
    for (size_t i = 0; i < staged.size(); ++i) p.out_bf16[i] = f32_to_bf16(staged[i]);
}

}  // namespace dsv4
