// sampling (CUDA): one block per row of logits, every step a few block-wide passes over the row (L2-resident
// after the first):
//   1. max and argmax (lowest id among equal maxima): the greedy answer, and the softmax shift;
//   2. top-k: radix select (4 passes of 8 bits over an order-preserving key) of the k-th token in the CPU
//      sampler's rank order (logit descending, id ascending), ties on the boundary logit resolved by id;
//   3. top-p: the same radix select, but over the running softmax mass (fp64 bucket sums) up to top_p · Z_k,
//      Z_k the mass of the top-k;
//   4. min-p: a weight threshold, w = exp((l − max)/T) ≥ min_p (the top token has w = 1);
//   5. the draw: Gumbel-max over the kept tokens, argmax of (l − max)/T − log(−log u) with u from Philox4x32-10
//      keyed by the row's seed at counter (token id, offset) — an exact draw from the renormalised kept
//      distribution with no prefix sum over the vocabulary.
// The three filters each select a prefix of the rank order, so the kept set is the intersection of those
// prefixes, exactly as the CPU's sort-then-truncate computes it.
#include "cuda/sampling/sampling.h"

#include <cmath>
#include <cstdint>

#include "cuda/common/check.h"

namespace dsv4::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBuckets = 256;  // one radix digit of 8 bits
constexpr unsigned kFull = 0xffffffffu;

// Rank key: the logit's order-preserving bit pattern, complemented so that a smaller key ranks first.
__device__ __forceinline__ uint32_t rank_key(float logit) {
  const uint32_t u = __float_as_uint(logit);
  return ~((u & 0x80000000u) ? ~u : (u | 0x80000000u));
}

__device__ __forceinline__ float logit_of_key(uint32_t key) {
  const uint32_t ascending = ~key;
  return __uint_as_float((ascending & 0x80000000u) ? (ascending & 0x7fffffffu) : ~ascending);
}

// Unnormalised softmax weight at temperature T (the top token has weight 1).
__device__ __forceinline__ float weight(float logit, float max_logit, float T) { return expf((logit - max_logit) / T); }

// Tokens ranked at or before the bound: key < bound.key, or key == bound.key and id ≤ bound.id.
struct RankBound {
  uint32_t key;
  int64_t id;
};
constexpr RankBound kEverything{0xffffffffu, INT64_MAX};

__device__ __forceinline__ bool within(const RankBound& b, uint32_t key, int64_t id) {
  return key < b.key || (key == b.key && id <= b.id);
}

struct Shared {
  unsigned count[kBuckets];
  double mass[kBuckets];
  double warp_sum[kWarps];
  float warp_best[kWarps];
  int64_t warp_best_id[kWarps];
  unsigned warp_hits[kWarps];
  uint32_t prefix;
  double before;
  unsigned tied;
  int64_t found_id;
};

// (value, id) ordering of the argmax: larger value, then lower id; id < 0 marks "nothing yet".
__device__ __forceinline__ bool better(float v, int64_t id, float best, int64_t best_id) {
  return best_id < 0 || (id >= 0 && (v > best || (v == best && id < best_id)));
}

// Block-wide argmax; every thread gets the result.
__device__ void block_argmax(float& v, int64_t& id, Shared& sm) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int offset = 16; offset > 0; offset /= 2) {
    const float ov = __shfl_xor_sync(kFull, v, offset);
    const int64_t oid = __shfl_xor_sync(kFull, id, offset);
    if (better(ov, oid, v, id)) v = ov, id = oid;
  }
  if (lane == 0) sm.warp_best[warp] = v, sm.warp_best_id[warp] = id;
  __syncthreads();
  v = sm.warp_best[0];
  id = sm.warp_best_id[0];
  for (int w = 1; w < kWarps; ++w)
    if (better(sm.warp_best[w], sm.warp_best_id[w], v, id)) v = sm.warp_best[w], id = sm.warp_best_id[w];
  __syncthreads();
}

__device__ double block_sum(double v, Shared& sm) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFull, v, offset);
  if (lane == 0) sm.warp_sum[warp] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < kWarps; ++w) total += sm.warp_sum[w];
  __syncthreads();
  return total;
}

// Id of the need-th token (1-based, in id order) whose rank key is `key`.
__device__ int64_t nth_with_key(const float* logits, int64_t V, uint32_t key, int64_t need, Shared& sm) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int64_t seen = 0;
  for (int64_t base = 0; base < V; base += kThreads) {
    const int64_t i = base + threadIdx.x;
    const bool hit = i < V && rank_key(logits[i]) == key;
    const unsigned hits = __ballot_sync(kFull, hit);
    if (lane == 0) sm.warp_hits[warp] = __popc(hits);
    __syncthreads();
    int64_t rank = seen, tile = 0;
    for (int w = 0; w < kWarps; ++w) {
      if (w < warp) rank += sm.warp_hits[w];
      tile += sm.warp_hits[w];
    }
    rank += __popc(hits & ((1u << lane) - 1)) + 1;
    if (hit && rank == need) sm.found_id = i;
    __syncthreads();
    seen += tile;
    if (seen >= need) break;
  }
  return sm.found_id;
}

// The rank bound at which the running total over tokens in rank order first reaches `target`: the total counts
// tokens (kByMass false) or sums their weights (kByMass true).
template <bool kByMass>
__device__ RankBound select_bound(const float* logits, int64_t V, float max_logit, float T, double target,
                                  Shared& sm) {
  const int lane = threadIdx.x % 32;
  uint32_t prefix = 0, mask = 0;
  double before = 0.0;  // total of the tokens ranked before every token that matches `prefix`
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kBuckets; b += kThreads) sm.count[b] = 0, sm.mass[b] = 0.0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      const float l = logits[i];
      const uint32_t k = rank_key(l);
      if ((k & mask) == prefix) {
        const unsigned d = (k >> shift) & 0xffu;
        atomicAdd(&sm.count[d], 1u);
        if (kByMass) atomicAdd(&sm.mass[d], double(weight(l, max_logit, T)));
      }
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane L owns buckets 8L .. 8L+7; an inclusive scan of the lane totals finds the lane where the running
      // total reaches the target (fp64 round-off may leave it just short: then the last non-empty bucket).
      constexpr int kPerLane = kBuckets / 32;
      const auto total_of = [&](int b) { return kByMass ? sm.mass[b] : double(sm.count[b]); };
      double mine = 0.0;
      for (int b = lane * kPerLane; b < (lane + 1) * kPerLane; ++b) mine += total_of(b);
      double inclusive = mine;
      for (int offset = 1; offset < 32; offset *= 2) {
        const double up = __shfl_up_sync(kFull, inclusive, offset);
        if (lane >= offset) inclusive += up;
      }
      const unsigned reached = __ballot_sync(kFull, before + inclusive >= target);
      const unsigned nonempty = __ballot_sync(kFull, mine > 0.0);
      const int owner = reached ? __ffs(reached) - 1 : 31 - __clz(nonempty);
      if (lane == owner) {
        double run = before + inclusive - mine;
        int chosen = lane * kPerLane;
        double chosen_before = run;
        for (int b = lane * kPerLane; b < (lane + 1) * kPerLane; ++b) {
          const double v = total_of(b);
          if (v > 0.0) chosen = b, chosen_before = run;
          if (reached && run + v >= target) break;
          run += v;
        }
        sm.prefix = prefix | (uint32_t(chosen) << shift);
        sm.before = chosen_before;
        sm.tied = sm.count[chosen];
      }
    }
    __syncthreads();
    prefix = sm.prefix;
    before = sm.before;
    mask |= 0xffu << shift;
  }
  // `prefix` is now the boundary token's exact key; the `tied` tokens sharing it are ranked by id, each adding
  // the same amount to the running total.
  const double step = kByMass ? double(weight(logit_of_key(prefix), max_logit, T)) : 1.0;
  const double need = ceil((target - before) / step);
  const int64_t tied = sm.tied;
  if (!(need < double(tied))) return {prefix, INT64_MAX};
  return {prefix, nth_with_key(logits, V, prefix, need < 1.0 ? 1 : int64_t(need), sm)};
}

// Philox4x32-10 (Salmon et al., SC'11): the first output word for counter (c0, c1, c2, c3) under key (k0, k1).
__device__ __forceinline__ uint32_t philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                           uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c0;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(SampleParams p) {
  __shared__ Shared sm;
  const int64_t row = blockIdx.x, V = p.vocab;
  const float* logits = p.logits + row * p.ld;

  float max_logit = -INFINITY;
  int64_t best = -1;
  for (int64_t i = threadIdx.x; i < V; i += kThreads)
    if (better(logits[i], i, max_logit, best)) max_logit = logits[i], best = i;
  block_argmax(max_logit, best, sm);
  if (p.temperature == 0.0f) {
    if (threadIdx.x == 0) p.tokens[row] = int32_t(best);
    return;
  }
  const float T = p.temperature;

  RankBound top_k = kEverything, top_p = kEverything;
  if (p.top_k > 0 && p.top_k < V) top_k = select_bound<false>(logits, V, max_logit, T, double(p.top_k), sm);
  if (p.top_p < 1.0f) {
    double mass = 0.0;
    for (int64_t i = threadIdx.x; i < V; i += kThreads)
      if (within(top_k, rank_key(logits[i]), i)) mass += weight(logits[i], max_logit, T);
    const double target = double(p.top_p) * block_sum(mass, sm);
    top_p = select_bound<true>(logits, V, max_logit, T, target, sm);
  }

  // Gumbel-max over the kept tokens; the top token always qualifies (weight 1 ≥ min_p).
  const uint64_t seed = p.seeds[row];
  float best_score = -INFINITY;
  int64_t pick = -1;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float l = logits[i];
    const uint32_t key = rank_key(l);
    if (!within(top_k, key, i) || !within(top_p, key, i)) continue;
    if (p.min_p > 0.0f && weight(l, max_logit, T) < p.min_p) continue;
    const uint32_t bits = philox(uint32_t(i), uint32_t(uint64_t(i) >> 32), uint32_t(p.offset),
                                 uint32_t(p.offset >> 32), uint32_t(seed), uint32_t(seed >> 32));
    const float u = (float(bits >> 8) + 0.5f) * 0x1p-24f;  // in (0, 1): both logs stay finite
    const float score = (l - max_logit) / T - logf(-logf(u));
    if (better(score, i, best_score, pick)) best_score = score, pick = i;
  }
  block_argmax(best_score, pick, sm);
  if (threadIdx.x == 0) p.tokens[row] = int32_t(pick);
}

}  // namespace

void sample_tokens(const SampleParams& p, cudaStream_t stream) {
  DSV4_CHECK(p.rows >= 0 && p.rows <= int64_t(INT32_MAX), "sample_tokens: rows ", p.rows, " out of range");
  DSV4_CHECK(p.vocab >= 1 && p.vocab <= int64_t(INT32_MAX), "sample_tokens: vocab ", p.vocab, " out of range");
  DSV4_CHECK(p.ld == 0 || p.ld >= p.vocab, "sample_tokens: row stride ", p.ld, " shorter than the vocabulary ",
             p.vocab);
  DSV4_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.0f, "sample_tokens: temperature must be >= 0, got ",
             p.temperature);
  DSV4_CHECK(p.top_k >= 0, "sample_tokens: top_k must be >= 0, got ", p.top_k);
  DSV4_CHECK(p.top_p > 0.0f && p.top_p <= 1.0f, "sample_tokens: top_p must be in (0, 1], got ", p.top_p);
  DSV4_CHECK(p.min_p >= 0.0f && p.min_p <= 1.0f, "sample_tokens: min_p must be in [0, 1], got ", p.min_p);
  DSV4_CHECK(p.logits && p.tokens, "sample_tokens: logits and tokens are required");
  DSV4_CHECK(p.temperature == 0.0f || p.seeds, "sample_tokens: per-row seeds are required unless greedy");
  if (p.rows == 0) return;
  sample_kernel<<<unsigned(p.rows), kThreads, 0, stream>>>(p);
  DSV4_LAUNCH_CHECK();
}

}  // namespace dsv4::cuda
