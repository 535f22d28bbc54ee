// moe family (CUDA): the router. router_logits computes logits = x · gateᵀ (every gate row read once per
// chunk of kChunk tokens, the K range split over the block's warps; a block stages its chunk's x once for
// RouterLogitsParams::passes pairs of gate rows); route turns them into the step's plan
// (moe_kernels.h): sqrt-softplus scores, the k experts of each token (top-k of score + bias, or the hash
// table), their weights, and the (token, choice) pairs grouped by expert into chunks. route is one block up to
// kRouteManyBlocksMin tokens (tiny next to the expert weights, no launches in between), three launches over
// blocks of tokens beyond; both keep the grouping deterministic without a host round-trip.
#include <algorithm>
#include <climits>
#include <cmath>

#include "cuda/moe/moe_kernels.h"

namespace dsv4::cuda::moe {

namespace {

// ---- router_logits

constexpr int kLogitsWarps = 8;
constexpr int kGateRowsPerPass = 2;  // every warp dots both rows over its eighth of K
// Row pairs per block at most: staging x (a chunk's kChunk rows of 16 KB at V4's D) is the block's largest read,
// so with many chunks a block reuses it. At 64 tokens one pair a block staged 134 MB of x from L2 for 32 MB of
// gate reads: 52 µs a layer (H100). With few chunks the grid needs the blocks: at 8 tokens two pairs a block
// took 11 µs a layer against 9.
constexpr int kMaxPasses = 8;

int64_t logits_passes(int64_t n) { return std::clamp<int64_t>((n + kChunk - 1) / kChunk / 2, 1, kMaxPasses); }

// Gate rows [row0, row0 + kGateRowsPerPass) against the staged chunk; ends with a barrier (partials reused).
template <WFormat F, int MC>
__device__ void logits_chunk(const RouterLogitsParams& p, const float* xs, int64_t row0, int64_t t0, int count,
                             float* partials) {
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const int rows_valid = int(std::min<int64_t>(kGateRowsPerPass, p.E - row0));
  const int64_t chunks = chunks_per_row<F>(p.D);
  const int64_t q_begin = chunks * warp / kLogitsWarps, q_end = chunks * (warp + 1) / kLogitsWarps;
  const MatView mats[1] = {p.gate};
  float acc[1][kGateRowsPerPass][MC];
  warp_dot<F, 1, kGateRowsPerPass, MC>(mats, row0, rows_valid, q_begin, q_end, p.gate_format.aligned, xs,
                                       staged_stride(p.D), acc);
  warp_sum(acc);
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < kGateRowsPerPass; ++r)
#pragma unroll
      for (int m = 0; m < MC; ++m) partials[(warp * kGateRowsPerPass + r) * kChunk + m] = acc[0][r][m];
  __syncthreads();
  // Fixed order over the warps: the logits do not depend on scheduling.
  const int r = int(threadIdx.x) / kChunk, m = int(threadIdx.x) % kChunk;
  if (r < rows_valid && m < count) {
    float sum = 0.0f;
    for (int w = 0; w < kLogitsWarps; ++w) sum += partials[(w * kGateRowsPerPass + r) * kChunk + m];
    p.logits[(t0 + m) * p.E + row0 + r] = sum;
  }
  __syncthreads();
}

template <WFormat F>
__device__ void logits_any_rows(const RouterLogitsParams& p, const float* xs, int64_t row0, int64_t t0, int count,
                                float* partials) {
  switch (rows_for(count)) {
    case 1: logits_chunk<F, 1>(p, xs, row0, t0, count, partials); break;
    case 2: logits_chunk<F, 2>(p, xs, row0, t0, count, partials); break;
    default: logits_chunk<F, kChunk>(p, xs, row0, t0, count, partials); break;
  }
}

// grid (ceil(E / (2·passes)), ceil(n / kChunk)), kLogitsWarps warps; dynamic smem: rows_for(min(n, kChunk))
// staged rows. Block (b, c) computes gate rows [2·passes·b, 2·passes·(b + 1)) for chunk c's tokens.
__global__ void __launch_bounds__(kLogitsWarps * 32) router_logits_kernel(RouterLogitsParams p) {
  extern __shared__ float4 smem_logits[];
  float* xs = reinterpret_cast<float*>(smem_logits);
  __shared__ float partials[kLogitsWarps * kGateRowsPerPass * kChunk];
  const int64_t rows_per_block = int64_t(kGateRowsPerPass) * p.passes;
  const int64_t first_row = int64_t(blockIdx.x) * rows_per_block;
  const int64_t end_row = std::min<int64_t>(first_row + rows_per_block, p.E);
  {  // the block's gate rows (contiguous) into L2 while the predecessor drains; x is read after the wait
    const int64_t bytes = (end_row - first_row) * p.gate.row_bytes;
    for (int64_t b = int64_t(threadIdx.x) * 128; b < bytes; b += kLogitsWarps * 32 * 128)
      prefetch_l2(p.gate.data + first_row * p.gate.row_bytes + b);
  }
  pdl_wait_predecessor();
  pdl_trigger();
  const int64_t t0 = int64_t(blockIdx.y) * kChunk;
  const int count = int(std::min<int64_t>(kChunk, p.n - t0));
  // The router is fp32 in every numerics (fast-numerics.md §7 step 14): x as it comes.
  stage_rows(p.x, p.D, count, rows_for(count), [&](int m) { return t0 + m; }, StageRounding::kNone, xs);
  __syncthreads();
  for (int64_t row0 = first_row; row0 < end_row; row0 += kGateRowsPerPass) {
    switch (p.gate_format.format) {
      case WFormat::kFP4: logits_any_rows<WFormat::kFP4>(p, xs, row0, t0, count, partials); break;
      case WFormat::kFP8: logits_any_rows<WFormat::kFP8>(p, xs, row0, t0, count, partials); break;
      case WFormat::kBF16: logits_any_rows<WFormat::kBF16>(p, xs, row0, t0, count, partials); break;
      default: logits_any_rows<WFormat::kF32>(p, xs, row0, t0, count, partials); break;
    }
  }
}

// ---- route

constexpr int kRouteThreads = 512;
constexpr int kRouteWarps = kRouteThreads / 32;
constexpr int kScoresPerLane = kMaxExperts / 32;
static_assert(kMaxExperts <= kRouteThreads, "route gives every expert a thread");

__device__ float softplus(float z) { return z > 20.0f ? z : log1pf(expf(z)); }  // PyTorch's threshold, as the CPU

// Exclusive prefix of one value per thread over the block; *total gets the sum. Called by every thread.
__device__ int block_exclusive_scan(int v, int* warp_totals, int* total) {
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
  int inclusive = v;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int y = __shfl_up_sync(0xFFFFFFFFu, inclusive, off);
    if (lane >= off) inclusive += y;
  }
  if (lane == 31) warp_totals[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int s = lane < kRouteWarps ? warp_totals[lane] : 0;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int y = __shfl_up_sync(0xFFFFFFFFu, s, off);
      if (lane >= off) s += y;
    }
    if (lane < kRouteWarps) warp_totals[lane] = s;
  }
  __syncthreads();
  const int before = warp > 0 ? warp_totals[warp - 1] : 0;
  *total = warp_totals[kRouteWarps - 1];
  __syncthreads();  // warp_totals is reused by the next scan
  return before + inclusive - v;
}

// Before the wait, what a warp's first token needs that is not the predecessor's: the gate bias of the lane's
// experts lane, lane + 32, ... (scored layers), and on hash layers the table's choice j = lane < k for the token.
// Both are weights, an HBM round trip each at decode (the table's after the token id's); the step's token ids
// are uploaded by a copy before its first kernel (launch.cuh).
struct RoutePrefetch {
  float bias[kScoresPerLane];
  int hashed = -1;  // hash layers: the table's expert for the warp's first token, lane < k
};

__device__ RoutePrefetch prefetch_route(const RouteParams& p, int64_t t) {  // t: the warp's first token
  const int lane = int(threadIdx.x % 32);
  RoutePrefetch r;
#pragma unroll
  for (int i = 0; i < kScoresPerLane; ++i) {
    const int e = lane + 32 * i;
    r.bias[i] = p.gate_bias && e < p.E ? p.gate_bias[e] : 0.0f;
  }
  if (p.tid2eid && t < p.n && lane < p.k) r.hashed = p.tid2eid[int64_t(__ldcg(p.tokens + t)) * p.k + lane];
  return r;
}

// Expert e if this rank holds it (moe_kernels.h, expert parallelism), else −1: not a pair of this rank's plan.
__device__ __forceinline__ int local_expert(const RouteParams& p, int e) {
  return e >= p.expert_begin && e < p.expert_end ? e : -1;
}

struct Choice {
  int expert = -1;     // lane j < k: choice j
  float score = 0.0f;  // its sqrt-softplus score
};

// A float's bits mapped so that unsigned order is float order (+0 above −0, which a score + bias never is).
__device__ __forceinline__ uint32_t ordered_bits(float v) {
  const uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Token t's choices, by one warp (pre: prefetched for the warp's first token t_first). Scores replace the logits.
__device__ Choice choose_experts(const RouteParams& p, const RoutePrefetch& pre, int64_t t, int64_t t_first) {
  const int lane = int(threadIdx.x % 32);
  float* s = p.plan.scores + t * p.E;
  float score[kScoresPerLane], biased[kScoresPerLane];
#pragma unroll
  for (int i = 0; i < kScoresPerLane; ++i) {
    const int e = lane + 32 * i;
    score[i] = biased[i] = 0.0f;
    if (e < p.E) {
      score[i] = sqrtf(softplus(s[e]));
      s[e] = score[i];
      biased[i] = p.gate_bias ? score[i] + pre.bias[i] : score[i];
    }
  }
  Choice c;
  if (p.tid2eid) {
    if (lane < p.k)
      c.expert = t == t_first ? pre.hashed : p.tid2eid[int64_t(p.tokens[t]) * p.k + lane];
  } else {
    // k rounds of a warp argmax over the untaken experts on ordered_bits keys (0: taken or absent, below
    // every score; NaN ranks as −inf): the largest key by one warp reduction, then the lowest expert holding
    // it by another (the CPU's partial_sort order on an exact tie). Two reductions a round instead of five
    // levels of paired shuffles and compares, which shortens the decode route of a scored layer (GPU timeline).
    uint32_t key[kScoresPerLane];
#pragma unroll
    for (int i = 0; i < kScoresPerLane; ++i)
      key[i] = lane + 32 * i < p.E ? ordered_bits(biased[i] != biased[i] ? -INFINITY : biased[i]) : 0u;
    for (int j = 0; j < p.k; ++j) {
      uint32_t best = 0;
      int best_e = INT_MAX;
#pragma unroll
      for (int i = 0; i < kScoresPerLane; ++i)
        if (key[i] > best) {  // strict: the lane's lowest expert on a tie
          best = key[i];
          best_e = lane + 32 * i;
        }
      const uint32_t top = __reduce_max_sync(0xFFFFFFFFu, best);
      const int winner = __reduce_min_sync(0xFFFFFFFFu, best == top ? best_e : INT_MAX);
#pragma unroll
      for (int i = 0; i < kScoresPerLane; ++i)
        if (lane + 32 * i == winner) key[i] = 0;
      if (lane == j) c.expert = winner;
    }
  }
  // The choice's score from the lane that holds it (expert e: lane e % 32, slot e / 32), not read back.
  const int owner = c.expert < 0 ? 0 : c.expert % 32, slot = c.expert < 0 ? -1 : c.expert / 32;
#pragma unroll
  for (int i = 0; i < kScoresPerLane; ++i) {
    const float v = __shfl_sync(0xFFFFFFFFu, score[i], owner);
    if (slot == i) c.score = v;
  }
  return c;
}

// Step 2 of route_kernel for P ≤ 32 pairs (decode-sized steps), by one warp with a pair per lane (a lane whose
// expert is another rank's holds none): the same plan as the general path — pairs ordered by (expert, pair),
// kChunk-pair chunks per expert in that order — from shuffles, without the shared-memory counters, scans and barriers (a large share of the kernel's time
// at n = 1). The pairs' experts and weights come from shared memory (step 1's copy of topk_expert / topk_weight).
__device__ void group_few_pairs(const RouteParams& p, int P, const int* few_expert, const float* few_weight) {
  const Plan& plan = p.plan;
  const int lane = int(threadIdx.x % 32), k = int(p.k);
  const int n_shared = shared_chunks(p.n, p.shared_items);
  const bool local = lane < P && local_expert(p, few_expert[lane]) >= 0;
  const int e = local ? few_expert[lane] : INT_MAX;
  int pos = 0, first = 0;  // this pair's place among all pairs; the pairs of smaller experts
  for (int q = 0; q < P; ++q) {
    const int eq = __shfl_sync(0xFFFFFFFFu, e, q);
    pos += eq < e || (eq == e && q < lane);
    first += eq < e;
  }
  const int count = __popc(__match_any_sync(0xFFFFFFFFu, e));  // pairs of this expert
  const int in_expert = pos - first;
  const bool starts = local && in_expert % kChunk == 0;
  int chunk = n_shared;  // chunks before this one: the shared expert's, then routed ones starting earlier
  for (int q = 0; q < P; ++q) {
    const int pq = __shfl_sync(0xFFFFFFFFu, pos, q);
    chunk += __shfl_sync(0xFFFFFFFFu, int(starts), q) && pq < pos;
  }
  if (local) {
    const int t = lane / k, j = lane % k;
    plan.pair_token[pos] = t;
    plan.pair_out[pos] = t * (k + 1) + j;
    plan.pair_weight[pos] = few_weight[lane];
    if (starts) {
      plan.chunk_pair[chunk] = pos;
      plan.chunk_count[chunk] = min(kChunk, count - in_expert);
      plan.chunk_expert[chunk] = e;
    }
  }
  const int routed_chunks = __popc(__ballot_sync(0xFFFFFFFFu, starts));
  for (int c = lane; c < n_shared; c += 32) {
    plan.chunk_pair[c] = P + c * kChunk;
    plan.chunk_count[c] = int(std::min<int64_t>(kChunk, p.n - int64_t(c) * kChunk));
    plan.chunk_expert[c] = -1;
  }
  for (int t = lane; t < p.n; t += 32) {
    plan.pair_token[P + t] = t;
    plan.pair_out[P + t] = t * (k + 1) + k;
    plan.pair_weight[P + t] = 1.0f;
  }
  if (lane == 0) plan.counters[0] = n_shared + routed_chunks;
}

// Step 1 for token t, by one warp: scores, choices, weights = score / Σ chosen scores × routed_scaling_factor (the
// CPU's order: the sum runs over j = 0 .. k−1), and the combine order (this rank's choices; then −1s). few_*:
// copies of the first 32 pairs' experts and weights for group_few_pairs (nullptr: not wanted).
__device__ void choose_token(const RouteParams& p, const RoutePrefetch& pre, int64_t t, int64_t t_first,
                             int* few_expert, float* few_weight) {
  const int lane = int(threadIdx.x % 32), k = int(p.k);
  const Plan& plan = p.plan;
  const Choice choice = choose_experts(p, pre, t, t_first);
  const int chosen = choice.expert;
  const float score = lane < k ? choice.score : 0.0f;
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) sum += __shfl_sync(0xFFFFFFFFu, score, j);
  // Position of (key, lane) among the token's (key, j) in ascending order; key = the expert, another rank's last.
  const int key = lane < k && local_expert(p, chosen) >= 0 ? chosen : INT_MAX;
  int rank = 0;
  for (int j = 0; j < k; ++j) {
    const int other = __shfl_sync(0xFFFFFFFFu, key, j);
    if (other < key || (other == key && j < lane)) ++rank;
  }
  if (lane < k) {
    const float weight = score / sum;
    plan.topk_expert[t * k + lane] = chosen;
    plan.topk_weight[t * k + lane] = weight * p.routed_scaling_factor;
    if (few_expert && t * k + lane < 32) {
      few_expert[t * k + lane] = chosen;
      few_weight[t * k + lane] = weight * p.routed_scaling_factor;
    }
    plan.combine_order[t * k + rank] = key == INT_MAX ? -1 : lane;
  }
}

// Grouping, pass 1: the calling warp counts its pairs [lo, hi) per local expert into counts[E] (zeroed).
__device__ void count_pairs(const RouteParams& p, int lo, int hi, int* counts) {
  const int lane = int(threadIdx.x % 32);
  for (int base = lo; base < hi; base += 32) {
    const int pair = base + lane;
    const int e = pair < hi ? local_expert(p, p.plan.topk_expert[pair]) : -1;
    const unsigned peers = __match_any_sync(0xFFFFFFFFu, e);
    if (e >= 0 && lane == __ffs(peers) - 1) counts[e] += __popc(peers);
    __syncwarp();
  }
}

// Grouping, pass 2: the calling warp places its pairs [lo, hi) in pair order; counts[e] enters as the place of
// the warp's first pair of expert e and is advanced (rank among equal experts within a 32-pair step from
// __match_any_sync).
__device__ void place_pairs(const RouteParams& p, int lo, int hi, int* counts) {
  const int lane = int(threadIdx.x % 32), k = int(p.k);
  const Plan& plan = p.plan;
  for (int base = lo; base < hi; base += 32) {
    const int pair = base + lane;
    const int ex = pair < hi ? local_expert(p, plan.topk_expert[pair]) : -1;
    const unsigned peers = __match_any_sync(0xFFFFFFFFu, ex);
    if (ex >= 0) {
      const int pos = counts[ex] + __popc(peers & ((1u << lane) - 1u));
      const int t = pair / k, j = pair % k;
      plan.pair_token[pos] = t;
      plan.pair_out[pos] = t * (k + 1) + j;
      plan.pair_weight[pos] = plan.topk_weight[pair];
    }
    __syncwarp();
    if (ex >= 0 && lane == __ffs(peers) - 1) counts[ex] += __popc(peers);
    __syncwarp();
  }
}

// Column e of warp_counts [kRouteWarps][kMaxExperts] to its exclusive prefix over the warps; returns the sum.
__device__ int exclusive_over_warps(int (*warp_counts)[kMaxExperts], int e) {
  int count = 0;
  for (int w = 0; w < kRouteWarps; ++w) {
    const int c = warp_counts[w][e];
    warp_counts[w][e] = count;
    count += c;
  }
  return count;
}

// The plan's tables from the per-expert pair counts, by the whole block (thread e = expert e, count its pairs):
// the experts' chunks after the shared expert's, the shared pairs after the P routed ones, the chunk count.
// Returns expert e's first pair.
__device__ int write_chunk_tables(const RouteParams& p, int count, int* warp_totals) {
  const Plan& plan = p.plan;
  const int e = int(threadIdx.x), k = int(p.k), P = int(p.n) * k;
  int total_pairs = 0, total_chunks = 0;
  const int offset = block_exclusive_scan(count, warp_totals, &total_pairs);
  const int chunks = (count + kChunk - 1) / kChunk;
  const int chunk_begin = block_exclusive_scan(chunks, warp_totals, &total_chunks);
  const int n_shared = shared_chunks(p.n, p.shared_items);
  if (e < p.E) {
    for (int c = 0; c < chunks; ++c) {
      const int idx = n_shared + chunk_begin + c;
      plan.chunk_pair[idx] = offset + c * kChunk;
      plan.chunk_count[idx] = min(kChunk, count - c * kChunk);
      plan.chunk_expert[idx] = e;
    }
  }
  for (int c = int(threadIdx.x); c < n_shared; c += kRouteThreads) {
    plan.chunk_pair[c] = P + c * kChunk;
    plan.chunk_count[c] = int(std::min<int64_t>(kChunk, p.n - int64_t(c) * kChunk));
    plan.chunk_expert[c] = -1;
  }
  for (int t = int(threadIdx.x); t < p.n; t += kRouteThreads) {
    plan.pair_token[P + t] = t;
    plan.pair_out[P + t] = t * (k + 1) + k;
    plan.pair_weight[P + t] = 1.0f;
  }
  // The chunk count for the expert kernels (written every step, so nothing persists between steps).
  if (threadIdx.x == 0) plan.counters[0] = n_shared + total_chunks;
  return offset;
}

// One block for the whole step (decode and small prefill steps: latency, no launches in between).
__global__ void __launch_bounds__(kRouteThreads) route_kernel(RouteParams p) {
  __shared__ int warp_counts[kRouteWarps][kMaxExperts];  // pass 1: pairs per (warp range, expert); then bases
  __shared__ int expert_offset[kMaxExperts];
  __shared__ int warp_totals[kRouteWarps];
  __shared__ int few_expert[32];  // P ≤ 32: topk_expert and topk_weight for step 2, without a global read-back
  __shared__ float few_weight[32];
  // expert_up may start at once: its shared-expert items read only x (complete: router_logits waited for
  // it before letting this kernel launch) and wait for this kernel before anything routed.
  const RoutePrefetch pre = prefetch_route(p, int64_t(threadIdx.x / 32));
  pdl_trigger();
  pdl_wait_predecessor();
  const int warp = int(threadIdx.x / 32);

  // 1. Per token (choose_token).
  for (int64_t t = warp; t < p.n; t += kRouteWarps) choose_token(p, pre, t, warp, few_expert, few_weight);
  const int P = int(p.n) * int(p.k);
  if (P <= 32) {
    __syncthreads();  // step 1's few_expert / few_weight are visible to warp 0
    if (warp == 0) group_few_pairs(p, P, few_expert, few_weight);
    return;
  }
  for (int i = int(threadIdx.x); i < kRouteWarps * kMaxExperts; i += kRouteThreads) (&warp_counts[0][0])[i] = 0;
  __syncthreads();

  // 2. Group the P = n·k pairs by expert, deterministically: warp w owns the contiguous pairs [lo, hi) and
  //    counts them per expert; bases = expert offset + the counts of the warps before; then each warp places
  //    its pairs in order.
  const int per_warp = (P + kRouteWarps - 1) / kRouteWarps;
  const int lo = min(P, warp * per_warp), hi = min(P, lo + per_warp);
  count_pairs(p, lo, hi, warp_counts[warp]);
  __syncthreads();
  const int e = int(threadIdx.x);
  const int count = e < p.E ? exclusive_over_warps(warp_counts, e) : 0;
  const int offset = write_chunk_tables(p, count, warp_totals);
  if (e < p.E) expert_offset[e] = offset;
  __syncthreads();
  for (int x = e; x < p.E; x += kRouteThreads)  // e < E ≤ kRouteThreads: once
    for (int w = 0; w < kRouteWarps; ++w) warp_counts[w][x] += expert_offset[x];
  __syncthreads();
  place_pairs(p, lo, hi, warp_counts[warp]);
}

// ---- route over many blocks (batched and prefill steps): route_kernel's work in three launches. One block
// serialised a 4096-token step's 4096 tokens on one SM (1.4 ms a layer, H100); here a block takes
// route_block_tokens(n) tokens:
//   route_choose   per token (choose_token), then the block's pairs counted per expert → counts[b, E];
//   route_offsets  one block: per expert, counts[·, e] to its exclusive prefix over the blocks plus the expert's
//                  first pair; the chunk tables;
//   route_place    each block places its pairs from those bases, in pair order.
// The plan is route_kernel's, entry for entry: pairs ordered by (expert, pair) either way.

// grid (route_blocks(n)), kRouteThreads threads.
__global__ void __launch_bounds__(kRouteThreads) route_choose_kernel(RouteParams p) {
  __shared__ int warp_counts[kRouteWarps][kMaxExperts];
  const int warp = int(threadIdx.x / 32), k = int(p.k);
  const int64_t tokens = route_block_tokens(p.n);
  const int64_t t0 = int64_t(blockIdx.x) * tokens, t_end = std::min<int64_t>(p.n, t0 + tokens);
  const RoutePrefetch pre = prefetch_route(p, t0 + warp);
  for (int i = int(threadIdx.x); i < kRouteWarps * kMaxExperts; i += kRouteThreads) (&warp_counts[0][0])[i] = 0;
  pdl_wait();
  for (int64_t t = t0 + warp; t < t_end; t += kRouteWarps) choose_token(p, pre, t, t0 + warp, nullptr, nullptr);
  __syncthreads();  // this block's topk_expert
  const int lo = int(t0) * k, hi = int(t_end) * k, per_warp = (hi - lo + kRouteWarps - 1) / kRouteWarps;
  const int wlo = min(hi, lo + warp * per_warp), whi = min(hi, wlo + per_warp);
  count_pairs(p, wlo, whi, warp_counts[warp]);
  __syncthreads();
  for (int e = int(threadIdx.x); e < p.E; e += kRouteThreads) {
    int count = 0;
    for (int w = 0; w < kRouteWarps; ++w) count += warp_counts[w][e];
    p.plan.route_counts[int64_t(blockIdx.x) * p.E + e] = count;
  }
}

// One block, kRouteThreads threads.
__global__ void __launch_bounds__(kRouteThreads) route_offsets_kernel(RouteParams p) {
  __shared__ int warp_totals[kRouteWarps];
  const int blocks = int(route_blocks(p.n));  // route_choose's grid
  pdl_wait();
  const int e = int(threadIdx.x);
  int count = 0;
  if (e < p.E)
    for (int b = 0; b < blocks; ++b) {
      const int c = p.plan.route_counts[int64_t(b) * p.E + e];
      p.plan.route_counts[int64_t(b) * p.E + e] = count;
      count += c;
    }
  const int offset = write_chunk_tables(p, count, warp_totals);
  if (e < p.E)
    for (int b = 0; b < blocks; ++b) p.plan.route_counts[int64_t(b) * p.E + e] += offset;
}

// grid (route_blocks(n)), kRouteThreads threads.
__global__ void __launch_bounds__(kRouteThreads) route_place_kernel(RouteParams p) {
  __shared__ int warp_counts[kRouteWarps][kMaxExperts];
  const int warp = int(threadIdx.x / 32), k = int(p.k);
  const int64_t tokens = route_block_tokens(p.n);
  const int64_t t0 = int64_t(blockIdx.x) * tokens, t_end = std::min<int64_t>(p.n, t0 + tokens);
  for (int i = int(threadIdx.x); i < kRouteWarps * kMaxExperts; i += kRouteThreads) (&warp_counts[0][0])[i] = 0;
  pdl_wait();
  __syncthreads();  // the zeroed counts (a warp zeroes rows of others)
  const int lo = int(t0) * k, hi = int(t_end) * k, per_warp = (hi - lo + kRouteWarps - 1) / kRouteWarps;
  const int wlo = min(hi, lo + warp * per_warp), whi = min(hi, wlo + per_warp);
  count_pairs(p, wlo, whi, warp_counts[warp]);
  __syncthreads();
  for (int e = int(threadIdx.x); e < p.E; e += kRouteThreads) {
    const int base = p.plan.route_counts[int64_t(blockIdx.x) * p.E + e];
    exclusive_over_warps(warp_counts, e);
    for (int w = 0; w < kRouteWarps; ++w) warp_counts[w][e] += base;
  }
  __syncthreads();
  place_pairs(p, wlo, whi, warp_counts[warp]);
}

}  // namespace

void launch_router_logits(const RouterLogitsParams& p, bool pdl, cudaStream_t stream) {
  DSV4_CHECK(p.n > 0 && p.D > 0 && p.E > 0, "moe router: empty shape n=", p.n, " D=", p.D, " E=", p.E);
  DSV4_CHECK(p.gate_format.format != WFormat::kFP4 || p.D % 32 == 0, "moe router: FP4 gate with ", p.D,
             " columns (must be a multiple of 32)");
  const int64_t token_chunks = (p.n + kChunk - 1) / kChunk;
  DSV4_CHECK(token_chunks <= 65535, "moe router: ", p.n, " tokens in one step (at most ", 65535 * kChunk, ")");
  const size_t smem = size_t(rows_for(int(std::min<int64_t>(p.n, kChunk)))) * size_t(staged_stride(p.D)) * sizeof(float);
  prepare_kernel(reinterpret_cast<const void*>(router_logits_kernel), kLogitsWarps * 32, smem);
  RouterLogitsParams k = p;
  k.passes = int(logits_passes(p.n));
  const int64_t rows_per_block = int64_t(kGateRowsPerPass) * k.passes;
  const dim3 grid(unsigned((p.E + rows_per_block - 1) / rows_per_block), unsigned(token_chunks));
  launch_pdl(router_logits_kernel, grid, dim3(kLogitsWarps * 32), smem, stream, pdl, k);
}

void launch_route(const RouteParams& p, bool pdl, cudaStream_t stream) {
  DSV4_CHECK(p.E > 0 && p.E <= kMaxExperts, "moe route: ", p.E, " experts (supported: 1 .. ", kMaxExperts, ")");
  DSV4_CHECK(p.k > 0 && p.k <= kMaxTopK && p.k <= p.E, "moe route: top-", p.k, " of ", p.E,
             " experts (supported: k <= ", kMaxTopK, ")");
  DSV4_CHECK(p.n * p.k < (int64_t(1) << 30), "moe route: ", p.n, " tokens × ", p.k, " choices is too many");
  DSV4_CHECK((p.tid2eid != nullptr) == (p.tokens != nullptr), "moe route: hash routing needs both tid2eid and tokens");
  DSV4_CHECK(p.tid2eid != nullptr || p.gate_bias != nullptr, "moe route: scored routing needs gate.bias");
  DSV4_CHECK(0 <= p.expert_begin && p.expert_begin < p.expert_end && p.expert_end <= p.E, "moe route: local experts [",
             p.expert_begin, ", ", p.expert_end, ") of ", p.E);
  const int64_t blocks = route_blocks(p.n);
  if (blocks == 0 || p.plan.route_counts == nullptr) {
    launch_pdl(route_kernel, dim3(1), dim3(kRouteThreads), 0, stream, pdl, p);
    return;
  }
  launch_pdl(route_choose_kernel, dim3(unsigned(blocks)), dim3(kRouteThreads), 0, stream, pdl, p);
  launch_pdl(route_offsets_kernel, dim3(1), dim3(kRouteThreads), 0, stream, pdl, p);
  launch_pdl(route_place_kernel, dim3(unsigned(blocks)), dim3(kRouteThreads), 0, stream, pdl, p);
}

}  // namespace dsv4::cuda::moe
