// attention family (CUDA): CudaOps::attention, one softmax per query row and head over
// {sink_h} ∪ sliding-window keys (ring) ∪ compressed entries (CSA: selected ids, HCA: every visible entry),
// K = V, fp32 (spec §6.3–6.4; CPU reference: src/cpu/attention.cpp; fast numerics also round P and the output
// to bf16, below). Key rows come from fp32 buffers or from compact FP8 caches (reference and fast numerics),
// decoded exactly to the values the CPU holds (kv_cache.cuh).
//
// One launch covers a batch of sequences (Ops::attention): each block finds its query row's sequence in the
// parameters' table (up to kMaxSequences per launch) and reads that sequence's q, window, entries and output.
//
// NOTE: MQA layout. All H heads share the single K = V head, so a block takes 16 heads of one query row and a
// contiguous slice ("split") of that row's key list; key rows stream through shared memory in tiles of 32 and
// every row loaded is used by all 16 heads (QK: 4 heads × 4 keys per 8-thread group, PV: 4 heads × 8 channels
// per thread). Online softmax (running max m, denominator l) across tiles.
//   Decode (few rows): the key list is split across many blocks so that every SM works; each block writes an
//   unnormalised partial (o, m, l) and attn_combine_kernel merges the splits with the sink (flash-decoding) —
//   except on the warpgroup-MMA kernel, whose splits merge in a cluster (attention_wg.cu).
//   Prefill (many rows): one split per row; the block adds the sink, normalises and writes the output itself.
//
// Fast numerics (AttnKernelParams::fast; docs/design/fast-numerics.md §2.3, §7 step 10; CPU: attend_fast) on
// bf16-valued q and keys: the probabilities P multiply V rounded to bf16 while the denominator sums them in fp32,
// the sink joins the denominator only, and the output is rounded to bf16 (then, derotated, its rope channels
// again, as CpuOps::rope rounds). NOTE: the softmax runs in base-2 units against an integer running maximum, so
// P = 2^(u − M) rounds to the same bf16 values whatever the split and tile partition (bf16 rounding commutes
// with powers of two), equal to the CPU's. On compact FP8 caches of the V4 shapes the tensor-core kernels serve
// fast numerics (attention_wg.cu: 64-head blocks on Hopper; attention_tc.cu: the others); this kernel serves the
// rest.
//
#include <cmath>

#include "cuda/attention/attention.h"
#include "cuda/attention/attention.cuh"
#include "cuda/common/check.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/smem.h"

namespace dsv4 {
namespace cuda {
namespace {

using namespace attn;

constexpr int kHeadsPerBlock = 16;
constexpr int kTileKeys = 32;
constexpr int kAttnThreads = 256;
constexpr int kMinKeysPerSplit = 10;
constexpr int kCombineThreads = kMaxHeadDim / 4;  // one float4 column each
constexpr int kCombineBatch = 8;                  // partial loads in flight per combine thread

__device__ __forceinline__ float warp_max(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// grid (ceil(H/16), splits, rows), kAttnThreads threads, dynamic smem attn_smem_bytes(d).
// Block (g, s, r): heads 16g .. 16g+15 of launch row r over keys [s·keys_per_split, (s+1)·keys_per_split).
__global__ void __launch_bounds__(kAttnThreads, 2) attn_split_kernel(const __grid_constant__ AttnKernelParams p) {
  extern __shared__ float4 smem4[];
  const int d4 = p.head_dim / 4;
  float4* q_s = smem4;                            // [16][d/4] this block's query heads (zeros past the last)
  float4* k_s = q_s + kHeadsPerBlock * d4;        // [32][d/4] the current key tile (zeros for masked rows)
  // [32 keys][16 heads] logits, then probabilities (key-major: PV reads a head quad as one float4)
  float* p_s = reinterpret_cast<float*>(k_s + kTileKeys * d4);
  __shared__ const uint8_t* rows_s[kTileKeys];
  __shared__ float m_s[kHeadsPerBlock], l_s[kHeadsPerBlock], alpha_s[kHeadsPerBlock];
  __shared__ float2 rot_s[kMaxHeadDim / 2];  // the output's derotation (splits == 1)
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int head0 = blockIdx.x * kHeadsPerBlock, split = blockIdx.y, r = blockIdx.z;
  const AttnSequence& sq = sequence_of(p, r);
  const int64_t i = r - sq.row0, t = sq.pos0 + i;  // the row within its sequence, and its position
  const int heads_here = min(kHeadsPerBlock, p.heads - head0);
  const int64_t nw = window_keys(p.window_size, t);
  const int64_t total = nw + compressed_keys(sq.entries != nullptr, sq.selected != nullptr, p.top_k, p.ratio, t);
  const int64_t begin = int64_t(split) * p.keys_per_split;
  const int64_t end = total < begin + p.keys_per_split ? total : begin + p.keys_per_split;
  // Before waiting for the predecessor, what does not depend on it: the derotation's fp64 sin/cos (published
  // by the key loop's barriers).
  if (p.splits == 1) derotation_table(p, t, rot_s);
  pdl_wait();

  const int64_t q0 = (i * p.heads + head0) * p.head_dim;
  if (p.q_bf16) {  // bf16 query heads widened (exact), 4 a thread
    const uint2* q2 = reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(sq.q) + q0);
    for (int x = tid; x < kHeadsPerBlock * d4; x += kAttnThreads) {
      const uint2 v = x / d4 < heads_here ? q2[x] : make_uint2(0, 0);
      q_s[x] = make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xFFFF0000u), __uint_as_float(v.y << 16),
                           __uint_as_float(v.y & 0xFFFF0000u));
    }
  } else {
    const float4* q4 = reinterpret_cast<const float4*>(static_cast<const float*>(sq.q) + q0);
    for (int x = tid; x < kHeadsPerBlock * d4; x += kAttnThreads) {
      if (x / d4 < heads_here) cp_async16(q_s + x, q4 + x);
      else q_s[x] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  cp_async_commit();
  if (tid < kHeadsPerBlock) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
  }

  // QK roles: 8-thread group (hq, kq) computes heads 4hq..4hq+3 × keys 4kq..4kq+3, thread `slice` of the
  // group takes float4 columns slice, slice + 8, ... (8 consecutive float4 per access: no bank conflicts).
  // A warp holds the 4 groups of one kq, so skipping key quads past the tile is warp-uniform.
  const int qk_slice = tid % 8, qk_hq = (tid / 8) % 4, qk_kq = tid / 32;
  // PV roles: heads 4·pv_hq .. +3, float4 columns pv_col and pv_col + 64 (64 consecutive float4 per warp pair).
  const int pv_hq = tid / 64, pv_col = tid % 64;
  float4 acc[4][2];
  for (auto& a : acc) a[0] = a[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

  for (int64_t tile0 = begin; tile0 < end; tile0 += kTileKeys) {
    const int tile_keys = end - tile0 < kTileKeys ? int(end - tile0) : kTileKeys;
    __syncthreads();  // the previous tile's PV is done with k_s, p_s, rows_s
    if (tid < kTileKeys) rows_s[tid] = tid < tile_keys ? key_row(p, sq, i, t, nw, tile0 + tid) : nullptr;
    __syncthreads();
    for (int x = tid; x < tile_keys * d4; x += kAttnThreads) {
      const uint8_t* src = rows_s[x / d4];
      if (!src) k_s[x] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      else if (p.kv.format == CacheFormat::kFp8Kv) k_s[x] = load_fp8kv4(src, 4 * (x % d4), p.kv);
      else cp_async16(k_s + x, reinterpret_cast<const float4*>(src) + x % d4);
    }
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();

    // ---- logits s[h][key] = scale · q_h · k_key
    {
      float s[4][4] = {};
      if (qk_kq * 4 < tile_keys) {
#pragma unroll 2
        for (int f = qk_slice; f < d4; f += 8) {
          float4 qv[4], kv[4];
#pragma unroll
          for (int a = 0; a < 4; ++a) qv[a] = q_s[(qk_hq * 4 + a) * d4 + f];
#pragma unroll
          for (int b = 0; b < 4; ++b) kv[b] = k_s[(qk_kq * 4 + b) * d4 + f];
#pragma unroll
          for (int a = 0; a < 4; ++a)
#pragma unroll
            for (int b = 0; b < 4; ++b) {
              s[a][b] = fmaf(qv[a].x, kv[b].x, s[a][b]);
              s[a][b] = fmaf(qv[a].y, kv[b].y, s[a][b]);
              s[a][b] = fmaf(qv[a].z, kv[b].z, s[a][b]);
              s[a][b] = fmaf(qv[a].w, kv[b].w, s[a][b]);
            }
        }
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int b = 0; b < 4; ++b)
#pragma unroll
            for (int off = 1; off < 8; off <<= 1) s[a][b] += __shfl_xor_sync(0xffffffffu, s[a][b], off);
      }
      // Every slice holds all 16 sums; slice writes pairs (a, b) with a·4 + b ∈ {2·slice, 2·slice + 1}.
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b)
          if ((a * 4 + b) / 2 == qk_slice) {
            const int head = qk_hq * 4 + a, key = qk_kq * 4 + b;
            const bool live = key < tile_keys && rows_s[key] != nullptr && head < heads_here;
            p_s[key * kHeadsPerBlock + head] = live ? s[a][b] * p.scale : -INFINITY;
          }
    }
    __syncthreads();

    // ---- online softmax: warp w updates heads 2w, 2w + 1; lane = key. e is relative to the running maximum; in
    // fast numerics (base-2 units) to an integer one, P·V taking bf16(e), the denominator the fp32 e.
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int head = warp * 2 + hh;
      const float v = softmax_unit(p.fast, p_s[lane * kHeadsPerBlock + head]);
      const float m_tile = warp_max(v), m_old = m_s[head];
      const float m_new = fmaxf(m_old, p.fast ? ceilf(m_tile) : m_tile);
      const float e = m_new == -INFINITY ? 0.0f : softmax_exp(p.fast, v - m_new);
      const float sum = warp_sum(e);
      p_s[lane * kHeadsPerBlock + head] = round_bf16_if(p.fast, e);
      __syncwarp();  // every lane has read m_s[head] before lane 0 replaces it
      if (lane == 0) {
        const float alpha = m_new == -INFINITY ? 1.0f : softmax_exp(p.fast, m_old - m_new);
        alpha_s[head] = alpha;
        m_s[head] = m_new;
        l_s[head] = l_s[head] * alpha + sum;
      }
    }
    __syncthreads();

    // ---- acc = alpha · acc + Σ_key p · k
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      const float alpha = alpha_s[pv_hq * 4 + a];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        acc[a][r].x *= alpha;
        acc[a][r].y *= alpha;
        acc[a][r].z *= alpha;
        acc[a][r].w *= alpha;
      }
    }
#pragma unroll 4
    for (int key = 0; key < tile_keys; ++key) {
      const float4 p4 = reinterpret_cast<const float4*>(p_s)[key * (kHeadsPerBlock / 4) + pv_hq];
      const float pr[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int f = pv_col + 64 * r;
        if (f < d4) {
          const float4 kv = k_s[key * d4 + f];
#pragma unroll
          for (int a = 0; a < 4; ++a) {
            acc[a][r].x = fmaf(pr[a], kv.x, acc[a][r].x);
            acc[a][r].y = fmaf(pr[a], kv.y, acc[a][r].y);
            acc[a][r].z = fmaf(pr[a], kv.z, acc[a][r].z);
            acc[a][r].w = fmaf(pr[a], kv.w, acc[a][r].w);
          }
        }
      }
    }
  }
  cp_async_wait_all();  // a block without keys still has its q copy in flight
  __syncthreads();      // m_s / l_s final (also for blocks without keys)

  for (int a = 0; a < 4; ++a) {
    const int head = pv_hq * 4 + a;
    if (head >= heads_here) break;
    const float m = m_s[head], l = l_s[head];
    if (p.splits == 1) {
      // The sink joins the denominator only: out = Σ e^(s−M) k / (Σ e^(s−M) + e^(sink−M)), M over all.
      const float sink = softmax_unit(p.fast, p.sinks[head0 + head]), big = fmaxf(m, sink);
      const float keep = m == -INFINITY ? 0.0f : softmax_exp(p.fast, m - big);
      const float factor = keep / (l * keep + softmax_exp(p.fast, sink - big));
      const int64_t out = (i * p.heads + head0 + head) * p.head_dim;
      for (int r = 0; r < 2; ++r) {
        const int f = pv_col + 64 * r;
        if (f < d4)
          store_output(p, sq, out + 4 * f, output_column(p, rot_s, f, make_float4(acc[a][r].x * factor, acc[a][r].y * factor,
                                                                              acc[a][r].z * factor, acc[a][r].w * factor)));
      }
    } else {
      const int64_t part = (int64_t(r) * p.splits + split) * p.heads + head0 + head;  // [rows, splits, H]
      for (int r = 0; r < 2; ++r) {
        const int f = pv_col + 64 * r;
        if (f < d4) p.part_o[part * d4 + f] = acc[a][r];
      }
      if (pv_col == 0) p.part_ml[part] = make_float2(m, l);
    }
  }
}

// grid (H, rows), kCombineThreads threads: out[i, h] = Σ_s e^(m_s−M) o_s / (Σ_s e^(m_s−M) l_s + e^(sink−M)),
// M = max(sink, m_s) (fast numerics: base 2). Thread f owns float4 column f of every split; each thread finds
// M and the weights itself from the splits' (m, l) — the same values in every thread of the block (broadcast
// loads), so no reduction or barrier — and loads its partial columns kCombineBatch at a time.
// NOTE: small blocks, no shared state: a wide batch of rows × heads (batch 64: 4096 blocks) runs at the copy
// bandwidth; the old design (1024 threads per (row, head), split groups and block reductions, for one row's
// latency) took 114 µs a layer there for 3 splits, as long as the attention.
__global__ void __launch_bounds__(kCombineThreads) attn_combine_kernel(const __grid_constant__ AttnKernelParams p) {
  __shared__ float2 rot_s[kMaxHeadDim / 2];  // the output's derotation
  const int h = blockIdx.x, f = threadIdx.x, r = blockIdx.y, d4 = p.head_dim / 4;
  const AttnSequence& sq = sequence_of(p, r);
  const int64_t i = r - sq.row0;
  // What does not depend on the predecessor, before waiting for it: the sink (a weight: an HBM round trip at
  // decode) and the derotation's fp64 sin/cos.
  const float sink = softmax_unit(p.fast, p.sinks[h]);
  derotation_table(p, sq.pos0 + i, rot_s);
  __syncthreads();  // rot_s
  pdl_wait();
  const float2* ml = p.part_ml + int64_t(r) * p.splits * p.heads + h;               // split s at [s · H]
  const float4* o_col = p.part_o + (int64_t(r) * p.splits * p.heads + h) * d4 + f;  // split s at [s · H · d/4]
  const int64_t stride = int64_t(p.heads) * d4;
  float big = sink;
  for (int s = 0; s < p.splits; ++s) big = fmaxf(big, ml[int64_t(s) * p.heads].x);
  float denom = softmax_exp(p.fast, sink - big);
  float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int s0 = 0; s0 < p.splits; s0 += kCombineBatch) {
    float4 v[kCombineBatch];
    float2 st[kCombineBatch];
#pragma unroll
    for (int k = 0; k < kCombineBatch; ++k) {
      const bool here = s0 + k < p.splits;
      st[k] = here ? ml[int64_t(s0 + k) * p.heads] : make_float2(-INFINITY, 0.0f);
      v[k] = here && f < d4 ? o_col[(s0 + k) * stride] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int k = 0; k < kCombineBatch; ++k) {
      const float w = st[k].x == -INFINITY ? 0.0f : softmax_exp(p.fast, st[k].x - big);  // −inf: no live keys
      denom += st[k].y * w;
      o.x = fmaf(w, v[k].x, o.x);
      o.y = fmaf(w, v[k].y, o.y);
      o.z = fmaf(w, v[k].z, o.z);
      o.w = fmaf(w, v[k].w, o.w);
    }
  }
  if (f >= d4) return;
  const float inv = 1.0f / denom;
  store_output(p, sq, (i * p.heads + h) * p.head_dim + 4 * f,
               output_column(p, rot_s, f, make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv)));
}

size_t attn_smem_bytes(int64_t head_dim) {
  return size_t((kHeadsPerBlock + kTileKeys) * head_dim + kHeadsPerBlock * kTileKeys) * sizeof(float);
}

// Key counts never shrink with t (window and HCA parts grow, CSA's is fixed): the step's last row has the most.
int64_t max_keys(const AttentionParams& p) { return attention_keys(p, p.pos0 + p.n - 1); }
int64_t max_keys(std::span<const AttentionParams> batch) {
  int64_t keys = 0;
  for (const AttentionParams& p : batch) keys = std::max(keys, p.n > 0 ? max_keys(p) : 0);
  return keys;
}
int64_t total_rows(std::span<const AttentionParams> batch) {
  int64_t rows = 0;
  for (const AttentionParams& p : batch) rows += p.n;
  return rows;
}

// Whether the tensor-core kernel serves a batch whose first sequence is p0 (attention_tc.cu): fast numerics on
// compact FP8 caches of a head_dim it takes. Its blocks hold 16 or kTcHeads heads, and a split at least a tile.
bool use_tc(const CudaOps& ops, const AttentionParams& p0) {
  const CacheLayout* l = ops.compact_cache(p0.window);
  return ops.fast() && l && tc_fits(*l, p0.head_dim, ops.props().sharedMemPerBlockOptin);
}

// Whether the warpgroup-MMA kernel serves a tensor-core batch whose blocks hold hb heads in `splits` splits
// (attention_wg.cu).
bool use_wg(const CudaOps& ops, const CacheLayout& l, const AttentionParams& p0, int64_t hb, int splits) {
  return wg_fits(l, p0.head_dim, p0.heads, hb, splits, ops.props().major, ops.props().sharedMemPerBlockOptin);
}

// Heads per block: the fp32 kernel's kHeadsPerBlock, or the tensor-core kernel's 64 (every key tile decoded once
// for all of them) — 16 where even a block per 64-key tile would leave most SMs idle (a few decode rows: batch 1
// at context 0 had one block a layer, 23 µs, against 14 µs for the fp32 kernel's four).
int64_t heads_per_block(bool tc, int sms, int64_t rows, int64_t heads, int64_t keys) {
  if (!tc) return kHeadsPerBlock;
  return rows * ceil_div(heads, kTcHeads) * ceil_div(keys, kTcKeys) <= sms / 4 ? 16 : kTcHeads;
}

// Split count that gives every SM one block (one wave: a second wave's extra partials cost more than its
// shorter slices save; docs/design/attention.md) without slices under a minimum of keys. The tensor-core
// kernel (one block per SM) fills whole waves instead: ⌊SMs / blocks⌋ splits, and 2 up to a full wave
// (bench_attention, 32K CSA, H100: batch 64 at 1 / 2 / 3 / 4 splits 105 / 83 / 118 / 106 µs, batch 128
// 204 / 161 / 233 / 208 µs).
int64_t heuristic_splits(int sms, int64_t blocks_per_split, int64_t keys, bool tc) {
  if (tc) {
    if (blocks_per_split > sms) return 1;
    const int64_t want = std::min<int64_t>(std::max<int64_t>(2, sms / blocks_per_split), kMaxSplits);
    return std::max<int64_t>(1, std::min(want, ceil_div(keys, kTcKeys)));
  }
  if (blocks_per_split >= sms) return 1;
  const int64_t want = std::min<int64_t>(ceil_div(sms, blocks_per_split), kMaxSplits);
  return std::max<int64_t>(1, std::min(want, ceil_div(keys, kMinKeysPerSplit)));
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

int64_t attention_keys(const AttentionParams& p, int64_t t) {
  return window_keys(p.window_size, t) +
         compressed_keys(p.entries != nullptr, p.selected != nullptr, p.top_k, p.ratio, t);
}

const char* attention_kernel(const CudaOps& ops, std::span<const AttentionParams> batch) {
  if (batch.empty() || !use_tc(ops, batch[0])) return "fp32";
  const int64_t hb = heads_per_block(true, ops.props().multiProcessorCount, total_rows(batch), batch[0].heads,
                                     max_keys(batch));
  const int splits = attention_default_splits(ops, batch);
  return use_wg(ops, *ops.compact_cache(batch[0].window), batch[0], hb, splits) ? "wg" : "tc";
}

int attention_default_splits(const CudaOps& ops, std::span<const AttentionParams> batch) {
  if (batch.empty()) return 1;
  const bool tc = use_tc(ops, batch[0]);
  const int sms = ops.props().multiProcessorCount;
  const int64_t rows = total_rows(batch), keys = max_keys(batch);
  const int64_t hb = heads_per_block(tc, sms, rows, batch[0].heads, keys);
  const int64_t splits = heuristic_splits(sms, ceil_div(batch[0].heads, hb) * rows, keys, tc);
  // The warpgroup-MMA kernel merges its splits in a cluster, at most kWgMaxSplits: fewer splits there beat more on
  // the mma.sync kernel and its combine (bench_attention, batch 8 at 32K: 8 asked, 5 of whole tiles, 22.5 µs
  // against 29.0 at 10; docs/design/attention.md).
  if (tc && splits > kWgMaxSplits && use_wg(ops, *ops.compact_cache(batch[0].window), batch[0], hb, kWgMaxSplits))
    return kWgMaxSplits;
  return int(splits);
}

namespace {

// One sequence's parameters, checked alone and against the batch's first (every field but its rows,
// positions and caches is shared); returns its cache layout (nullptr: fp32 rows).
const CacheLayout* check_sequence(const CudaOps& ops, const AttentionParams& p, const AttentionParams& first) {
  DSV4_CHECK(p.n >= 0 && p.heads >= 1 && p.pos0 >= 0, "attention: n ", p.n, ", heads ", p.heads, ", pos0 ", p.pos0);
  DSV4_CHECK(p.head_dim >= 4 && p.head_dim <= kMaxHeadDim && p.head_dim % 4 == 0, "attention: head_dim ",
             p.head_dim, " (the CUDA kernel takes multiples of 4 up to ", kMaxHeadDim, ")");
  DSV4_CHECK(p.window_size >= 1 && p.ring_slots >= p.window_size + p.n - 1, "attention: a ring of ",
             p.ring_slots, " slots cannot hold window ", p.window_size, " for a step of ", p.n, " tokens");
  DSV4_CHECK(!p.entries || p.ratio >= 1, "attention: compressed entries need ratio >= 1, got ", p.ratio);
  DSV4_CHECK(!p.entries || !p.selected || p.top_k >= 0, "attention: top_k ", p.top_k);
  DSV4_CHECK((p.q != nullptr) != (p.q_bf16 != nullptr) && p.window && p.sinks &&
                 (p.out != nullptr) != (p.out_bf16 != nullptr),
             "attention: one query (q or q_bf16), window, sinks and one output (out or out_bf16) are required");
  DSV4_CHECK((!p.out_bf16 && !p.q_bf16) || ops.fast(), "attention: bf16 query heads or output outside fast numerics");
  DSV4_CHECK(aligned16(p.q) && aligned16(p.window) && aligned16(p.out) && aligned16(p.out_bf16) &&
                 (!p.entries || aligned16(p.entries)) && reinterpret_cast<uintptr_t>(p.q_bf16) % 8 == 0,
             "attention: q, window, entries and out must be 16-byte aligned, bf16 query heads 8-byte aligned");
  DSV4_CHECK(p.heads == first.heads && p.head_dim == first.head_dim && p.ring_slots == first.ring_slots &&
                 p.window_size == first.window_size && p.top_k == first.top_k && p.ratio == first.ratio &&
                 p.sinks == first.sinks && p.scale == first.scale && p.derotate == first.derotate &&
                 p.rope == first.rope && (p.out_bf16 != nullptr) == (first.out_bf16 != nullptr) &&
                 (p.q_bf16 != nullptr) == (first.q_bf16 != nullptr),
             "attention: the sequences of one batch differ in more than their rows, positions and caches");
  DSV4_CHECK(p.n <= 65535, "attention: ", p.n, " query rows of one sequence in one step (at most 65535)");
  // The window and the entries are both compact (reference numerics) or both fp32.
  const CacheLayout* window_layout = ops.compact_cache(p.window);
  const CacheLayout* entries_layout = p.entries ? ops.compact_cache(p.entries) : window_layout;
  DSV4_CHECK(!window_layout == !entries_layout, "attention: the window and the entries must share a cache format");
  if (window_layout) {
    DSV4_CHECK(window_layout->format == CacheFormat::kFp8Kv && window_layout->dim == p.head_dim &&
                   window_layout->rows >= p.ring_slots && entries_layout->row_bytes == window_layout->row_bytes,
               "attention: compact caches must be FP8 KV rows of head_dim ", p.head_dim);
  }
  return window_layout;
}

}  // namespace

void attention_split_kv(CudaOps& ops, std::span<const AttentionParams> batch, int splits) {
  DSV4_CHECK(splits >= 1 && splits <= kMaxSplits, "attention: ", splits, " key splits (1..", kMaxSplits, ")");
  if (batch.empty()) return;
  const AttentionParams& p0 = batch[0];
  const CacheLayout* layout = check_sequence(ops, p0, p0);
  const bool tc = use_tc(ops, p0);
  for (const AttentionParams& p : batch) {
    const CacheLayout* l = check_sequence(ops, p, p0);
    DSV4_CHECK(!l == !layout && (!l || l->row_bytes == layout->row_bytes),
               "attention: the sequences of one batch must share a cache format");
    DSV4_CHECK(!tc || aligned16(p.q_bf16), "attention: bf16 query heads for the tensor-core kernel must be 16-byte "
               "aligned");  // its rows (d a multiple of 64) are then too
  }
  const int64_t rows_total = total_rows(batch);
  if (rows_total == 0) return;

  const int64_t keys = max_keys(batch);
  // The tensor-core kernel's splits hold whole tiles (its work comes in tiles; the rounding does not care).
  const int64_t align = tc ? kTcKeys : 1;
  const int64_t keys_per_split = std::max<int64_t>(1, ceil_div(ceil_div(keys, splits), align) * align);
  splits = int(std::max<int64_t>(1, ceil_div(keys, keys_per_split)));  // no split left without keys
  const int64_t hb = heads_per_block(tc, ops.props().multiProcessorCount, rows_total, p0.heads, keys);
  const int64_t groups = ceil_div(p0.heads, hb);

  AttnKernelParams k{};
  if (layout) k.kv = *layout;
  k.row_bytes = layout ? layout->row_bytes : p0.head_dim * int64_t(sizeof(float));
  k.sinks = ops.dev_floats(p0.sinks);
  k.ring_slots = p0.ring_slots;
  k.window_size = p0.window_size;
  k.top_k = p0.top_k;
  k.ratio = p0.ratio;
  k.heads = int(p0.heads);
  k.head_dim = int(p0.head_dim);
  k.splits = splits;
  k.keys_per_split = int(keys_per_split);
  k.scale = p0.scale;
  k.fast = ops.fast();
  k.out_bf16 = p0.out_bf16 != nullptr;
  k.q_bf16 = p0.q_bf16 != nullptr;
  k.tc_heads = int(hb);
  if (p0.derotate) {
    const int64_t rope_dim = ops.config().rope_dim;
    DSV4_CHECK(rope_dim >= 4 && rope_dim % 4 == 0 && rope_dim <= p0.head_dim, "attention: derotating ", rope_dim,
               " rope channels of ", p0.head_dim, " (needs a multiple of 4)");
    k.inv_freq = ops.inv_freq(p0.rope);
    k.rope_offset = int(p0.head_dim - rope_dim);
  }
  // Launches of up to kMaxSequences sequences and 65535 rows (grid.z).
  const int64_t max_rows = std::min<int64_t>(rows_total, 65535);
  const bool wg = tc && use_wg(ops, *layout, p0, hb, splits);  // V4's shape on Hopper; merges its own splits
  if (splits > 1 && !wg) {
    // Sized for the most splits the heuristic can pick at this many rows, so decode does not regrow it as the
    // context deepens: with the fewest head groups (the tensor-core kernel's 64-head blocks, which a deeper
    // context switches to from 16-head ones), any key count.
    const int64_t sms = ops.props().multiProcessorCount;
    const int64_t fewest_groups = tc ? ceil_div(p0.heads, kTcHeads) : groups;
    const int64_t cap =
        std::max<int64_t>(splits, heuristic_splits(int(sms), fewest_groups * max_rows, INT64_MAX / 4, tc));
    const size_t o_bytes = size_t(max_rows * cap * p0.heads * p0.head_dim) * sizeof(float);
    const size_t ml_bytes = size_t(max_rows * cap * p0.heads) * sizeof(float2);
    auto* base = static_cast<char*>(ops.workspace(kWsAttentionPartials, o_bytes + ml_bytes));
    k.part_o = reinterpret_cast<float4*>(base);
    k.part_ml = reinterpret_cast<float2*>(base + o_bytes);
  }

  const size_t smem = attn_smem_bytes(p0.head_dim);
  allow_dynamic_smem(reinterpret_cast<const void*>(attn_split_kernel), int(attn_smem_bytes(kMaxHeadDim)));
  const bool pdl = ops.props().major >= 9;
  const auto launch = [&] {
    if (k.rows == 0) return;
    const dim3 grid(unsigned(groups), unsigned(splits), unsigned(k.rows));
    if (wg) launch_wg(k, grid, ops.stream(), pdl);
    else if (tc) launch_tc(k, grid, ops.stream(), pdl);
    else launch_pdl(attn_split_kernel, grid, dim3(kAttnThreads), smem, ops.stream(), pdl, k);
    if (splits > 1 && !wg)
      launch_pdl(attn_combine_kernel, dim3(unsigned(p0.heads), unsigned(k.rows)), dim3(kCombineThreads), 0,
                 ops.stream(), pdl, k);
    k.rows = 0;
    k.sequences = 0;
  };
  for (const AttentionParams& p : batch) {
    if (p.n == 0) continue;
    if (k.sequences == kMaxSequences || k.rows + p.n > max_rows) launch();
    void* out = p.out_bf16 ? static_cast<void*>(p.out_bf16) : static_cast<void*>(p.out);
    const void* q = p.q_bf16 ? static_cast<const void*>(p.q_bf16) : static_cast<const void*>(p.q);
    k.seq[k.sequences++] = {q, out, p.entries ? p.selected : nullptr, reinterpret_cast<const uint8_t*>(p.window),
                            reinterpret_cast<const uint8_t*>(p.entries), p.pos0, k.rows, int32_t(p.n)};
    k.rows += int(p.n);
  }
  launch();
}

}  // namespace cuda

void CudaOps::attention(std::span<const AttentionParams> batch) {
  cuda::attention_split_kv(*this, batch, cuda::attention_default_splits(*this, batch));
}

}  // namespace dsv4
