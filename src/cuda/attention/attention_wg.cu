// attention family (CUDA), warpgroup MMAs: the tensor-core sparse attention for V4's shape on Hopper — 64 query
// heads of one row per block, head_dim 512 (448 e4m3 channels with an E8M0 scale per 64, then 64 rope channels
// stored fp32), fast numerics on compact FP8 caches. It computes what attn_tc_kernel (attention_tc.cu) computes:
// QKᵀ and P·V as bf16 MMAs with fp32 accumulation, the softmax in base-2 units against an integer running
// maximum, P rounded to bf16 (attention.cu's top), the same per-tile sums; only the MMAs' summation order differs.
//
// Why another kernel: attn_tc_kernel's mma.sync chain (ldmatrix, decode and MMAs in the same 8 warps, one block
// an SM) issued 0.2–0.3 instructions a cycle a scheduler (docs/design/attention.md). Here the MMAs read their
// operands from shared memory by descriptor (no ldmatrix), the key rows arrive by bulk copies (no registers,
// one instruction a row), and a producer warpgroup decodes the next key tile while the MMA warpgroups work on
// this one.
//
// NOTE: block layout, 3 warpgroups (384 threads):
//   warpgroups 0, 1 (MMA): warpgroup w computes S_w = q · kᵀ for keys [32w, 32w + 32) of a 64-key tile over all
//     512 channels (wgmma m64n32k16 × 32), the two halves meet in shared memory for the row maxima and sums,
//     each writes its half of P (bf16) to shared memory, then each accumulates P · V for channels [256w, +256)
//     of all 64 keys (wgmma m64n256k16 × 4, V read N-major from the same tile) into 128 fp32 registers a thread.
//   warpgroup 2 (producer): a tile's compact rows are bulk-copied (one cp.async.bulk a row) into the tail of
//     its buffer as soon as the MMA warpgroups are done with the tile before it there; two threads a row read
//     the row out and decode it exactly to bf16 (e4m3 · 2^k and the bf16-valued rope channels are bf16 values)
//     over the same buffer. Two buffers: tile j + 1 is copied and decoded while tile j is multiplied.
// Splits: a thread-block cluster of one block a split (cluster rank = split). Block s owns heads [⌈64s/S⌉,
// ⌈64(s+1)/S⌉) of the output; every block stores its unnormalised (m, l) and o of each head into the owner's
// shared memory (distributed shared memory: stores, no round trips), and each owner merges its heads from its
// own shared memory as attn_combine_kernel does from HBM partials (attention.cu) — which at batch 64 cost as long
// as the blocks' tile work after the first tile (docs/design/attention.md).
// Shared matrices (q, the key tiles, P) are wgmma's 128-byte swizzle: 64-channel slices of [64 rows][128 B],
// 16-byte chunk c of row r at c ^ (r % 8), slices 8 KB apart.
#include <type_traits>

#include "cuda/attention/attention.cuh"
#include "cuda/common/barrier.cuh"
#include "cuda/common/check.h"
#include "cuda/common/cluster.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/smem.h"
#include "cuda/gemm/tc_ptx.cuh"
#include "cuda/gemm/tc_wgmma.cuh"

namespace dsv4::cuda::attn {
namespace {

constexpr int kWgDim = 512, kWgNope = 448;
constexpr int kWgThreads = 384;
// Registers a thread (setmaxnreg): the MMA warpgroups hold 128 fp32 accumulators; the producer a row's half.
// Together they must stay within what the launch allocated (kWgThreads × 168, __launch_bounds__(kWgThreads, 1)).
constexpr int kMmaRegisters = 184, kProducerRegisters = 136;
static_assert(256 * kMmaRegisters + 128 * kProducerRegisters <= kWgThreads * 168, "attn_wg: register pool");
constexpr int kSlice = 64 * 128;        // one 64-channel slice of a [64 rows][d] bf16 matrix
constexpr int kTile = kWgDim / 64 * kSlice;  // [64 rows][d] bf16: q, or a key tile
constexpr int kMaxRowBytes = 720;             // a compact row of V4's shape (wg_fits)
constexpr int kRawAt = (kTile - kTcKeys * kMaxRowBytes) / 16 * 16;  // a tile's compact rows, in its buffer

// Splits > 1: the most of a block's 64 heads one split owns in the merge (first_head below).
__host__ __device__ constexpr int owned_rows(int splits) { return (64 + splits - 1) / splits; }

// Shared memory, from a 1024-byte boundary (the swizzle atoms).
struct WgLayout {
  static constexpr int q = 0;                        // q: [64 heads][d]
  static constexpr int k = q + kTile;                // [2 buffers] key tiles [64 keys][d]
  static constexpr int p = k + 2 * kTile;            // P: [64 heads][64 keys] bf16
  static constexpr int tmax = p + 64 * 128;          // float [2 warpgroups][64 heads]: their key halves' maxima
  static constexpr int lsum = tmax + 2 * 64 * 4;     // float [2][64]: their key halves' sums
  static constexpr int rot = lsum + 2 * 64 * 4;      // float2 [kMaxHeadDim / 2]: the output's derotation
  static constexpr int live = rot + kMaxHeadDim * 4;  // uint8 [2 buffers][64]: the key exists and is not masked
  static constexpr int ml = live + 2 * 64;  // float2 [kWgMaxSplits][64 heads]: every split's (m, l), pushed
  static constexpr int wt = ml + kWgMaxSplits * 64 * 8;  // float [64 heads][kWgMaxSplits + 1]: weights, 1/denom
  static constexpr int bars = wt + 64 * (kWgMaxSplits + 1) * 4;  // uint64 landed[2], full[2], empty[2]
  static constexpr int bytes = bars + 6 * 8 + 1024;  // + slack for the alignment
  // At the end (splits > 1), over q and the key tiles (dead by then): every split's o of this block's heads as
  // fp32 rows, [splits][⌈64 / splits⌉ heads][kRecvRow floats], pushed by the splits. kRecvRow ≡ 16 (mod 32)
  // words: the 16-byte stores of a quarter warp (two heads × 16 channels) meet every bank once.
  static constexpr int kRecvRow = kWgDim + 16;
  static constexpr int recv_rows() {  // the most rows, over the split counts
    int most = 0;
    for (int s = 2; s <= kWgMaxSplits; ++s) most = most > s * owned_rows(s) ? most : s * owned_rows(s);
    return most;
  }
};
static_assert(WgLayout::recv_rows() * WgLayout::kRecvRow * 4 <= WgLayout::p - WgLayout::q,
              "attn_wg: the pushed o over q and the key tiles");

// The merge's partition: split s owns heads [first_head(s), first_head(s + 1)) of the block's 64.
__device__ __forceinline__ int first_head(int s, int splits) { return (64 * s + splits - 1) / splits; }
__device__ __forceinline__ int head_owner(int h, int splits) { return h * splits / 64; }

// Splits > 1, by the MMA warpgroups once every split's pushes have landed (WgLayout): this block's heads of the
// row's output, attn_combine_kernel's arithmetic in its order (split 0 first), so the outputs are what the
// combine makes of these partials (a −0 may keep its sign: the combine pads its batches of splits with zeros);
// the derotation table in rot_s when asked.
__device__ __forceinline__ void merge_owned_heads(const AttnKernelParams& p, const AttnSequence& sq, int64_t i,
                                                  int head0, uint8_t* smem, int rank) {
  const int tid = int(threadIdx.x), splits = p.splits, rows = owned_rows(splits);
  const int h0 = first_head(rank, splits), h1 = first_head(rank + 1, splits);
  const float* const recv = reinterpret_cast<const float*>(smem + WgLayout::q);
  const float2* const ml_s = reinterpret_cast<const float2*>(smem + WgLayout::ml);
  float* const wt_s = reinterpret_cast<float*>(smem + WgLayout::wt);
  const float2* const rot_s = reinterpret_cast<const float2*>(smem + WgLayout::rot);
  if (tid < h1 - h0) {
    const int h = h0 + tid;
    const float sink = softmax_unit(p.fast, p.sinks[head0 + h]);
    float big = sink;
    for (int s = 0; s < splits; ++s) big = fmaxf(big, ml_s[s * 64 + h].x);
    float denom = softmax_exp(p.fast, sink - big);
    for (int s = 0; s < splits; ++s) {
      const float2 ml = ml_s[s * 64 + h];
      const float w = ml.x == -INFINITY ? 0.0f : softmax_exp(p.fast, ml.x - big);  // −inf: no live keys
      denom += ml.y * w;
      wt_s[tid * (kWgMaxSplits + 1) + s] = w;
    }
    wt_s[tid * (kWgMaxSplits + 1) + kWgMaxSplits] = 1.0f / denom;
  }
  barrier_sync(7, 256);  // the weights
  constexpr int kColumns = kWgDim / 4;
  for (int x = tid; x < (h1 - h0) * kColumns; x += 256) {
    const int hr = x / kColumns, f = x % kColumns;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s = 0; s < splits; ++s) {
      const float4 v = *reinterpret_cast<const float4*>(recv + (s * rows + hr) * WgLayout::kRecvRow + 4 * f);
      const float w = wt_s[hr * (kWgMaxSplits + 1) + s];
      o = make_float4(fmaf(w, v.x, o.x), fmaf(w, v.y, o.y), fmaf(w, v.z, o.z), fmaf(w, v.w, o.w));
    }
    const float inv = wt_s[hr * (kWgMaxSplits + 1) + kWgMaxSplits];
    store_output(p, sq, (i * p.heads + head0 + h0 + hr) * kWgDim + 4 * f,
                 output_column(p, rot_s, f, make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv)));
  }
}

// Byte offset of 16-byte chunk c (0..7) of row r within a swizzled 64-channel slice.
__device__ __forceinline__ int sw128(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

// grid (splits, heads / 64, rows) in clusters of (splits, 1, 1), kWgThreads threads, dynamic smem WgLayout::bytes.
// Block (s, g, r): heads 64g .. 64g + 63 of launch row r over keys [s·keys_per_split, (s+1)·keys_per_split), in
// tiles of 64 keys.
__global__ void __launch_bounds__(kWgThreads, 1) attn_wg_kernel(const __grid_constant__ AttnKernelParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace tc;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* const smem = smem_raw + ((1024 - (smem_address(smem_raw) & 1023)) & 1023);
  uint8_t* const q_s = smem + WgLayout::q;
  uint8_t* const k_s = smem + WgLayout::k;
  uint8_t* const p_s = smem + WgLayout::p;
  float* const tmax_s = reinterpret_cast<float*>(smem + WgLayout::tmax);
  float* const lsum_s = reinterpret_cast<float*>(smem + WgLayout::lsum);
  float2* const rot_s = reinterpret_cast<float2*>(smem + WgLayout::rot);
  uint8_t* const live_s = smem + WgLayout::live;
  uint64_t* const landed = reinterpret_cast<uint64_t*>(smem + WgLayout::bars);  // [2]: a tile's rows copied in
  uint64_t* const full = landed + 2;                                              // [2]: a tile buffer decoded
  uint64_t* const empty = landed + 4;                                              // [2]: both MMA warpgroups done

  const int tid = int(threadIdx.x);
  const int head0 = int(blockIdx.y) * kTcHeads, split = int(blockIdx.x), r = int(blockIdx.z);
  const AttnSequence& sq = sequence_of(p, r);
  const int64_t i = r - sq.row0, t = sq.pos0 + i;
  const int64_t nw = window_keys(p.window_size, t);
  const int64_t total = nw + compressed_keys(sq.entries != nullptr, sq.selected != nullptr, p.top_k, p.ratio, t);
  const int64_t begin = int64_t(split) * p.keys_per_split;
  const int64_t end = total < begin + p.keys_per_split ? total : begin + p.keys_per_split;
  const int tiles = begin < end ? int((end - begin + kTcKeys - 1) / kTcKeys) : 0;
  if (tid == 0) {
    mbar_init(&landed[0], 64);  // each key row's copying thread
    mbar_init(&landed[1], 64);
    mbar_init(&full[0], 128);
    mbar_init(&full[1], 128);
    mbar_init(&empty[0], 8);  // lane 0 of each MMA warp
    mbar_init(&empty[1], 8);
    fence_barrier_init();
  }
  pdl_wait();

  // Producer: where key (begin + 64j + row) is (key_ref; past the split: at −1, no row) — found a tile before its
  // rows are copied, so the selection's load is not waited for; a tile's compact rows are bulk-copied into the
  // tail of its free buffer (kRawAt: they are read out before the buffer is decoded over), one copy a row.
  const int row = (tid - 256) / 2, half = tid % 2;
  const auto find = [&](int j) -> KeyRef {
    const int64_t key = begin + int64_t(kTcKeys) * j + row;
    return key < end ? key_ref(p, sq, i, t, nw, key) : KeyRef{-1, false};
  };
  const auto copy_rows = [&](int j, KeyRef k) {  // by the row's thread of half 0 (both find)
    const uint8_t* src = key_source(p, sq, k);
    const uint32_t bytes = src ? uint32_t(p.row_bytes) : 0u;
    uint64_t* const bar = &landed[j & 1];
    mbar_arrive_expect_tx(bar, bytes);
    if (src) bulk_load(k_s + (j & 1) * kTile + kRawAt + row * p.row_bytes, src, bytes, bar);
  };
  const KeyRef none{-1, false};
  KeyRef cur0 = none, cur1 = none, next = none;  // the tiles in buffers 0 and 1; the one after them
  if (tid >= 256 && tiles > 0) {
    cur0 = find(0);
    if (tiles > 1) cur1 = find(1);
    if (tiles > 2) next = find(2);
  }
  __syncthreads();  // the barriers are initialised
  if (tid >= 256 && half == 0 && tiles > 0) {
    copy_rows(0, cur0);
    if (tiles > 1) copy_rows(1, cur1);
  }

  // q as bf16 (as it is, or from bf16-valued fp32 exactly) by the MMA warpgroups, a batch of chunks a thread in
  // flight at once: all 16 of its bf16 chunks, or 8 fp32 ones.
  const auto copy_q = [&](auto batch) {
    constexpr int kBatch = decltype(batch)::value, kChunks = kTcHeads * kWgDim / 8;
    for (int x0 = tid; x0 < kChunks; x0 += 256 * kBatch) {
      uint4 v[kBatch];
      float4 f[kBatch == 16 ? 1 : 2 * kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int x = x0 + 256 * u, h = x / (kWgDim / 8), ch = x % (kWgDim / 8);
        const int64_t at = (i * p.heads + head0 + h) * kWgDim + 8 * ch;
        if constexpr (kBatch == 16) {
          v[u] = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(sq.q) + at);
        } else {
          const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(sq.q) + at);
          f[2 * u] = src[0];
          f[2 * u + 1] = src[1];
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int x = x0 + 256 * u, h = x / (kWgDim / 8), ch = x % (kWgDim / 8);
        if constexpr (kBatch != 16) {
          const float4 a = f[2 * u], b = f[2 * u + 1];
          v[u] = make_uint4(bf16x2(a.x, a.y), bf16x2(a.z, a.w), bf16x2(b.x, b.y), bf16x2(b.z, b.w));
        }
        *reinterpret_cast<uint4*>(q_s + (ch / 8) * kSlice + sw128(h, ch % 8)) = v[u];
      }
    }
  };
  if (tid < 256) {
    if (p.q_bf16) copy_q(std::integral_constant<int, 16>{});
    else copy_q(std::integral_constant<int, 8>{});
    fence_proxy_async();
    barrier_sync(5, 256);  // q, between the MMA warpgroups: the producer decodes tile 0 meanwhile
  }

  if (tid >= 256) {
    // ---- producer: thread pair (row, half) decodes the row's 8-channel chunks 8s + 4·half + q (slice s, q =
    // 0..3): 32 contiguous code bytes a slice, and the chunks' swizzled positions (4·half + q) ^ (row % 8) put
    // the 8 lanes of a quarter warp (4 rows, both halves) on 8 different bank groups.
    setmaxnreg_dec<kProducerRegisters>();
    constexpr int kCodeSlices = kWgNope / 64;  // 7; slice 7 is the rope channels
    // Tile j lives in buffer j % 2: the (j / 2)-th phase of its barriers. Its rows are copied in once tile j − 2
    // is done with the buffer (tiles 0 and 1: above), and decoded while the MMA warpgroups work on tile j − 1.
    for (int j = 0; j < tiles; ++j) {
      const int b = j & 1;
      uint8_t* const buf = k_s + b * kTile;
      if (j >= 2) {
        mbar_wait(&empty[b], ((j >> 1) - 1) & 1);
        if (half == 0) copy_rows(j, next);
        (b ? cur1 : cur0) = next;
        next = j + 1 < tiles ? find(j + 1) : none;
      }
      const bool live = (b ? cur1 : cur0).at >= 0;
      mbar_wait(&landed[b], (j >> 1) & 1);
      // The row as stored, out of the buffer's tail before it is decoded over.
      const uint8_t* raw = buf + kRawAt + row * p.row_bytes;
      uint4 codes[2 * kCodeSlices];  // slice s: codes[2s] chunks q = 0, 1; codes[2s + 1] q = 2, 3
      float4 rope[8];                // chunk q: rope[2q], rope[2q + 1]
      uint64_t scales = 0;
      if (live) {
#pragma unroll
        for (int s = 0; s < kCodeSlices; ++s) {
          const uint4* c = reinterpret_cast<const uint4*>(raw + 64 * s + 32 * half);
          codes[2 * s] = c[0];
          codes[2 * s + 1] = c[1];
        }
        scales = *reinterpret_cast<const uint64_t*>(raw + p.kv.scales);
        const float4* rp = reinterpret_cast<const float4*>(raw + p.kv.rope + 128 * half);
#pragma unroll
        for (int k = 0; k < 8; ++k) rope[k] = rp[k];
      }
      barrier_sync(3, 128);  // every row read out
      uint8_t* const dst = buf + row * 128;
      if (half == 0) live_s[b * 64 + row] = live;
#pragma unroll
      for (int s = 0; s <= kCodeSlices; ++s) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          uint4 v = make_uint4(0, 0, 0, 0);
          if (live && s < kCodeSlices) {
            const float sc = e8m0_value(uint32_t(scales >> (8 * s)) & 0xFF);
            const uint4 w = codes[2 * s + q / 2];
            const uint32_t lo = q % 2 == 0 ? w.x : w.z, hi = q % 2 == 0 ? w.y : w.w;
            const float2 a = e4m3x2_to_float2(lo), b2 = e4m3x2_to_float2(lo >> 16);
            const float2 e = e4m3x2_to_float2(hi), f = e4m3x2_to_float2(hi >> 16);
            v = make_uint4(bf16x2(a.x * sc, a.y * sc), bf16x2(b2.x * sc, b2.y * sc), bf16x2(e.x * sc, e.y * sc),
                           bf16x2(f.x * sc, f.y * sc));
          } else if (live) {
            const float4 a = rope[2 * q], b2 = rope[2 * q + 1];
            v = make_uint4(bf16x2(a.x, a.y), bf16x2(a.z, a.w), bf16x2(b2.x, b2.y), bf16x2(b2.z, b2.w));
          }
          *reinterpret_cast<uint4*>(dst + s * kSlice + (((4 * half + q) ^ (row & 7)) << 4)) = v;
        }
      }
      fence_proxy_async();
      mbar_arrive(&full[b]);
    }
    // The output's derotation, off the MMA warpgroups' path (one split: barrier 4, which they wait for before
    // their stores; more: the merge's cluster barriers).
    if (p.inv_freq) {
      for (int k = tid - 256; k < (kWgDim - p.rope_offset) / 2; k += 128)
        rot_s[k] = rope_cos_sin(t, p.inv_freq[k], /*inverse=*/true);
      if (p.splits == 1) barrier_arrive(4, kWgThreads);
    }
    if (p.splits > 1) {  // the MMA warpgroups' two cluster barriers (before and after their pushes)
      cluster_sync_anywhere();
      cluster_sync_anywhere();
    }
    return;
  }
  // ---- MMA warpgroups: this thread's heads row0 and row0 + 8; its S columns 32·wg + 8jj + 2c + e; its output
  // channels 256·wg + 8jj + 2c + e (tc_wgmma.cuh's accumulator layout).
  setmaxnreg_inc<kMmaRegisters>();
  const int wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32, c = lane % 4;
  const int row0 = 16 * warp + lane / 4;
  float o[128];
#pragma unroll
  for (int x = 0; x < 128; ++x) o[x] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  const uint64_t dq = smem_descriptor_sw128(q_s), dp = smem_descriptor_sw128(p_s);

  for (int j = 0; j < tiles; ++j) {
    const int b = j & 1;
    uint8_t* const kb = k_s + b * kTile;
    const uint8_t* const live_b = live_s + b * 64;
    mbar_wait(&full[b], (j >> 1) & 1);

    // S = q · kᵀ over this warpgroup's 32 keys: k-step ks is channels 16ks .. +15 — slice ks / 4, 32 bytes
    // (ks % 4) into its rows.
    float s[16];
    const uint64_t dk = smem_descriptor_sw128(kb + wg * 32 * 128);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kWgDim / 16; ++ks) {
      const uint32_t step = uint32_t((ks / 4) * kSlice + (ks % 4) * 32) >> 4;
      wgmma_m64n32k16_bf16(s, dq + step, dk + step, ks > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(s);

    // Base-2 units, dead keys −∞, the rows' maxima over both halves.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int x = 0; x < 16; ++x) {
      const int key = 32 * wg + 8 * (x / 4) + 2 * c + x % 2;
      s[x] = live_b[key] ? softmax_unit(true, s[x] * p.scale) : -INFINITY;
      mx[(x / 2) % 2] = fmaxf(mx[(x / 2) % 2], s[x]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      if (c == 0) tmax_s[wg * 64 + row0 + 8 * h] = mx[h];
    }
    barrier_sync(1, 256);

    // P = bf16(2^(u − M)) against the new integer maximum M (this half of the keys); the fp32 sums; α exact.
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int head = row0 + 8 * h;
      const float m_new = fmaxf(m_run[h], ceilf(fmaxf(tmax_s[head], tmax_s[64 + head])));
      float sum = 0.0f;
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const float e0 = m_new == -INFINITY ? 0.0f : exp2f(s[4 * jj + 2 * h] - m_new);
        const float e1 = m_new == -INFINITY ? 0.0f : exp2f(s[4 * jj + 2 * h + 1] - m_new);
        sum += e0 + e1;
        *reinterpret_cast<uint32_t*>(p_s + sw128(head, 4 * wg + jj) + 4 * c) = bf16x2(e0, e1);
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (c == 0) lsum_s[wg * 64 + head] = sum;
      alpha[h] = m_new == -INFINITY ? 1.0f : exp2f(m_run[h] - m_new);
      m_run[h] = m_new;
    }
    fence_proxy_async();
    barrier_sync(2, 256);  // P and both halves' sums
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int head = row0 + 8 * h;
      l_run[h] = l_run[h] * alpha[h] + lsum_s[head] + lsum_s[64 + head];
    }
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {  // 1 once the maxima settle
#pragma unroll
      for (int x = 0; x < 128; ++x) o[x] *= alpha[(x / 2) % 2];
    }

    // o += P · V for channels [256·wg, +256): k-step ks is keys 16ks .. +15 — 32 bytes into P's rows, two 8-row
    // groups (2048 bytes) into the tile's slices 4·wg .. 4·wg + 3.
    const uint64_t dv = smem_descriptor_sw128_mn(kb + 4 * wg * kSlice, kSlice);
    fence_registers(o);  // the rescale's writes stay before the fence
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kTcKeys / 16; ++ks)
      wgmma_m64n256k16_bf16<1>(o, dp + uint32_t(ks * 32 >> 4), dv + uint32_t(ks * 2048 >> 4), 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(o);
    if (lane == 0) mbar_arrive(&empty[b]);
  }

  if (p.splits == 1) {
    if (p.inv_freq) barrier_sync(4, kWgThreads);  // the derotation table
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int head = row0 + 8 * h;
      const float factor = fast_output_factor(p, head0 + head, m_run[h], l_run[h]);
      const int64_t out = (i * p.heads + head0 + head) * kWgDim;
#pragma unroll
      for (int jj = 0; jj < 32; ++jj)
        store_fast_pair(p, sq, rot_s, out, 256 * wg + 8 * jj + 2 * c, o[4 * jj + 2 * h] * factor,
                        o[4 * jj + 2 * h + 1] * factor);
    }
    return;
  }
  // Splits: this split's (m, l) and o of each head pushed into its owner's shared memory, once every split of the
  // cluster is done with the q and key tiles they go over; then this block's heads merged.
  cluster_sync_anywhere();
  const int rank = split, rows = owned_rows(p.splits);
  float* const recv = reinterpret_cast<float*>(smem + WgLayout::q);
  float2* const ml_s = reinterpret_cast<float2*>(smem + WgLayout::ml);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int head = row0 + 8 * h, owner = head_owner(head, p.splits);
    float* const row = (owner == rank ? recv : cluster_shared(recv, owner, p.splits)) +
                       (rank * rows + head - first_head(owner, p.splits)) * WgLayout::kRecvRow;
    // Pairs of lanes (c, c ^ 1) swap a channel pair so that each stores 16-byte quads: 8jj + 2c .. + 3 for the
    // even lane's jj, the odd lane's the next.
#pragma unroll
    for (int jj = 0; jj < 32; jj += 2) {
      const float2 a = make_float2(o[4 * jj + 2 * h], o[4 * jj + 2 * h + 1]);
      const float2 b = make_float2(o[4 * jj + 4 + 2 * h], o[4 * jj + 4 + 2 * h + 1]);
      const bool odd = c & 1;
      const float2 send = odd ? a : b;
      const float2 got =
          make_float2(__shfl_xor_sync(0xffffffffu, send.x, 1), __shfl_xor_sync(0xffffffffu, send.y, 1));
      *reinterpret_cast<float4*>(row + 256 * wg + 8 * (jj + odd) + 2 * (c & ~1)) =
          odd ? make_float4(got.x, got.y, b.x, b.y) : make_float4(a.x, a.y, got.x, got.y);
    }
    if (wg == 0 && c == 0)
      (owner == rank ? ml_s : cluster_shared(ml_s, owner, p.splits))[rank * 64 + head] =
          make_float2(m_run[h], l_run[h]);
  }
  cluster_sync_anywhere();  // every split's pushes have landed
  merge_owned_heads(p, sq, i, head0, smem, rank);
#else
  __trap();  // built without sm_90a code, yet launched (wg_fits only checks the device): fail loudly
#endif
}

}  // namespace

bool wg_fits(const CacheLayout& l, int64_t head_dim, int64_t heads, int64_t tc_heads, int splits, int sm_major,
             size_t smem_limit) {
  return sm_major == 9 && splits <= kWgMaxSplits && head_dim == kWgDim && l.format == CacheFormat::kFp8Kv &&
         l.dim == kWgDim && l.nope == kWgNope && l.scales % 8 == 0 && l.rope % 16 == 0 && l.row_bytes % 16 == 0 &&
         l.row_bytes <= kMaxRowBytes && tc_heads == kTcHeads && heads % kTcHeads == 0 &&
         size_t(WgLayout::bytes) <= smem_limit;
}

void launch_wg(const AttnKernelParams& k, dim3 grid, cudaStream_t stream, bool pdl) {
  allow_dynamic_smem(reinterpret_cast<const void*>(attn_wg_kernel), WgLayout::bytes);
  launch_pdl(attn_wg_kernel, dim3(grid.y, grid.x, grid.z), dim3(kWgThreads), size_t(WgLayout::bytes), stream, pdl, k,
             int(grid.y));
}

}  // namespace dsv4::cuda::attn
