// attention family (CUDA): CudaOps::indexer_topk, the lightning indexer's scores and top-k (spec §8; CPU
// reference: src/cpu/attention.cpp).
//
//   s(t, e) = Σ_h w[t, h] · relu(q[t, h] · key[e])   for the visible entries e < (t + 1) / ratio,
//   selected[t] = the min(top_k, visible) best e, by score descending then index ascending; −1 padded.
//
// One launch of each kernel covers a batch of sequences (Ops::indexer_topk): a block finds its query row's
// sequence in the parameters' table (up to kMaxSequences per launch) and reads that sequence's queries, weights,
// keys and selection.
//
// NOTE: the scores are computed in the CPU's exact order and rounding (each product rounded, then added: the
// reference is built without FMA contraction; dot over j in order, then the head sum in order), so they are
// bit-identical to the CPU's and the selection — order included — is the CPU's, ties and near-ties too. This
// costs a multiply and an add per term instead of one FMA. Fast numerics (ScoreParams::fast; fast-numerics.md
// §7 step 9) round at the CPU's points: each head's dot to bf16 before the ReLU, each weighted term to bf16, the
// head sum (fp32, in head order) to bf16 — still bit-identical, so the many exact ties of bf16 scores resolve
// as on the CPU (the lower entry index first).
//
// Tensor cores (indexer_score_tc_kernel): fast numerics on compact FP4 keys. q (Hadamard-rotated, FP4-simulated)
// and the keys are e2m1 values times power-of-two block scales, exact in bf16, so the bf16 MMA's products are
// exact; their sums are exact too whenever every partial sum is an fp32 value — the products lie on the grid of
// the smallest combined block exponent (q's + the key's, per 32 channels), so a spread of those exponents of at
// most 10 (d = 64) down to 8 (d = 256) suffices (Hadamard-rotated rows spread 1–3) — and then equal the CPU's
// sequential sums bit for bit, whatever the tensor cores' accumulation truncates. The rounding points after the
// dot are the CPU's (bf16 dot, bf16 weighted term, the head sum in head order, bf16).
//
// Selection: a radix select on 64-bit composites (order-preserving score bits << 32 | ~index), so every
// composite is distinct and "larger" is exactly the CPU's order. The score kernel histograms the top 11 bits;
// the select kernel (one block per row) keeps the bins above the k-th composite's bin, gathers that bin's
// members into shared memory (or rescans the row when the bin is too big) and resolves the remaining bits
// 11 at a time, then sorts the k winners (bitonic, in shared memory).
#include <algorithm>
#include <cstdint>

#include "cuda/attention/attention.h"
#include "cuda/attention/kv_cache.cuh"
#include "cuda/common/barrier.cuh"
#include "cuda/common/fp_grid.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/sequence_table.cuh"
#include "cuda/common/smem.h"
#include "cuda/common/check.h"
#include "cuda/cuda_ops.h"

namespace dsv4 {
namespace cuda {
namespace {

constexpr int kMaxIndexerHeads = 64;
constexpr int kMaxScoreThreads = 1024;
// The score kernel's shapes: H heads per thread (H independent dot chains), up to max_entries(H) entries per
// block (kMaxIndexerHeads / H head groups per entry). Decode rows: H = 2 and 8–32 entries, small blocks over
// every SM; prefill batches: H = 8 and 64 entries, so that each block's staged q serves more work.
constexpr int max_entries(int H) { return std::min(64, kMaxScoreThreads * H / kMaxIndexerHeads); }
constexpr int kPrefillHeads = 8, kDecodeHeads = 2;
constexpr int64_t kDecodeMaxRows = 4;                        // rows of a launch batch that take the decode shape
constexpr int kMaxIndexerHeadDim = 256;                      // q of all heads in shared memory: ≤ 64 KiB
constexpr int kBins = 2048;                                  // 11-bit radix digits
constexpr int kTopBitsShift = 32 - 11;                       // the score kernel's digit: key bits 31..21
constexpr int kSelectThreads = kBins / 2;                    // pick_bin: two bins per thread
constexpr int kMaxTopK = 2048;
constexpr int kCandidates = 8192;                            // one bin's members kept in shared memory
constexpr int kSelectBatch = 4;                              // row loads in flight per thread
constexpr size_t kScoreBudgetBytes = size_t(32) << 20;      // score rows per launch batch
constexpr int kMaxSequences = 64;  // per launch: the table stays within the 4 KB of classic kernel parameters

// One sequence of a launch (or a run of its rows, when its rows span launches): its query rows are the launch's
// rows [row0, row0 + n), at positions pos0 ...
struct IndexerSequence {
  const float* q;        // [n, heads, head_dim]
  const float* weights;  // [n, heads]
  const float* keys;     // [*, head_dim] fp32 rows, or a compact kFp4Keys cache (the launch's key_layout)
  int32_t* selected;     // [n, top_k]
  int64_t pos0;
  int32_t row0, n;
};

struct IndexerKernelParams {
  CacheLayout key_layout;  // compact keys: their layout; kF32: rows of head_dim floats
  uint32_t* score_keys;    // [rows, v_stride] order-preserving bits of each score
  uint32_t* hist;          // [rows, kBins] counts of the score keys' top 11 bits (zero on entry: select re-zeroes)
  int64_t ratio, v_stride, top_k;
  int heads, head_dim;
  int entries;             // entries per score block, ≤ max_entries(H)
  bool fast;               // fast numerics: bf16 dots, terms and scores (see the top of the file)
  int sequences;
  IndexerSequence seq[kMaxSequences];
};
static_assert(sizeof(IndexerKernelParams) <= 4096, "indexer_topk: the kernel parameters exceed 4 KB");

// The sequence of launch row r (a binary search of the table's row0, uniform across the block).
__device__ __forceinline__ const IndexerSequence& sequence_of(const IndexerKernelParams& p, int64_t r) {
  return sequence_at(p.seq, p.sequences, r, &IndexerSequence::row0);
}

// Float bits → unsigned with the same order (−0 folded onto +0, which the CPU's comparison treats as equal).
__device__ __forceinline__ uint32_t order_key(float f) {
  uint32_t u = __float_as_uint(f);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Larger composite = earlier in the CPU's order (higher score, then lower index).
__device__ __forceinline__ uint64_t composite(uint32_t key, int64_t e) {
  return (uint64_t(key) << 32) | uint64_t(~uint32_t(e));
}
__device__ __forceinline__ int32_t composite_index(uint64_t v) { return int32_t(~uint32_t(v)); }

// Staged key rows are key_stride4(d4) float4 apart: an odd count, so the 8 lanes of a quarter warp reading 16 bytes
// of 8 consecutive rows hit distinct banks.
__host__ __device__ constexpr int key_stride4(int d4) { return d4 % 2 == 0 ? d4 + 1 : d4; }
size_t score_smem_bytes(int heads, int head_dim, int entries) {
  const int d4 = head_dim / 4;
  return size_t(heads * d4 + entries * key_stride4(d4)) * sizeof(float4);
}

// grid (ceil(visible_max / entries), rows of the launch), entries · ceil(heads / kHeadsPerThread) threads,
// dynamic smem score_smem_bytes. Thread (entry el, head group g) runs the dot products of its kHeadsPerThread
// heads against key[e0 + el]; the head sum then goes in order through shared memory. The block's keys are decoded
// into shared memory first, a warp reading consecutive channels of one row. At decode (few rows in the launch)
// blocks are small (entries chosen per launch so that the grid spans the SMs): the work per thread is a serial
// chain (the CPU's order), so a few large blocks (64 entries × 8 heads per thread, 16 SMs busy at context 4096)
// took as long however few entries there were (docs/design/attention.md).
template <int kHeadsPerThread>
__global__ void __launch_bounds__(kMaxScoreThreads)
indexer_score_kernel(const __grid_constant__ IndexerKernelParams p) {
  extern __shared__ float4 score_smem[];  // q [heads][d4], then keys [entries][key_stride4(d4)]
  __shared__ float w_s[kMaxIndexerHeads];
  __shared__ float term_s[max_entries(kHeadsPerThread)][kMaxIndexerHeads + 1];  // +1: conflict-free column access
  __shared__ uint32_t hist_s[kBins];
  pdl_wait();

  const int entries = p.entries, threads = int(blockDim.x);
  const int64_t r = blockIdx.y;
  const IndexerSequence& sq = sequence_of(p, r);
  const int64_t i = r - sq.row0, visible = (sq.pos0 + i + 1) / p.ratio;
  const int64_t e0 = int64_t(blockIdx.x) * entries;
  if (e0 >= visible) return;  // the whole block: rows other than the launch's longest see fewer entries
  const int tid = threadIdx.x, d4 = p.head_dim / 4, ks4 = key_stride4(d4);
  float4* q_s = score_smem;
  float4* k_s = score_smem + p.heads * d4;
  const float4* q4 = reinterpret_cast<const float4*>(sq.q + i * p.heads * p.head_dim);
  for (int x = tid; x < p.heads * d4; x += threads) q_s[x] = q4[x];
  for (int h = tid; h < p.heads; h += threads) w_s[h] = sq.weights[i * p.heads + h];
  for (int b = tid; b < kBins; b += threads) hist_s[b] = 0;
  const int n_keys = int(visible - e0 < entries ? visible - e0 : entries);
  const bool compact = p.key_layout.format == CacheFormat::kFp4Keys;
  for (int x = tid; x < n_keys * d4; x += threads) {
    const int el = x / d4, j4 = x % d4;
    const int64_t e = e0 + el;
    k_s[el * ks4 + j4] = compact ? load_fp4key4(reinterpret_cast<const uint8_t*>(sq.keys) + e * p.key_layout.row_bytes,
                                                4 * j4, p.key_layout)
                                 : __ldg(reinterpret_cast<const float4*>(sq.keys + e * p.head_dim) + j4);
  }
  __syncthreads();

  // The 8 lanes of a quarter warp = 8 entries of one head group: q reads are broadcasts, key rows odd-strided.
  const int el = tid % entries, group = tid / entries;
  const int64_t e = e0 + el;
  float dot[kHeadsPerThread];
#pragma unroll
  for (int hh = 0; hh < kHeadsPerThread; ++hh) dot[hh] = 0.0f;
  if (e < visible) {
    const float4* key = k_s + el * ks4;
    const float4* q_h[kHeadsPerThread];
#pragma unroll
    for (int hh = 0; hh < kHeadsPerThread; ++hh) q_h[hh] = q_s + (group * kHeadsPerThread + hh) * d4;
#pragma unroll 4
    for (int j4 = 0; j4 < d4; ++j4) {
      const float4 k = key[j4];
#pragma unroll
      for (int hh = 0; hh < kHeadsPerThread; ++hh) {
        if (group * kHeadsPerThread + hh < p.heads) {
          const float4 q = q_h[hh][j4];
          dot[hh] = __fadd_rn(dot[hh], __fmul_rn(q.x, k.x));
          dot[hh] = __fadd_rn(dot[hh], __fmul_rn(q.y, k.y));
          dot[hh] = __fadd_rn(dot[hh], __fmul_rn(q.z, k.z));
          dot[hh] = __fadd_rn(dot[hh], __fmul_rn(q.w, k.w));
        }
      }
    }
  }
#pragma unroll
  for (int hh = 0; hh < kHeadsPerThread; ++hh) {
    const int h = group * kHeadsPerThread + hh;
    const float d = round_bf16_if(p.fast, dot[hh]);
    // std::max(d, 0.0f) is (d < 0 ? 0 : d)
    if (h < p.heads) term_s[el][h] = round_bf16_if(p.fast, __fmul_rn(w_s[h], d < 0.0f ? 0.0f : d));
  }
  __syncthreads();
  if (tid < entries && e0 + tid < visible) {
    float total = 0.0f;
    for (int h = 0; h < p.heads; ++h) total = __fadd_rn(total, term_s[tid][h]);
    const uint32_t key = order_key(round_bf16_if(p.fast, total));
    p.score_keys[r * p.v_stride + e0 + tid] = key;
    atomicAdd(&hist_s[key >> kTopBitsShift], 1u);
  }
  __syncthreads();
  for (int b = tid; b < kBins; b += threads)
    if (hist_s[b]) atomicAdd(&p.hist[r * kBins + b], hist_s[b]);
}

// ---- scores on the tensor cores

constexpr int kTcTile = 64;       // entries per MMA tile: 8 n-tiles of 8
constexpr int kTcScoreWarps = 4;  // warp w: heads 16w .. 16w + 15 (one MMA row tile)
constexpr int kTcMaxTiles = 4;    // tiles per block: q staged once for up to 256 entries
// A thread's key items (8 channels each) per tile, kTcTile · head_dim / 8 / threads: the kernel is instantiated for
// head_dim ≤ 128 and ≤ 256, so that a small head does not hold (and spill) registers for the largest.
constexpr int tc_key_items(int head_dim) { return kTcTile * (head_dim / 8) / (kTcScoreWarps * 32); }

// Byte offset of 16-byte chunk c of row r in a matrix of `chunks` chunks per row (a multiple of 8), stored at
// c ^ (r % 8): ldmatrix's 8 rows of one chunk column fall in 8 bank groups.
__device__ __forceinline__ int tc_swz(int r, int c, int chunks) { return (r * chunks + (c ^ (r & 7))) * 16; }

__device__ __forceinline__ uint32_t tc_bf16x2(float lo, float hi) {
  const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// The terms are bf16 values, kept as bf16: a row of kTcTermStride (33 words: a thread per entry reads its row
// without bank conflicts). q_s, k_s and term_s then leave four blocks an SM room at head_dim 128.
constexpr int kTcTermStride = kMaxIndexerHeads + 2;
size_t tc_score_smem_bytes(int head_dim) {
  return size_t(kMaxIndexerHeads + kTcTile) * size_t(head_dim) * 2 + sizeof(__nv_bfloat16) * kTcTile * kTcTermStride;
}

// grid (ceil(visible_max / entries), rows of the launch), kTcScoreWarps warps, dynamic smem tc_score_smem_bytes;
// p.entries = kTcTile · tiles. Block (b, r): entries [b·entries, (b+1)·entries) of row r, a tile at a time: the
// tile's FP4 rows decoded to bf16 in shared memory, S = q · keysᵀ [heads, 64] by mma.sync m16n8k16 (warp w one
// row tile of 16 heads), each term bf16(w_h · relu(bf16(S))) into term_s, then a thread per entry sums its
// terms in head order.
template <int kTcKeyItems>
__global__ void __launch_bounds__(kTcScoreWarps * 32)
indexer_score_tc_kernel(const __grid_constant__ IndexerKernelParams p) {
  extern __shared__ __align__(16) uint8_t tc_smem[];
  __shared__ float w_s[kMaxIndexerHeads];
  __shared__ uint32_t hist_s[kBins];
  __shared__ float e2m1_s[16];  // e2m1_value of each code: the keys' decode is a lookup and a multiply a value
  if (threadIdx.x < 16) e2m1_s[threadIdx.x] = e2m1_value(threadIdx.x);
  pdl_wait();
  const int64_t r = blockIdx.y;
  const IndexerSequence& sq = sequence_of(p, r);
  const int64_t i = r - sq.row0, visible = (sq.pos0 + i + 1) / p.ratio;
  const int64_t e_first = int64_t(blockIdx.x) * p.entries;
  if (e_first >= visible) return;  // the whole block: rows other than the launch's longest see fewer entries
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, c = lane % 4;
  const int d = p.head_dim, chunks = d / 8, mtiles = (p.heads + 15) / 16;
  uint8_t* q_s = tc_smem;                                                             // [64 heads][d] bf16
  uint8_t* k_s = q_s + kMaxIndexerHeads * d * 2;                                      // [64 entries][d] bf16
  __nv_bfloat16* term_s = reinterpret_cast<__nv_bfloat16*>(k_s + kTcTile * d * 2);   // [64][kTcTermStride]
  // q (FP4-simulated fp32) as bf16, exactly; heads past the last of the row tiles are not read. A thread's items
  // (8 channels each, as many as its key items) are loaded kTcQBatch at a time, all of a batch in flight at once.
  const float* q = sq.q + i * p.heads * d;
  constexpr int kTcQBatch = 4;
  static_assert(kTcKeyItems % kTcQBatch == 0, "the q staging's batches cover a thread's items");
#pragma unroll
  for (int j0 = 0; j0 < kTcKeyItems; j0 += kTcQBatch) {
    float4 qv[2 * kTcQBatch];
#pragma unroll
    for (int j = 0; j < kTcQBatch; ++j) {
      const int x = tid + (j0 + j) * kTcScoreWarps * 32, h = x / chunks, ch = x % chunks;
      qv[2 * j] = qv[2 * j + 1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (h < p.heads) {
        qv[2 * j] = reinterpret_cast<const float4*>(q + h * d + 8 * ch)[0];
        qv[2 * j + 1] = reinterpret_cast<const float4*>(q + h * d + 8 * ch)[1];
      }
    }
#pragma unroll
    for (int j = 0; j < kTcQBatch; ++j) {
      const int x = tid + (j0 + j) * kTcScoreWarps * 32, h = x / chunks, ch = x % chunks;
      const float4 a = qv[2 * j], b = qv[2 * j + 1];
      if (x < 16 * mtiles * chunks)
        *reinterpret_cast<uint4*>(q_s + tc_swz(h, ch, chunks)) =
            make_uint4(tc_bf16x2(a.x, a.y), tc_bf16x2(a.z, a.w), tc_bf16x2(b.x, b.y), tc_bf16x2(b.z, b.w));
    }
  }
  for (int h = tid; h < p.heads; h += kTcScoreWarps * 32) w_s[h] = sq.weights[i * p.heads + h];
  for (int b = tid; b < kBins; b += kTcScoreWarps * 32) hist_s[b] = 0;
  const uint8_t* keys = reinterpret_cast<const uint8_t*>(sq.keys);
  const CacheLayout& l = p.key_layout;
  // A tile's FP4 keys, loaded into registers before any is decoded: 8 channels per item (4 bytes of e2m1 pairs,
  // the low nibble first, and their 32-channel scale byte), item x = tid + j · threads, all of a thread's loads
  // in flight at once (one load, then its use, per item cost a dependent L2 / HBM round trip each: 37% of the
  // kernel's stall samples at batch 8, 32K).
  const int items = kTcTile * chunks;
  uint32_t codes[kTcKeyItems];
  uint32_t scales[kTcKeyItems / 4] = {};  // item j's scale byte in byte j % 4 of word j / 4
  const auto load_keys = [&](int64_t e0) {
    const int n_keys = int(visible - e0 < kTcTile ? visible - e0 : kTcTile);
#pragma unroll
    for (int j = 0; j < kTcKeyItems; ++j) {
      const int x = tid + j * kTcScoreWarps * 32, el = x / chunks, ch = x % chunks;
      if (j % 4 == 0) scales[j / 4] = 0;
      codes[j] = 0;
      if (x < items && el < n_keys) {
        const uint8_t* row = keys + (e0 + el) * l.row_bytes;
        codes[j] = *reinterpret_cast<const uint32_t*>(row + 4 * ch);
        scales[j / 4] |= uint32_t(row[l.scales + ch / 4]) << (8 * (j % 4));
      }
    }
  };
  for (int64_t e0 = e_first; e0 < visible && e0 < e_first + p.entries; e0 += kTcTile) {
    const int n_keys = int(visible - e0 < kTcTile ? visible - e0 : kTcTile);
    load_keys(e0);
    __syncthreads();  // the previous tile's keys and terms are consumed (and, first, q_s / w_s / hist_s / e2m1_s written)
    // Past the tile's keys the items decode to zeros (codes 0).
#pragma unroll
    for (int j = 0; j < kTcKeyItems; ++j) {
      const int x = tid + j * kTcScoreWarps * 32, el = x / chunks, ch = x % chunks;
      if (x >= items) break;
      const float s = e8m0_value((scales[j / 4] >> (8 * (j % 4))) & 0xFFu);
      float f[8];
#pragma unroll
      for (int b = 0; b < 8; ++b) f[b] = e2m1_s[(codes[j] >> (4 * b)) & 0xFu] * s;
      *reinterpret_cast<uint4*>(k_s + tc_swz(el, ch, chunks)) =
          make_uint4(tc_bf16x2(f[0], f[1]), tc_bf16x2(f[2], f[3]), tc_bf16x2(f[4], f[5]), tc_bf16x2(f[6], f[7]));
    }
    __syncthreads();

    if (warp < mtiles) {
      float acc[8][4] = {};
      const int a_row = 16 * warp + lane % 16, b_row = lane % 8 + 8 * (lane / 16);
      for (int ks = 0; ks < chunks / 2; ++ks) {
        uint32_t a[4];
        ldmatrix_x4(a, q_s + tc_swz(a_row, 2 * ks + lane / 16, chunks));
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t b[4];
          ldmatrix_x4(b, k_s + tc_swz(16 * j + b_row, 2 * ks + (lane / 8) % 2, chunks));
          mma_bf16(acc[2 * j], a[0], a[1], a[2], a[3], b[0], b[1]);
          mma_bf16(acc[2 * j + 1], a[0], a[1], a[2], a[3], b[2], b[3]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = 16 * warp + g + 8 * (e / 2), el = 8 * nt + 2 * c + e % 2;
          if (h < p.heads) {
            const float dd = round_bf16(acc[nt][e]);
            term_s[el * kTcTermStride + h] = __float2bfloat16_rn(__fmul_rn(w_s[h], dd < 0.0f ? 0.0f : dd));
          }
        }
    }
    __syncthreads();
    if (tid < n_keys) {
      float total = 0.0f;
      for (int h = 0; h < p.heads; ++h) total = __fadd_rn(total, __bfloat162float(term_s[tid * kTcTermStride + h]));
      const uint32_t key = order_key(round_bf16(total));
      p.score_keys[r * p.v_stride + e0 + tid] = key;
      atomicAdd(&hist_s[key >> kTopBitsShift], 1u);
    }
  }
  __syncthreads();
  for (int b = tid; b < kBins; b += kTcScoreWarps * 32)
    if (hist_s[b]) atomicAdd(&p.hist[r * kBins + b], hist_s[b]);
}

// Slot for this lane in a shared list (warp-aggregated: one atomic per warp). All 32 lanes must call.
__device__ __forceinline__ uint32_t append_slot(bool flag, uint32_t* count) {
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  if (ballot == 0) return 0;
  const int lane = threadIdx.x % 32, leader = __ffs(ballot) - 1;
  uint32_t base = 0;
  if (lane == leader) base = atomicAdd(count, uint32_t(__popc(ballot)));
  base = __shfl_sync(0xffffffffu, base, leader);
  return base + uint32_t(__popc(ballot & ((1u << lane) - 1u)));
}

struct BinPick {
  uint32_t bin, need, count;  // the bin holding the need-th largest, how many to take from it, its size
};

// Called by all kSelectThreads threads: the bin b with above(b) < need ≤ above(b) + hist[b], where above(b)
// counts the members of bins > b. Thread t owns bins 2047 − 2t and 2046 − 2t (descending order).
__device__ BinPick pick_bin(const uint32_t* hist, uint32_t need, uint32_t* warp_s, BinPick* pick_s) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const uint32_t hi = kBins - 1 - 2 * tid, c_hi = hist[hi], c_lo = hist[hi - 1];
  uint32_t incl = c_hi + c_lo;
  for (int off = 1; off < 32; off <<= 1) {
    const uint32_t v = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += v;
  }
  if (lane == 31) warp_s[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    uint32_t v = warp_s[lane];
    for (int off = 1; off < 32; off <<= 1) {
      const uint32_t u = __shfl_up_sync(0xffffffffu, v, off);
      if (lane >= off) v += u;
    }
    warp_s[lane] = v;
  }
  __syncthreads();
  const uint32_t above = (warp ? warp_s[warp - 1] : 0u) + incl - c_hi - c_lo;
  if (above < need && need <= above + c_hi) *pick_s = {hi, need - above, c_hi};
  else if (above + c_hi < need && need <= above + c_hi + c_lo) *pick_s = {hi - 1, need - above - c_hi, c_lo};
  __syncthreads();
  const BinPick pick = *pick_s;
  __syncthreads();  // warp_s and pick_s are reused by the next call
  return pick;
}

// grid (rows of the launch), kSelectThreads threads, dynamic smem kCandidates composites.
__global__ void __launch_bounds__(kSelectThreads)
indexer_select_kernel(const __grid_constant__ IndexerKernelParams p) {
  extern __shared__ uint64_t cand_s[];  // [kCandidates] members of the k-th composite's top bin
  __shared__ uint64_t sel_s[kMaxTopK];
  __shared__ uint32_t hist_s[kBins];
  __shared__ uint32_t warp_s[32];
  __shared__ BinPick pick_s;
  __shared__ uint32_t nsel_s, ncand_s;
  pdl_wait();

  const int tid = threadIdx.x;
  const int64_t r = blockIdx.x;
  const IndexerSequence& sq = sequence_of(p, r);
  const int64_t visible = (sq.pos0 + (r - sq.row0) + 1) / p.ratio;
  const int64_t k = p.top_k < visible ? p.top_k : visible;
  const uint32_t* row = p.score_keys + r * p.v_stride;
  if (tid == 0) nsel_s = ncand_s = 0;
  for (int b = tid; b < kBins; b += kSelectThreads) {
    hist_s[b] = k < visible ? p.hist[r * kBins + b] : 0u;
    p.hist[r * kBins + b] = 0;  // zero for the next call's score kernel: no memset (and no break in PDL) before it
  }
  __syncthreads();

  if (k == visible) {  // every visible entry is selected (also k = 0)
    for (int64_t e = tid; e < visible; e += kSelectThreads) sel_s[e] = composite(row[e], e);
  } else {
    const BinPick top = pick_bin(hist_s, uint32_t(k), warp_s, &pick_s);
    const bool resolved = top.count == top.need;  // the whole top bin is selected
    const bool gather = !resolved && top.count <= kCandidates;
    for (int64_t base = 0; base < visible; base += kSelectThreads * kSelectBatch) {
      uint32_t keys[kSelectBatch];  // loaded first: kSelectBatch loads in flight, not one round trip each
#pragma unroll
      for (int b = 0; b < kSelectBatch; ++b) {
        const int64_t e = base + b * kSelectThreads + tid;
        keys[b] = e < visible ? row[e] : 0u;
      }
#pragma unroll
      for (int b = 0; b < kSelectBatch; ++b) {
        const int64_t e = base + b * kSelectThreads + tid;
        const uint32_t key = keys[b], bin = key >> kTopBitsShift;
        const bool live = e < visible;
        const bool take = live && (bin > top.bin || (resolved && bin == top.bin));
        const uint32_t s = append_slot(take, &nsel_s);
        if (take) sel_s[s] = composite(key, e);
        const bool keep = live && gather && bin == top.bin;
        const uint32_t c = append_slot(keep, &ncand_s);
        if (keep) cand_s[c] = composite(key, e);
      }
    }
    __syncthreads();

    if (!resolved) {
      // Candidates: the gathered bin, or (too big to gather) the whole row filtered by the prefix.
      const int64_t n_cand = gather ? int64_t(ncand_s) : visible;
      const auto candidate = [&](int64_t c) { return gather ? cand_s[c] : composite(row[c], c); };
      uint64_t prefix = uint64_t(top.bin) << 53, mask = ~uint64_t(0) << 53;
      uint32_t need = top.need;
      constexpr int kShift[5] = {42, 32, 21, 10, 0}, kWidth[5] = {11, 10, 11, 11, 10};
      // Two digits are often the same for every candidate, so their bits are set without a pass: in fast
      // numerics the scores are bf16, so a key's low 16 bits (digit 1's) are all zero for a positive score and
      // all ones for a negative one (order_key inverts them; the top bin fixes the sign); and entries below
      // 2^21 leave the inverted index's bits 21..31 (digit 2's) all ones. Bf16 scores tie often among thousands
      // of entries, and then the resolution ran through all five digits.
      const uint64_t known_key_bits = (top.bin >> 10) ? 0 : ~uint64_t(0);  // top.bin bit 10: the key's sign bit
#pragma unroll
      for (int digit = 0; digit < 5; ++digit) {
        const int shift = kShift[digit];
        const uint64_t digit_mask = (uint64_t(1) << kWidth[digit]) - 1;
        if ((digit == 1 && p.fast) || (digit == 2 && visible <= (int64_t(1) << 21))) {
          prefix |= (digit == 1 ? known_key_bits & digit_mask : digit_mask) << shift;
          mask |= digit_mask << shift;
          continue;
        }
        for (int b = tid; b < kBins; b += kSelectThreads) hist_s[b] = 0;
        __syncthreads();
        for (int64_t c = tid; c < n_cand; c += kSelectThreads) {
          const uint64_t v = candidate(c);
          if ((v & mask) == prefix) atomicAdd(&hist_s[(v >> shift) & digit_mask], 1u);
        }
        __syncthreads();
        const BinPick pick = pick_bin(hist_s, need, warp_s, &pick_s);
        prefix |= uint64_t(pick.bin) << shift;
        mask |= digit_mask << shift;
        need = pick.need;
        if (pick.count == pick.need) break;  // everything at or above the prefix is in; uniform
      }
      // The top bin's members at or above the prefix: the need-th one is the k-th composite.
      for (int64_t base = 0; base < n_cand; base += kSelectThreads) {
        const int64_t c = base + tid;
        const uint64_t v = c < n_cand ? candidate(c) : 0u;
        const bool take = c < n_cand && (v >> 53) == top.bin && (v & mask) >= prefix;
        const uint32_t s = append_slot(take, &nsel_s);
        if (take) sel_s[s] = v;
      }
    }
  }
  __syncthreads();

  // Bitonic sort of the k winners, descending; zero padding (below every real composite) sorts last.
  int sorted = 1;
  while (sorted < k) sorted <<= 1;
  int32_t* out = sq.selected + (r - sq.row0) * p.top_k;
  if (sorted <= kSelectThreads) {  // one element per thread, in a register
    // Only the network's own warps sort (the others would double its instructions at k = 512: half the select
    // kernel's stall samples at batch 8, 32K were the sort); they meet at named barrier 1.
    const int net = sorted < 32 ? 32 : sorted;
    if (tid < net) {
      uint64_t v = tid < k ? sel_s[tid] : 0u;
      for (int size = 2; size <= sorted; size <<= 1)
        for (int stride = size / 2; stride > 0; stride >>= 1) {
          // Partner tid ^ stride (in the same block of `size`); the lower index of the pair keeps the larger
          // value in a descending block, the smaller in an ascending one.
          uint64_t other;
          if (stride >= 32) {  // across warps: through shared memory, two barriers
            barrier_sync(1, net);  // the previous stage's reads are done
            sel_s[tid] = v;
            barrier_sync(1, net);
            other = sel_s[tid ^ stride];
          } else {  // within the warp: a shuffle, no barrier (the network's first 15 stages and 5 of each later size)
            other = __shfl_xor_sync(0xffffffffu, v, stride);
          }
          const bool keep_larger = ((tid & stride) == 0) == ((tid & size) == 0);
          v = keep_larger ? (v > other ? v : other) : (v < other ? v : other);
        }
      if (tid < k) out[tid] = composite_index(v);
    }
    for (int64_t j = k + tid; j < p.top_k; j += kSelectThreads) out[j] = -1;
    return;
  }
  for (int64_t x = k + tid; x < sorted; x += kSelectThreads) sel_s[x] = 0;
  __syncthreads();
  for (int size = 2; size <= sorted; size <<= 1)
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      for (int x = tid; x < sorted / 2; x += kSelectThreads) {
        const int a = 2 * x - (x & (stride - 1)), b = a + stride;
        const bool descending = (a & size) == 0;
        const uint64_t va = sel_s[a], vb = sel_s[b];
        if ((va < vb) == descending) {
          sel_s[a] = vb;
          sel_s[b] = va;
        }
      }
      __syncthreads();
    }
  for (int64_t j = tid; j < p.top_k; j += kSelectThreads) out[j] = j < k ? composite_index(sel_s[j]) : -1;
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// One sequence's parameters, checked alone and against the batch's first (every field but its rows, positions,
// keys and selection is shared); returns its key layout (nullptr: fp32 rows).
const CacheLayout* check_sequence(const CudaOps& ops, const IndexerParams& p, const IndexerParams& first) {
  DSV4_CHECK(p.n >= 0 && p.pos0 >= 0 && p.ratio >= 1, "indexer_topk: n ", p.n, ", pos0 ", p.pos0, ", ratio ",
             p.ratio);
  DSV4_CHECK(p.heads >= 1 && p.heads <= kMaxIndexerHeads, "indexer_topk: ", p.heads, " heads (the CUDA kernel takes 1..",
             kMaxIndexerHeads, ")");
  DSV4_CHECK(p.head_dim >= 4 && p.head_dim <= kMaxIndexerHeadDim && p.head_dim % 4 == 0, "indexer_topk: head_dim ",
             p.head_dim, " (the CUDA kernel takes multiples of 4 up to ", kMaxIndexerHeadDim, ")");
  DSV4_CHECK(p.top_k >= 0 && p.top_k <= kMaxTopK, "indexer_topk: top_k ", p.top_k, " (the CUDA kernel takes up to ",
             kMaxTopK, ")");
  DSV4_CHECK(p.q && p.weights && p.keys && p.selected, "indexer_topk: q, weights, keys and selected are required");
  DSV4_CHECK(aligned16(p.q) && aligned16(p.keys), "indexer_topk: q and keys must be 16-byte aligned");
  DSV4_CHECK((p.pos0 + p.n) / p.ratio < (int64_t(1) << 31), "indexer_topk: more than 2^31 visible entries");
  DSV4_CHECK(p.heads == first.heads && p.head_dim == first.head_dim && p.ratio == first.ratio &&
                 p.top_k == first.top_k,
             "indexer_topk: the sequences of one batch differ in more than their rows, positions, keys and selection");
  const CacheLayout* key_layout = ops.compact_cache(p.keys);
  DSV4_CHECK(!key_layout || (key_layout->format == CacheFormat::kFp4Keys && key_layout->dim == p.head_dim),
             "indexer_topk: compact keys must be FP4 key rows of head_dim ", p.head_dim);
  return key_layout;
}

// CudaOps::indexer_topk.
void launch_batch(CudaOps& ops, std::span<const IndexerParams> batch) {
  if (batch.empty()) return;
  const IndexerParams& p0 = batch[0];
  const CacheLayout* key_layout = check_sequence(ops, p0, p0);
  int64_t rows_total = 0, v_stride = 1;  // v_stride: the most entries any row sees (a sequence's last row)
  for (const IndexerParams& p : batch) {
    const CacheLayout* l = check_sequence(ops, p, p0);
    DSV4_CHECK(!l == !key_layout && (!l || l->row_bytes == key_layout->row_bytes),
               "indexer_topk: the sequences of one batch must share a key format");
    rows_total += p.n;
    v_stride = std::max(v_stride, (p.pos0 + p.n) / p.ratio);
  }
  if (rows_total == 0 || p0.top_k == 0) return;

  allow_dynamic_smem(reinterpret_cast<const void*>(indexer_score_kernel<kDecodeHeads>),
                     int(score_smem_bytes(kMaxIndexerHeads, kMaxIndexerHeadDim, max_entries(kDecodeHeads))));
  allow_dynamic_smem(reinterpret_cast<const void*>(indexer_score_kernel<kPrefillHeads>),
                     int(score_smem_bytes(kMaxIndexerHeads, kMaxIndexerHeadDim, max_entries(kPrefillHeads))));
  allow_dynamic_smem(reinterpret_cast<const void*>(indexer_select_kernel), int(kCandidates * sizeof(uint64_t)));

  // Launches of up to kMaxSequences sequences and max_rows rows, whose score keys and histograms fit a fixed
  // budget (so the workspaces are sized once); a sequence with more rows spans launches, a run of them in each.
  const size_t row_bytes = size_t(v_stride + kBins) * sizeof(uint32_t);
  const size_t budget = std::max(kScoreBudgetBytes, row_bytes);
  const int64_t max_rows = std::min<int64_t>({rows_total, int64_t(budget / row_bytes), 65535});
  IndexerKernelParams k{};
  if (key_layout) k.key_layout = *key_layout;
  k.score_keys = static_cast<uint32_t*>(ops.workspace(kWsIndexerScores, budget));
  k.hist = static_cast<uint32_t*>(
      ops.workspace(kWsIndexerHist, size_t(max_rows * kBins) * sizeof(uint32_t), /*zeroed=*/true));
  k.ratio = p0.ratio;
  k.v_stride = v_stride;
  k.top_k = p0.top_k;
  k.heads = int(p0.heads);
  k.head_dim = int(p0.head_dim);
  k.fast = ops.fast();
  const bool pdl = ops.props().major >= 9;
  // The tensor-core scores: fast numerics on compact FP4 keys, head_dim a multiple of 64 (whole swizzle groups).
  const bool tc = k.fast && key_layout && p0.head_dim % 64 == 0;
  if (tc)
    for (const void* kernel : {reinterpret_cast<const void*>(indexer_score_tc_kernel<tc_key_items(128)>),
                               reinterpret_cast<const void*>(indexer_score_tc_kernel<tc_key_items(kMaxIndexerHeadDim)>)})
      allow_dynamic_smem(kernel, int(tc_score_smem_bytes(kMaxIndexerHeadDim)));
  int64_t rows = 0;  // of the launch being filled
  const auto launch = [&] {
    if (rows == 0) return;
    int64_t visible_max = 0;
    for (int j = 0; j < k.sequences; ++j)
      visible_max = std::max(visible_max, (k.seq[j].pos0 + k.seq[j].n) / k.ratio);
    if (visible_max > 0 && tc) {
      // Tiles per block: q staged once for up to kTcMaxTiles tiles, as long as the grid keeps two blocks per SM.
      int tiles = kTcMaxTiles;
      while (tiles > 1 && ceil_div(visible_max, int64_t(kTcTile) * tiles) * rows < 2 * ops.props().multiProcessorCount)
        tiles /= 2;
      k.entries = kTcTile * tiles;
      const dim3 grid(unsigned(ceil_div(visible_max, int64_t(k.entries))), unsigned(rows));
      const auto kernel = k.head_dim <= 128 ? indexer_score_tc_kernel<tc_key_items(128)>
                                            : indexer_score_tc_kernel<tc_key_items(kMaxIndexerHeadDim)>;
      launch_pdl(kernel, grid, dim3(kTcScoreWarps * 32), tc_score_smem_bytes(k.head_dim),
                 ops.stream(), pdl, k);
    } else if (visible_max > 0) {
      const bool decode = rows <= kDecodeMaxRows;
      const int H = decode ? kDecodeHeads : kPrefillHeads;
      k.entries = max_entries(H);
      if (decode) {  // the fewest entries per block that keep the grid within two blocks per SM
        k.entries = 8;
        while (k.entries < max_entries(H) &&
               ceil_div(visible_max, int64_t(k.entries)) * rows > 2 * ops.props().multiProcessorCount)
          k.entries *= 2;
      }
      const dim3 grid(unsigned(ceil_div(visible_max, int64_t(k.entries))), unsigned(rows));
      const dim3 threads(unsigned(k.entries * ceil_div(p0.heads, int64_t(H))));
      const size_t smem = score_smem_bytes(k.heads, k.head_dim, k.entries);
      if (decode) launch_pdl(indexer_score_kernel<kDecodeHeads>, grid, threads, smem, ops.stream(), pdl, k);
      else launch_pdl(indexer_score_kernel<kPrefillHeads>, grid, threads, smem, ops.stream(), pdl, k);
    }
    launch_pdl(indexer_select_kernel, dim3(unsigned(rows)), dim3(kSelectThreads), kCandidates * sizeof(uint64_t),
               ops.stream(), pdl, k);
    rows = 0;
    k.sequences = 0;
  };
  for (const IndexerParams& p : batch) {
    for (int64_t i = 0; i < p.n;) {
      if (k.sequences == kMaxSequences || rows == max_rows) launch();
      const int64_t take = std::min(p.n - i, max_rows - rows);
      k.seq[k.sequences++] = {p.q + i * p.heads * p.head_dim, p.weights + i * p.heads, p.keys, p.selected + i * p.top_k,
                              p.pos0 + i, int32_t(rows), int32_t(take)};
      rows += take;
      i += take;
    }
  }
  launch();
}

}  // namespace
}  // namespace cuda

void CudaOps::indexer_topk(std::span<const IndexerParams> batch) { cuda::launch_batch(*this, batch); }

}  // namespace dsv4
