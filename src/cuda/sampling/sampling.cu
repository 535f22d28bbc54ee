// sampling (CUDA): one block per row of logits; each step is a block-wide pass over the row (L2-resident after
// the first) with register accumulation and block reductions. The draw is sample_row's (sampler.h) step for
// step, on integer weights (sampler/draw.h), so every sum is exact and the token is the CPU's:
//   0. a row with edits (bias, penalties) is copied to the work buffer and edited there; a grammar's mask turns
//      the tokens it forbids into -inf as they are read;
//   1. max and argmax (lowest id among equal maxima): the greedy answer and the softmax shift;
//   2. top-k: radix select (4 passes of 8 bits over an order-preserving key, warp-aggregated histogram
//      counts) of the k-th token in rank order (logit descending, id ascending), ties on the boundary logit
//      resolved by id;
//   3. top-p: the same radix select over the top-k tokens' weight instead of their count finds the token where
//      the mass ranked up to it reaches top_p of theirs: the nucleus ends there;
//   4. the draw: each thread sums the weight of its kept tokens (ids t, t + 1024, ...: draw::kLanes order),
//      one scan over the threads places the Philox point in one thread's share, and that thread walks its ids.
// The filters each keep a prefix of the rank order, as the CPU's sort-then-truncate does.
#include "cuda/sampling/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda/common/check.h"
#include "cuda/common/launch.cuh"
#include "sampler/draw.h"

namespace dsv4::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBuckets = 256;  // one radix digit of 8 bits
static_assert(kThreads == draw::kLanes, "a thread per lane of the draw's order");
constexpr int kUnroll = 4;     // loads in flight per thread in a pass over the row
constexpr unsigned kFull = 0xffffffffu;

// Rank key: the logit's order-preserving bit pattern, complemented so that a smaller key ranks first. -0 is +0
// (the CPU's comparison holds them equal, and breaks the tie by id).
__device__ __forceinline__ uint32_t rank_key(float logit) {
  const uint32_t u = __float_as_uint(logit == 0.0f ? 0.0f : logit);
  return ~((u & 0x80000000u) ? ~u : (u | 0x80000000u));
}
// The logit of a key (rank_key's inverse).
__device__ __forceinline__ float key_logit(uint32_t key) {
  const uint32_t v = ~key;
  return __uint_as_float((v & 0x80000000u) ? (v & 0x7fffffffu) : ~v);
}

// Tokens ranked at or before the bound: key < bound.key, or key == bound.key and id ≤ bound.id.
struct RankBound {
  uint32_t key;
  int64_t id;
};
constexpr RankBound kEveryToken{0xffffffffu, INT64_MAX};

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

// A row as the draw sees it: its logits (the edited copy when it has edits) under a grammar's mask.
struct Row {
  const float* logits;
  const uint32_t* mask;  // nullptr: every token allowed
  int64_t V;
  __device__ __forceinline__ float value(float l, int64_t i) const {
    return mask && !((__ldg(mask + (i >> 5)) >> (i & 31)) & 1u) ? -INFINITY : l;
  }
  __device__ __forceinline__ float at(int64_t i) const { return value(logits[i], i); }
};

// f(value, id) over the whole row, by the sampling kernel's threads.
template <class F>
__device__ __forceinline__ void for_each_token(const Row& row, F&& f) {
  for_each_in<kThreads, kUnroll>(row.logits, 0, row.V, [&](float l, int64_t i) { f(row.value(l, i), i); });
}

struct Shared {
  unsigned count[kBuckets];
  unsigned long long mass[kBuckets];
  double warp_sum[kWarps];
  uint64_t warp_u64[kWarps];
  float warp_best[kWarps];
  int64_t warp_best_id[kWarps];
  unsigned warp_hits[kWarps];
  uint32_t prefix;
  unsigned before, tied, gathered;
  unsigned long long mass_before;
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

// Block-wide sum through `slots` (kWarps entries of shared memory); every thread gets the total. The order is
// fixed, so a floating-point sum is reproducible.
template <class T>
__device__ T block_sum(T v, T* slots) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFull, v, offset);
  if (lane == 0) slots[warp] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < kWarps; ++w) total += slots[w];
  __syncthreads();
  return total;
}

// Exclusive prefix sum over the threads in index order.
__device__ uint64_t block_exclusive_scan(uint64_t v, Shared& sm) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint64_t inclusive = v;
  for (int offset = 1; offset < 32; offset *= 2) {
    const uint64_t up = __shfl_up_sync(kFull, inclusive, offset);
    if (lane >= offset) inclusive += up;
  }
  if (lane == 31) sm.warp_u64[warp] = inclusive;
  __syncthreads();
  uint64_t before_warp = 0;
  for (int w = 0; w < warp; ++w) before_warp += sm.warp_u64[w];
  __syncthreads();
  return before_warp + inclusive - v;
}

// hist[bucket] += add for each calling lane (bucket < kBuckets; kBuckets: nothing). The lanes of a warp mostly
// share a bucket (neighbouring ids, or logits crowding into a few digits): those add once per distinct bucket.
__device__ __forceinline__ void add_counts(unsigned* hist, unsigned bucket) {
  const unsigned peers = __match_any_sync(__activemask(), bucket);
  if (bucket < kBuckets && threadIdx.x % 32 == unsigned(__ffs(peers) - 1))
    atomicAdd(&hist[bucket], unsigned(__popc(peers)));
}
__device__ __forceinline__ void add_mass(unsigned long long* hist, unsigned bucket, uint64_t add) {
  const unsigned active = __activemask();
  if (!__any_sync(active, add != 0)) return;  // most tokens of a trained model's row weigh nothing
  const unsigned peers = __match_any_sync(active, bucket);
  if (peers == kFull) {  // the whole warp: one sum
    for (int offset = 16; offset > 0; offset /= 2) add += __shfl_xor_sync(kFull, add, offset);
    if (bucket < kBuckets && threadIdx.x % 32 == 0 && add) atomicAdd(&hist[bucket], (unsigned long long)add);
  } else if (bucket < kBuckets && add) {
    atomicAdd(&hist[bucket], (unsigned long long)add);
  }
}

// Id of the need-th token (1-based, in id order) whose rank key is `key`.
__device__ int64_t nth_with_key(const Row& row, uint32_t key, int64_t need, Shared& sm) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int64_t seen = 0;
  for (int64_t base = 0; base < row.V; base += kThreads) {
    const int64_t i = base + threadIdx.x;
    const bool hit = i < row.V && rank_key(row.at(i)) == key;
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
__device__ RankBound select_kth(const Row& row, int64_t k, Shared& sm) {
  const int lane = threadIdx.x % 32;
  uint32_t prefix = 0, mask = 0;
  int64_t before = 0;  // tokens ranked before every token that matches `prefix`
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kBuckets; b += kThreads) sm.count[b] = 0;
    __syncthreads();
    for_each_token(row, [&](float l, int64_t) {
      const uint32_t key = rank_key(l);
      add_counts(sm.count, (key & mask) == prefix ? (key >> shift) & 0xffu : kBuckets);
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
  return {prefix, nth_with_key(row, prefix, need, sm)};
}

// The nucleus: rank bound of the first token (in rank order, among those within `top_k`) at which the weight
// ranked up to and including it reaches `threshold` (≥ 1, ≤ the top-k's weight). The same radix select as
// select_kth, with weights in place of counts.
__device__ RankBound select_mass(const Row& row, const RankBound& top_k, float max_logit, float inv_T,
                                 uint64_t threshold, Shared& sm) {
  uint32_t prefix = 0, mask = 0;
  uint64_t before = 0;  // the weight ranked before every token that matches `prefix`
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kBuckets; b += kThreads) sm.mass[b] = 0;
    __syncthreads();
    for_each_token(row, [&](float l, int64_t i) {
      const uint32_t key = rank_key(l);
      const bool in = within(top_k, key, i) && (key & mask) == prefix;
      add_mass(sm.mass, in ? (key >> shift) & 0xffu : kBuckets,
               in ? draw::units(draw::weight(l, max_logit, inv_T)) : 0);
    });
    __syncthreads();
    if (threadIdx.x == 0) {
      int b = 0;
      while (b < kBuckets - 1 && before + sm.mass[b] < threshold) before += sm.mass[b++];
      sm.prefix = prefix | (uint32_t(b) << shift);
      sm.mass_before = before;
    }
    __syncthreads();
    prefix = sm.prefix;
    before = sm.mass_before;
    mask |= 0xffu << shift;
  }
  // Every token of the exact key weighs the same w: the m-th of them (by id) is the first to reach the threshold.
  const uint64_t w = draw::units(draw::weight(key_logit(prefix), max_logit, inv_T));
  const int64_t m = w > 0 ? int64_t((threshold - before + w - 1) / w) : 1;
  return {prefix, nth_with_key(row, prefix, m, sm)};
}

__global__ void __launch_bounds__(kThreads) sample_kernel(SampleParams p) {
  __shared__ Shared sm;
  const int64_t r = blockIdx.x, V = p.vocab;
  const DrawRow d = p.draws[r];
  const float* logits = p.logits + r * V;
  if (d.edit_end > d.edit_begin) {
    float* work = p.work + r * V;
    for (int64_t i = threadIdx.x; i < V; i += kThreads) work[i] = logits[i];
    __syncthreads();
    for (int64_t e = d.edit_begin + threadIdx.x; e < d.edit_end; e += kThreads) {
      const LogitEdit edit = p.edits[e];
      float x = __fadd_rn(work[edit.id], edit.bias);
      if (edit.repeated) x = x > 0.0f ? __fdiv_rn(x, d.repetition_penalty) : __fmul_rn(x, d.repetition_penalty);
      work[edit.id] = __fsub_rn(x, edit.subtract);
    }
    __syncthreads();  // the block's own global writes are visible to it past the barrier
    logits = work;
  }
  const Row row{logits, d.mask >= 0 ? p.masks + d.mask : nullptr, V};

  float max_logit = -INFINITY;
  int64_t best = -1;
  for_each_token(row, [&](float l, int64_t i) {
    if (better(l, i, max_logit, best)) max_logit = l, best = i;
  });
  block_argmax(max_logit, best, sm);
  if (d.temperature < draw::kGreedyBelow) {
    if (threadIdx.x == 0) p.tokens[r] = int32_t(best);
    return;
  }
  const float inv_T = draw::inverse(d.temperature);
  const auto units = [&](float l) { return draw::units(draw::weight(l, max_logit, inv_T)); };

  RankBound bound = d.top_k > 0 && d.top_k < V ? select_kth(row, d.top_k, sm) : kEveryToken;
  if (d.top_p < 1.0f) {
    uint64_t z = 0;
    for_each_token(row, [&](float l, int64_t i) {
      if (within(bound, rank_key(l), i)) z += units(l);
    });
    const uint64_t threshold = draw::nucleus_threshold(d.top_p, block_sum(z, sm.warp_u64));
    bound = select_mass(row, bound, max_logit, inv_T, threshold, sm);
  }
  const auto kept = [&](float l, int64_t i) -> uint64_t {
    if (!within(bound, rank_key(l), i)) return 0;
    const float w = draw::weight(l, max_logit, inv_T);
    return w >= d.min_p ? draw::units(w) : 0;
  };

  // Each thread's kept weight, the point in the whole, and the thread whose share holds it walks its ids.
  uint64_t mine = 0;
  for_each_token(row, [&](float l, int64_t i) { mine += kept(l, i); });
  const uint64_t before_me = block_exclusive_scan(mine, sm), total = block_sum(mine, sm.warp_u64);
  if (total == 0) {  // every allowed logit -inf: the greedy answer, as the CPU's
    if (threadIdx.x == 0) p.tokens[r] = int32_t(best);
    return;
  }
  const uint64_t target = draw::target(d.seed, d.step, total);
  if (mine > 0 && before_me <= target && target < before_me + mine) {
    sm.owner = threadIdx.x;
    sm.mass_before = before_me;
  }
  __syncthreads();
  // The owner's ids (owner, owner + 1024, ...), one per thread, scanned in order.
  const int64_t owner = sm.owner;
  uint64_t run = sm.mass_before;
  for (int64_t first = owner; first < V; first += int64_t(kThreads) * kThreads) {
    const int64_t i = first + int64_t(threadIdx.x) * kThreads;
    const uint64_t u = i < V ? kept(row.at(i), i) : 0;
    const uint64_t before = run + block_exclusive_scan(u, sm);
    if (u > 0 && before <= target && target < before + u) p.tokens[r] = int32_t(i);
    run += block_sum(u, sm.warp_u64);
    if (run > target) break;
  }
}

// One block per listed row: log Z, the chosen logit, and the top ones (select_kth, then every token within it).
__global__ void __launch_bounds__(kThreads) logprob_kernel(LogprobParams p) {
  __shared__ Shared sm;
  const int64_t row = p.rows[blockIdx.x], V = p.vocab;
  const Row r{p.logits + row * V, nullptr, V};
  float max_logit = -INFINITY;
  int64_t best = -1;
  for_each_token(r, [&](float l, int64_t i) {
    if (better(l, i, max_logit, best)) max_logit = l, best = i;
  });
  block_argmax(max_logit, best, sm);
  double z = 0.0;
  for_each_token(r, [&](float l, int64_t) { z += exp(double(l) - double(max_logit)); });
  z = block_sum(z, sm.warp_sum);
  if (threadIdx.x == 0) {
    p.log_z[blockIdx.x] = double(max_logit) + log(z);
    p.chosen[blockIdx.x] = r.logits[p.tokens[row]];
    sm.gathered = 0;
  }
  __syncthreads();
  if (p.top == 0) return;
  const RankBound bound = p.top < V ? select_kth(r, p.top, sm) : kEveryToken;
  int2* out = p.best + blockIdx.x * p.top;
  for_each_token(r, [&](float l, int64_t i) {
    if (within(bound, rank_key(l), i)) out[atomicAdd(&sm.gathered, 1u)] = make_int2(int(i), __float_as_int(l));
  });
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
  DSV4_CHECK(p.vocab >= 1 && p.vocab <= (int64_t(1) << 23), "sample_tokens: vocab ", p.vocab,
             " out of range (the draw's weights sum in 64 bits up to 2^23 tokens)");
  DSV4_CHECK(p.logits && p.tokens && p.draws, "sample_tokens: logits, draws and tokens are required");
  if (p.rows == 0) return;
  sample_kernel<<<unsigned(p.rows), kThreads, 0, stream>>>(p);
  DSV4_LAUNCH_CHECK();
}

void token_logprobs(const LogprobParams& p, cudaStream_t stream) {
  DSV4_CHECK(p.count >= 0 && p.count <= int64_t(INT32_MAX), "token_logprobs: count ", p.count, " out of range");
  DSV4_CHECK(p.vocab >= 1 && p.vocab <= int64_t(INT32_MAX), "token_logprobs: vocab ", p.vocab, " out of range");
  DSV4_CHECK(p.top >= 0 && p.top <= std::min(p.vocab, kLogprobsLimit), "token_logprobs: top ", p.top,
             " must be between 0 and ", std::min(p.vocab, kLogprobsLimit));
  DSV4_CHECK(p.logits && p.rows && p.tokens && p.log_z && p.chosen && (p.top == 0 || p.best),
             "token_logprobs: a required buffer is missing");
  if (p.count == 0) return;
  logprob_kernel<<<unsigned(p.count), kThreads, 0, stream>>>(p);
  DSV4_LAUNCH_CHECK();
}

}  // namespace dsv4::cuda
