// sampling (CUDA): one block per row of logits; each step is a block-wide pass over the row (L2-resident after
// the first) with register accumulation and block reductions:
//   1. max and argmax (lowest id among equal maxima): the greedy answer and the softmax shift;
//   2. top-k: radix select (4 passes of 8 bits over an order-preserving key, warp-aggregated histogram
//      counts) of the k-th token in the CPU sampler's rank order (logit descending, id ascending), ties on the
//      boundary logit resolved by id; then Z_k, the softmax mass of the top-k;
//   3. the draw, by rejection: candidates are the tokens ranked within the current bound that pass min-p
//      (w = exp((l − max)/T) ≥ min_p; w = 1 for the top token); one Philox uniform picks a candidate j by
//      inverse CDF over the candidates in a fixed thread-major order; j is kept when the mass of the top-k
//      tokens ranked before it is below top_p · Z_k (the CPU's nucleus rule), otherwise every token from j on
//      is outside the nucleus too, the bound moves to just before j and the draw repeats. Rejection from the
//      proportional distribution over a superset is an exact draw from the kept set; the same pass that tests
//      j also sums the candidates of the next round, so a round costs one pass.
// The filters each keep a prefix of the rank order, as the CPU's sort-then-truncate does.
#include "cuda/sampling/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda/common/check.h"
#include "cuda/common/launch.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBuckets = 256;  // one radix digit of 8 bits
constexpr int kUnroll = 4;     // loads in flight per thread in a pass over the row
constexpr unsigned kFull = 0xffffffffu;

// Rank key: the logit's order-preserving bit pattern, complemented so that a smaller key ranks first.
__device__ __forceinline__ uint32_t rank_key(float logit) {
  const uint32_t u = __float_as_uint(logit);
  return ~((u & 0x80000000u) ? ~u : (u | 0x80000000u));
}

// Unnormalised softmax weight at temperature T (the top token has weight 1).
__device__ __forceinline__ float weight(float logit, float max_logit, float T) { return expf((logit - max_logit) / T); }

// Tokens ranked at or before the bound: key < bound.key, or key == bound.key and id ≤ bound.id.
struct RankBound {
  uint32_t key;
  int64_t id;
};

__device__ __forceinline__ bool within(const RankBound& b, uint32_t key, int64_t id) {
  return key < b.key || (key == b.key && id <= b.id);
}

// Calls f(logit, id) for the tokens id = begin + threadIdx.x, + Threads, ... below end in increasing order, with
// Unroll loads issued before they are used.
template <int Threads, int Unroll, class F>
__device__ __forceinline__ void for_each_in(const float* logits, int64_t begin, int64_t end, F&& f) {
  for (int64_t base = begin + threadIdx.x; base < end; base += int64_t(Threads) * Unroll) {
    float v[Unroll];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) {
      const int64_t i = base + int64_t(u) * Threads;
      v[u] = i < end ? logits[i] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < Unroll; ++u) {
      const int64_t i = base + int64_t(u) * Threads;
      if (i < end) f(v[u], i);
    }
  }
}

// The whole row, by the sampling kernel's threads.
template <class F>
__device__ __forceinline__ void for_each_token(const float* logits, int64_t V, F&& f) {
  for_each_in<kThreads, kUnroll>(logits, 0, V, f);
}

struct Shared {
  unsigned count[kBuckets];
  double warp_sum[kWarps];
  float warp_best[kWarps];
  int64_t warp_best_id[kWarps];
  unsigned warp_hits[kWarps];
  uint32_t prefix;
  unsigned before, tied;
  int64_t found_id;
  int owner;
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

// Block-wide sum in a fixed order; every thread gets the total.
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

// Exclusive prefix sum over the threads in index order; `total` receives the block total.
__device__ double block_exclusive_scan(double v, double& total, Shared& sm) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  double inclusive = v;
  for (int offset = 1; offset < 32; offset *= 2) {
    const double up = __shfl_up_sync(kFull, inclusive, offset);
    if (lane >= offset) inclusive += up;
  }
  if (lane == 31) sm.warp_sum[warp] = inclusive;
  __syncthreads();
  double before_warp = 0.0;
  total = 0.0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before_warp += sm.warp_sum[w];
    total += sm.warp_sum[w];
  }
  __syncthreads();
  return before_warp + inclusive - v;
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

// Rank bound of the k-th token in rank order (1 ≤ k < V).
__device__ RankBound select_kth(const float* logits, int64_t V, int64_t k, Shared& sm) {
  const int lane = threadIdx.x % 32;
  uint32_t prefix = 0, mask = 0;
  int64_t before = 0;  // tokens ranked before every token that matches `prefix`
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kBuckets; b += kThreads) sm.count[b] = 0;
    __syncthreads();
    for_each_token(logits, V, [&](float l, int64_t) {
      const uint32_t key = rank_key(l);
      const unsigned digit = (key & mask) == prefix ? (key >> shift) & 0xffu : kBuckets;  // kBuckets: no match
      // Logits crowd into few digits (the top byte especially): one atomic per distinct digit per warp.
      const unsigned peers = __match_any_sync(__activemask(), digit);
      if (digit < kBuckets && lane == __ffs(peers) - 1) atomicAdd(&sm.count[digit], unsigned(__popc(peers)));
    });
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane L owns buckets 8L .. 8L+7: an inclusive scan of the lane totals finds where the count reaches k.
      constexpr int kPerLane = kBuckets / 32;
      int64_t mine = 0;
      for (int b = lane * kPerLane; b < (lane + 1) * kPerLane; ++b) mine += sm.count[b];
      int64_t inclusive = mine;
      for (int offset = 1; offset < 32; offset *= 2) {
        const int64_t up = __shfl_up_sync(kFull, inclusive, offset);
        if (lane >= offset) inclusive += up;
      }
      const unsigned reached = __ballot_sync(kFull, before + inclusive >= k);
      if (lane == __ffs(reached) - 1) {
        int64_t run = before + inclusive - mine;
        int b = lane * kPerLane;
        while (run + sm.count[b] < k) run += sm.count[b++];
        sm.prefix = prefix | (uint32_t(b) << shift);
        sm.before = unsigned(run);
        sm.tied = sm.count[b];
      }
    }
    __syncthreads();
    prefix = sm.prefix;
    before = sm.before;
    mask |= 0xffu << shift;
  }
  // `prefix` is the k-th token's exact key; `tied` tokens share it, ranked among themselves by id.
  const int64_t need = k - before, tied = sm.tied;
  if (need >= tied) return {prefix, INT64_MAX};
  return {prefix, nth_with_key(logits, V, prefix, need, sm)};
}

// Philox4x32-10 (Salmon et al., SC'11): the first two output words for counter (c0, c1, c2, c3), key (k0, k1).
__device__ __forceinline__ uint2 philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
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
  return make_uint2(c0, c1);
}

__global__ void __launch_bounds__(kThreads) sample_kernel(SampleParams p) {
  __shared__ Shared sm;
  const int64_t row = blockIdx.x, V = p.vocab;
  const float* logits = p.logits + row * p.ld;

  float max_logit = -INFINITY;
  int64_t best = -1;
  for_each_token(logits, V, [&](float l, int64_t i) {
    if (better(l, i, max_logit, best)) max_logit = l, best = i;
  });
  block_argmax(max_logit, best, sm);
  if (p.temperature == 0.0f) {
    if (threadIdx.x == 0) p.tokens[row] = int32_t(best);
    return;
  }
  const float T = p.temperature;

  const RankBound top_k = p.top_k > 0 && p.top_k < V ? select_kth(logits, V, p.top_k, sm)
                                                     : RankBound{0xffffffffu, INT64_MAX};
  double nucleus = INFINITY;  // top_p · Z_k: a token is in the nucleus when the top-k mass ranked before it is below
  if (p.top_p < 1.0f) {
    double z = 0.0;
    for_each_token(logits, V, [&](float l, int64_t i) {
      if (within(top_k, rank_key(l), i)) z += weight(l, max_logit, T);
    });
    nucleus = double(p.top_p) * block_sum(z, sm);
  }
  const auto candidate = [&](const RankBound& bound, float l, int64_t i) {
    return within(bound, rank_key(l), i) && (p.min_p == 0.0f || weight(l, max_logit, T) >= p.min_p);
  };

  // Each thread's candidate mass, summed in its own token order (the inverse CDF walks the same order).
  RankBound bound = top_k;
  float mine = 0.0f;
  for_each_token(logits, V, [&](float l, int64_t i) {
    if (candidate(bound, l, i)) mine += weight(l, max_logit, T);
  });
  const uint64_t seed = p.seeds[row];
  for (uint32_t round = 0;; ++round) {
    double total;
    const double before_me = block_exclusive_scan(mine, total, sm);
    const uint2 bits = philox(round, 0, uint32_t(p.offset), uint32_t(p.offset >> 32), uint32_t(seed),
                              uint32_t(seed >> 32));
    const double target = double((uint64_t(bits.x) << 21) ^ (bits.y >> 11)) * 0x1p-53 * total;  // in [0, total)
    // The owner is the thread whose interval [before_me, before_me + mine) holds the target; rounding can leave
    // the target past every interval: then the last thread with candidates.
    if (threadIdx.x == 0) sm.owner = -1;
    __syncthreads();
    if (mine > 0.0f && target >= before_me && (target < before_me + mine || before_me + mine >= total))
      atomicMax(&sm.owner, int(threadIdx.x));
    __syncthreads();
    if (int(threadIdx.x) == sm.owner) {
      double run = before_me;
      int64_t pick = -1;
      for_each_token(logits, V, [&](float l, int64_t i) {
        if (run > target || !candidate(bound, l, i)) return;
        pick = i;
        run += weight(l, max_logit, T);
      });
      sm.found_id = pick;
    }
    __syncthreads();
    const int64_t j = sm.found_id;
    const float lj = logits[j];
    const uint32_t kj = rank_key(lj);
    if (nucleus == INFINITY) {
      if (threadIdx.x == 0) p.tokens[row] = int32_t(j);
      return;
    }
    // One pass: the top-k mass ranked before j (the nucleus test) and the candidate mass before j (the next
    // round's candidates, should j be rejected).
    const RankBound before_j{kj, j - 1};
    double ranked_before = 0.0;
    mine = 0.0f;
    for_each_token(logits, V, [&](float l, int64_t i) {
      const uint32_t key = rank_key(l);
      if (!within(before_j, key, i) || !within(top_k, key, i)) return;
      const float w = weight(l, max_logit, T);
      ranked_before += w;
      if (p.min_p == 0.0f || w >= p.min_p) mine += w;
    });
    if (block_sum(ranked_before, sm) < nucleus) {
      if (threadIdx.x == 0) p.tokens[row] = int32_t(j);
      return;
    }
    bound = before_j;
  }
}

constexpr int kGreedyThreads = 256;
constexpr int kGreedyUnroll = 8;  // loads in flight per thread: a block's round covers 2048 logits
constexpr int kGreedyMaxSlices = 128;

// grid (slices, rows), kGreedyThreads threads. Block (s, r) takes logits [s·per, (s+1)·per) of row r.
__global__ void __launch_bounds__(kGreedyThreads) greedy_kernel(GreedyParams p) {
  __shared__ float best_s[kGreedyThreads / 32];
  __shared__ int best_id_s[kGreedyThreads / 32];
  __shared__ bool last_s;
  cuda::pdl_wait();  // the logits come from the previous kernel
  const int64_t row = blockIdx.y, slices = gridDim.x, V = p.vocab;
  const float* logits = p.logits + row * p.ld;
  const int64_t per = (V + slices - 1) / slices, begin = blockIdx.x * per, end = min(V, begin + per);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  float best = -INFINITY;
  int64_t best_id = -1;
  for_each_in<kGreedyThreads, kGreedyUnroll>(logits, begin, end, [&](float l, int64_t i) {
    if (better(l, i, best, best_id)) best = l, best_id = i;
  });
  // The block's winner (ids fit int32: the launcher checks the vocabulary).
  const auto block_best = [&](float& v, int& id) {
    for (int offset = 16; offset > 0; offset /= 2) {
      const float ov = __shfl_xor_sync(kFull, v, offset);
      const int oid = __shfl_xor_sync(kFull, id, offset);
      if (better(ov, oid, v, id)) v = ov, id = oid;
    }
    if (lane == 0) best_s[warp] = v, best_id_s[warp] = id;
    __syncthreads();
    v = best_s[0];
    id = best_id_s[0];
    for (int w = 1; w < kGreedyThreads / 32; ++w)
      if (better(best_s[w], best_id_s[w], v, id)) v = best_s[w], id = best_id_s[w];
    __syncthreads();  // best_s is reused by the final reduction
  };
  float v = best;
  int id = int(best_id);
  block_best(v, id);
  if (slices == 1) {
    if (threadIdx.x == 0) {
      p.tokens[row] = id;
      if (p.values) p.values[row] = v;
    }
    return;
  }
  if (threadIdx.x == 0) {
    p.partials[row * slices + blockIdx.x] = make_int2(__float_as_int(v), id);
    __threadfence();  // the partial is visible device-wide before the arrival is counted
    last_s = atomicAdd(&p.arrivals[row], 1u) == unsigned(slices - 1);
  }
  __syncthreads();
  if (!last_s) return;
  __threadfence();  // the other slices' partials are read after their arrivals
  v = -INFINITY;
  id = -1;
  for (int64_t s = threadIdx.x; s < slices; s += kGreedyThreads) {
    const int2 q = __ldcg(p.partials + row * slices + s);
    if (better(__int_as_float(q.x), q.y, v, id)) v = __int_as_float(q.x), id = q.y;
  }
  block_best(v, id);
  if (threadIdx.x == 0) {
    p.tokens[row] = id;
    if (p.values) p.values[row] = v;
    p.arrivals[row] = 0;  // ready for the next call (stream order publishes it)
  }
}

}  // namespace

int greedy_slices(int64_t vocab) {
  return int(std::min<int64_t>(kGreedyMaxSlices, std::max<int64_t>(1, (vocab + 2047) / 2048)));
}

void greedy_tokens(const GreedyParams& p, cudaStream_t stream, bool pdl) {
  DSV4_CHECK(p.rows >= 0 && p.rows <= 65535, "greedy_tokens: rows ", p.rows, " out of range (at most 65535)");
  DSV4_CHECK(p.vocab >= 1 && p.vocab <= int64_t(INT32_MAX), "greedy_tokens: vocab ", p.vocab, " out of range");
  DSV4_CHECK(p.ld >= p.vocab, "greedy_tokens: row stride ", p.ld, " shorter than the vocabulary ", p.vocab);
  DSV4_CHECK(p.logits && p.tokens, "greedy_tokens: logits and tokens are required");
  const int slices = greedy_slices(p.vocab);
  DSV4_CHECK(slices == 1 || (p.partials && p.arrivals), "greedy_tokens: ", slices,
             " slices per row need partials and arrival counters");
  if (p.rows == 0) return;
  cuda::launch_pdl(greedy_kernel, dim3(unsigned(slices), unsigned(p.rows)), dim3(kGreedyThreads), 0, stream, pdl, p);
}

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
