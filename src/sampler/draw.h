// The arithmetic of a sampled draw, shared by the CPU sampler (sampler.cpp) and the GPU's (cuda/sampling) so that
// both pick the same token from the same logits row, seed and step:
//   - a token's softmax weight w = e^((l − max) · (1 / T)) comes from exp_nonpositive below, built from single
//     correctly rounded float operations (no libm, no fused multiply-add), which give the same bits on both;
//   - weights become integers, units of 2^-40 (truncated), so every sum is exact and independent of the order in
//     which a CPU loop or a GPU reduction adds them; weights under 2^-40 (a logit more than 27.7·T below the
//     maximum: probability < 10^-12 each) are never drawn;
//   - the random number is Philox4x32-10 (Salmon et al., SC'11) of (step, seed): counter-based, so a step's draw
//     needs no generator state and the GPU makes it anywhere.
#pragma once

#include <bit>
#include <cstdint>

#if defined(__CUDACC__)
#define DSV4_DRAW_FN __host__ __device__ __forceinline__
#else
#define DSV4_DRAW_FN inline
#endif

namespace dsv4::draw {

// Exact products and sums on the device too: nvcc would otherwise fuse a multiply and an add into one fma,
// whose single rounding differs from the host's two.
DSV4_DRAW_FN float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
DSV4_DRAW_FN float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

constexpr float kCutoff = -27.7f;  // e^-27.7 < 2^-40: below it a weight is 0 units

// Temperatures below this draw greedily (as vLLM's): 1 / T must stay finite and the top token's weight 1.
constexpr float kGreedyBelow = 1e-5f;

// e^x for kCutoff ≤ x ≤ 0: 2^k · e^r with k = round(x / ln 2) and r = x − k·ln 2, the product k·ln 2 in two
// parts (Cody–Waite: ln2_hi has 16 significant bits, so k·ln2_hi is exact for |k| ≤ 40), e^r (|r| ≤ 0.35) by
// its Taylor series to r^7 (relative error < 2·10^-7). e^0 is exactly 1.
DSV4_DRAW_FN float exp_nonpositive(float x) {
  if (!(x >= kCutoff)) return 0.0f;  // also NaN and -inf
  const float k = float(int(add(mul(x, 1.44269504f), -0.5f)));  // truncation of a negative: k = ⌈x/ln 2 − ½⌉
  const float r = add(add(x, mul(k, -0.693145752f)), mul(k, -1.42860677e-6f));
  float p = 1.0f / 5040.0f;
  p = add(mul(p, r), 1.0f / 720.0f);
  p = add(mul(p, r), 1.0f / 120.0f);
  p = add(mul(p, r), 1.0f / 24.0f);
  p = add(mul(p, r), 1.0f / 6.0f);
  p = add(mul(p, r), 0.5f);
  p = add(mul(p, r), 1.0f);
  p = add(mul(p, r), 1.0f);
  // 2^k (-40 ≤ k ≤ 0) written as a float's exponent field: exact, no ldexp.
  const uint32_t bits = uint32_t(int(k) + 127) << 23;
#if defined(__CUDA_ARCH__)
  return mul(p, __uint_as_float(bits));
#else
  return mul(p, std::bit_cast<float>(bits));
#endif
}

// The weight of logit l in a row whose largest logit is `max`, at temperature T = 1 / inv_T (1 for the largest).
// The reciprocal once per row (inverse()), a product per token: a division per token was a fifth of the GPU's
// instructions.
DSV4_DRAW_FN float inverse(float T) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(1.0f, T);
#else
  return 1.0f / T;
#endif
}
DSV4_DRAW_FN float weight(float l, float max, float inv_T) {
#if defined(__CUDA_ARCH__)
  return exp_nonpositive(__fmul_rn(__fsub_rn(l, max), inv_T));
#else
  return exp_nonpositive((l - max) * inv_T);
#endif
}

// A weight in units of 2^-40 (the top token: 2^40). A row of up to 2^23 tokens sums below 2^64.
DSV4_DRAW_FN uint64_t units(float w) { return uint64_t(mul(w, 0x1p40f)); }

// The nucleus: a token is kept while the mass ranked before it is below this share of the candidates' mass Z
// (at least 1, so that the first token always is).
DSV4_DRAW_FN uint64_t nucleus_threshold(float top_p, uint64_t Z) {
  const uint64_t t = uint64_t(double(top_p) * double(Z));
  return t > 0 ? t : 1;
}

DSV4_DRAW_FN uint32_t mulhi32(uint32_t a, uint32_t b) { return uint32_t((uint64_t(a) * b) >> 32); }

// Philox4x32-10: the first two words of the block for counter (c0, c1, 0, 0) under key (k0, k1), as one u64.
DSV4_DRAW_FN uint64_t philox(uint32_t c0, uint32_t c1, uint32_t k0, uint32_t k1) {
  uint32_t c2 = 0, c3 = 0;
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = mulhi32(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = mulhi32(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return (uint64_t(c0) << 32) | c1;
}

// The order in which a draw walks the kept tokens: lane by lane, the ids ≡ 0 (mod kLanes) ascending, then
// ≡ 1, ... — the GPU kernel's thread-major order (thread t of kLanes holds ids t, t + kLanes, ...), so that
// its threads sum their own tokens and one scan over the threads finds the drawn one.
constexpr int64_t kLanes = 1024;

// The draw of step `step` under `seed`: a point in [0, total) of the kept tokens' mass (total ≥ 1), by the
// high half of a 64 × 64-bit product (uniform up to 2^-64 · total).
DSV4_DRAW_FN uint64_t target(uint64_t seed, uint64_t step, uint64_t total) {
  const uint64_t r = philox(uint32_t(step), uint32_t(step >> 32), uint32_t(seed), uint32_t(seed >> 32));
#if defined(__CUDA_ARCH__)
  return __umul64hi(r, total);
#else
  return uint64_t((unsigned __int128)r * total >> 64);
#endif
}

}  // namespace dsv4::draw
