// moe family (CUDA): the grouped path's GEMMs of tiles of kGroupedTokens pairs on wgmma, Hopper's native FP8
// tensor-core instruction (sm_90a). The same function as grouped_gemm_kernel<kUp, kGroupedTokens>
// (experts_grouped.cu: its file comment gives the arithmetic and the tile plan), which multiplies the e4m3 values
// as f16 operands of mma.sync: sm_90 has no e4m3 mma.sync, and the f16 one runs at a quarter of the e4m3 wgmma's
// dense rate at best. CudaOps::moe takes this kernel from grouped_wgmma_min_pairs() pairs an expert on average
// (moe_grouped.h): 0.88× the mma.sync kernel's time at 4096 tokens of V4-Flash, 1.31× at 512, where the instruction
// issue that bounds both weighs more (docs/design/moe.md, "wgmma"); below that, for the shared expert's FP8 tiles
// beside small routed tiles, which have no FP4 decode to pay. Routed FP4 decode tiles of kGroupedDecodeTokens
// pairs (N = 16) where experts hold a few pairs each (grouped_routed_tile): two blocks an SM of a five-stage ring,
// since a tile of few pairs streams its weights with little to compute (docs/design/moe.md, "Decode tiles on
// wgmma").
//
// Roles: the weights are wgmma's A, 64 rows a warpgroup, from registers: each warp decodes its 16-row tile's K
// block to e4m3 (FP4 by prmt tables, FP8 as stored), lane (g, c) holding rows g, g + 8 at the k slots of its own
// 16-byte unit of the MMA tile order (weight_mma.cuh). The tile's 64 pairs are B: K-major e4m3 rows in shared
// memory, 128-byte swizzle, copied by cp.async from the rows grouped_quant wrote in wgmma_pos order — the order
// of those k slots (moe_kernels.h).
//   up:   a block owns 64 output rows: warpgroup 0 multiplies w1's, warpgroup 1 w3's, and the SwiGLU meets their
//         sums through shared memory;
//   down: a block owns 128 rows of w2, 64 a warpgroup.
// Precision: the FP8 tensor core keeps ~14 significant bits of its accumulator (tc_wgmma.cuh), so each K block
// (four wgmma steps of 32) is summed into cleared registers and promoted into the fp32 total with the weight and
// activation scales, as DeepSeek's own FP8 kernels promote every 128 columns. The mma.sync kernel sums exact f16
// products in fp32 instead; tests/cuda/test_moe.cpp bounds the difference.
// FP4 widens to e4m3 as wgmma_fp4.cuh says, its largest chunk scale joining the promotion's; FP8: the 128 × 128
// block scale.
// Pipeline: the weights, their scales, the activation rows and their scales come through one cp.async ring of
// kStages stages of kStageBlocks K blocks that all 256 threads fill, up to six K blocks ahead (the weights one
// block ahead in registers waited on memory: a K block's wgmmas are far shorter than a load's latency). Per stage
// each warpgroup issues K block 0's wgmmas, decodes block 1 while they run, issues block 1's, and promotes block 0
// while those run.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "cuda/common/check.h"
#include "cuda/common/cp_async.cuh"
#include "cuda/common/fp_grid.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/smem.h"
#include "cuda/gemm/tc_ptx.cuh"
#include "cuda/gemm/tc_wgmma.cuh"
#include "cuda/moe/experts.cuh"
#include "cuda/moe/moe_grouped.h"
#include "cuda/moe/wgmma_fp4.cuh"

namespace dsv4::cuda::moe {

namespace {

constexpr int kThreads = 256;                  // two warpgroups
constexpr int kBlockK = 128;                   // one act_quant block: four wgmma steps of 32
constexpr int kUpRows = 64, kDownRows = 128;  // output rows of a block
// The ring: stages of kStageBlocks K blocks, each [activation tiles | weights | weight scales | activation
// scales]. Weights: per (warpgroup, K block, warp) its 16-row tile's K groups (FP4 one, FP8 two) of 1 KB, as they
// lie in the MMA tile order; FP4 scales 64 bytes per (warpgroup, K block, warp), FP8 one float per (warpgroup,
// K block). Up to kStages − 1 stages in flight: the weights arrive 4–6 K blocks ahead of their use.
constexpr int kStageBlocks = 2;
constexpr int kWarpChunk = kTileRows * kTileGroupBytes;  // a warp tile's K group
constexpr int kWScaleBytes = 2 * kStageBlocks * 4 * 64;

// A tile of T pairs, the wgmma's N: kGroupedTokens, or kGroupedDecodeTokens where experts hold a few pairs each
// (decode steps: moe_kernels.h).
template <int T>
struct Tile {
  static_assert(T == kGroupedTokens || T == kGroupedDecodeTokens, "an instantiated tile size");
  static constexpr int kTileBytes = T * kBlockK;  // a K block of the tile's rows: swizzled 128-byte rows
  static constexpr int kAcc = T / 2;              // accumulators a thread: 64 rows × T / 128 threads
  static constexpr int kActBytes = kStageBlocks * kTileBytes;
  static constexpr int kXScaleBytes = kStageBlocks * T * 4;
  // Weights: FP8 takes two 64-byte K groups a K block, FP4 one; decode tiles are routed FP4 alone.
  static constexpr int kUnits = T == kGroupedTokens ? 2 : 1;
  static constexpr int kWeightBytes = 2 * kStageBlocks * 4 * kUnits * kWarpChunk;
  static constexpr int kStageBytes = (kActBytes + kWeightBytes + kWScaleBytes + kXScaleBytes + 1023) / 1024 * 1024;
  // Decode tiles: two blocks an SM of five stages each (~22 KB a stage), 128 KB of weights in flight an SM.
  static constexpr int kStages = T == kGroupedTokens ? 4 : 5;
  static constexpr int kBlocksPerSm = T == kGroupedTokens ? 1 : 2;
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes;  // + the 1024-byte alignment
  static_assert(kAcc * 128 * 4 <= kStageBytes, "the up kernel's w3 sums pass through the ring");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// The two warpgroups' matrices: warpgroup w multiplies the 16-row tiles tile0[w] .. + 3 of data[w] (MMA tile
// order, `groups` 64-byte K groups a row), with scales scale[w] (FP4: E8M0 in the same order; FP8: 128 × 128 block
// scales, scale_cols a row).
// Offsets within one matrix fit 32 bits (an expert matrix is a few MB; launch_grouped_wgmma checks).
struct Mats {
  const uint8_t* data[2];
  const uint8_t* scale[2];
  int tile0[2];
  int groups, scale_cols;
};

// The tile's activation rows (rows past its count repeat its last pair: computed on, never stored): byte offset
// of each row (2K bytes a row: moe_kernels.h) and of its first scale, in shared memory.
template <int T>
struct Rows {
  uint32_t bytes[T];
  uint32_t scales[T];
};

// One K block of a warp's tile, lane (g, c).
template <WFormat F>
struct Raw {
  static constexpr int kUnits = F == WFormat::kFP4 ? 1 : 2;  // K groups (64 bytes of a row) in a K block
  uint4 unit[2][kUnits];  // [row half][group]
  uint32_t scales[2];     // FP4: rows g, g + 8
  float block_scale;      // FP8
};

// The A fragments of the K block's four wgmma steps (a[step][0..3]: tc_wgmma.cuh's order) and the weight factor of
// rows g, g + 8. Lane c's unit gives step s the columns of wgmma_pos (moe_kernels.h): FP4 word s of its 32-column
// chunk, FP8 words 2(s % 2), 2(s % 2) + 1 of K group s / 2.
template <WFormat F>
__device__ __forceinline__ void decode(const Raw<F>& r, int c, uint32_t (&a)[4][4], float (&sw)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if constexpr (F == WFormat::kFP4) {
      uint32_t tab_lo, tab_hi;
      fp4_tables(r.scales[h], 0x4440u + c, tab_lo, tab_hi, sw[h]);
      const uint4 v = r.unit[h][0];
      fp4_lookup(v.x, tab_lo, tab_hi, a[0][h], a[0][2 + h]);
      fp4_lookup(v.y, tab_lo, tab_hi, a[1][h], a[1][2 + h]);
      fp4_lookup(v.z, tab_lo, tab_hi, a[2][h], a[2][2 + h]);
      fp4_lookup(v.w, tab_lo, tab_hi, a[3][h], a[3][2 + h]);
    } else {
      sw[h] = r.block_scale;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const uint4 v = r.unit[h][u];
        a[2 * u][h] = v.x;
        a[2 * u][2 + h] = v.y;
        a[2 * u + 1][h] = v.z;
        a[2 * u + 1][2 + h] = v.w;
      }
    }
  }
}

// A thread's share of the ring's copies, stage after stage: its cp.async sources at the next stage to load and
// their places in a stage, found once. Computed per stage from the K block (as before), the copies' addresses
// took ~100 instructions a stage a warp, a quarter of the decode tiles' loop (docs/design/moe.md, "The loads'
// addresses"). Stage layout as above; K block kbl's activation tile is T rows of 128 bytes, 16-byte chunk q of
// row m at chunk q ^ (m % 8) (the 128-byte swizzle the descriptor names); its scales where promote reads them
// (promote_scale_slot). Pieces of slot j: i = j · kThreads + thread.
template <WFormat F, int T>
struct Loader {
  static constexpr int kUnits = Raw<F>::kUnits;
  static constexpr int kActSlots = kStageBlocks * T * 8 / kThreads;
  static constexpr int kWeightSlots = 2 * kStageBlocks * 4 * kUnits * 64 / kThreads;
  static constexpr int kActBytes = Tile<T>::kActBytes, kWeightBytes = Tile<T>::kWeightBytes;
  // The K block of each piece within its stage, for the last stage of an odd count (nb = 1).
  static constexpr int act_kbl(int j, int tid) { return (j * kThreads + tid) / (T * 8); }
  static constexpr int weight_kbl(int j, int tid) { return ((j * kThreads + tid) / (256 * kUnits)) % kStageBlocks; }

  const uint8_t* act[kActSlots];
  const uint8_t* weight[kWeightSlots];
  const uint8_t* scale;  // FP4: a 16-byte piece of the weight scales (threads < 2 · kStageBlocks · 16); FP8: a block
                         // scale (threads < 2 · kStageBlocks)
  const float* xscale;   // an activation scale (threads < kStageBlocks · T)
  uint32_t act_dst[kActSlots], weight_dst, scale_dst, xscale_dst;

  __device__ __forceinline__ Loader(int kb, const uint8_t* x, const float* x_scale, const Rows<T>& rows,
                                    const Mats& w) {
    const int tid = int(threadIdx.x);
#pragma unroll
    for (int j = 0; j < kActSlots; ++j) {
      const int i = j * kThreads + tid;
      const int kbl = i / (T * 8), m = (i / 8) % T, q = i % 8;
      act[j] = x + rows.bytes[m] + uint32_t((kb + kbl) * kBlockK + 16 * q);
      act_dst[j] = kbl * Tile<T>::kTileBytes + m * kBlockK + 16 * (q ^ (m % 8));
    }
#pragma unroll
    for (int j = 0; j < kWeightSlots; ++j) {
      const int i = j * kThreads + tid;
      const int piece = i % 64, u = (i / 64) % kUnits, t = (i / (64 * kUnits)) % 4;
      const int kbl = (i / (256 * kUnits)) % kStageBlocks, wg = i / (256 * kUnits * kStageBlocks);
      weight[j] = (wg ? w.data[1] : w.data[0]) +
                  uint32_t((((wg ? w.tile0[1] : w.tile0[0]) + t) * w.groups + (kb + kbl) * kUnits + u) * kWarpChunk +
                           16 * piece);
    }
    {  // slot j's place: this one's plus a constant (piece, u and t move with j only by whole units)
      const int piece = tid % 64, u = (tid / 64) % kUnits, t = (tid / (64 * kUnits)) % 4;
      weight_dst = kActBytes + (t * Tile<T>::kUnits + u) * kWarpChunk + 16 * piece;
    }
    if constexpr (F == WFormat::kFP4) {  // 16-byte piece p of (warpgroup, K block, tile)
      const int tw = tid % 64, piece = tw % 4, t = (tw / 4) % 4, kbl = (tw / 16) % kStageBlocks,
                wg = tw / (16 * kStageBlocks);
      scale = (wg ? w.scale[1] : w.scale[0]) +
              uint32_t((((wg ? w.tile0[1] : w.tile0[0]) + t) * w.groups + kb + kbl) * 64 + 16 * piece);
      scale_dst = kActBytes + kWeightBytes + ((wg * kStageBlocks + kbl) * 4 + t) * 64 + 16 * piece;
    } else {
      const int ts = tid % (2 * kStageBlocks), kbl = ts % kStageBlocks, wg = ts / kStageBlocks;
      scale = (wg ? w.scale[1] : w.scale[0]) +
              4 * uint32_t((wg ? w.tile0[1] : w.tile0[0]) * kTileRows / 128 * w.scale_cols + kb + kbl);
      scale_dst = kActBytes + kWeightBytes + 4 * (wg * kStageBlocks + kbl);
    }
    {
      const int tx = tid % (kStageBlocks * T), kbl = tx / T, m = tx % T;
      xscale = x_scale + rows.scales[m] + uint32_t(kb + kbl);
      xscale_dst = kActBytes + kWeightBytes + kWScaleBytes + 4 * (kbl * T + promote_scale_slot(m, T / 4));
    }
  }

  // The next stage's K blocks (nb of them) into the stage at shared address st; then on to the stage after.
  __device__ __forceinline__ void load(uint32_t st, int nb) {
    const int tid = int(threadIdx.x);
    const bool whole = nb == kStageBlocks;  // every stage but an odd count's last
#pragma unroll
    for (int j = 0; j < kActSlots; ++j) {
      if (whole || act_kbl(j, tid) < nb) cp_async16(st + act_dst[j], act[j]);
      act[j] += kStageBlocks * kBlockK;
    }
#pragma unroll
    for (int j = 0; j < kWeightSlots; ++j) {
      const int i = j * kThreads;  // slot j's offset from slot 0, in whole (unit, tile, K block, warpgroup) steps
      const int u = (i / 64) % kUnits, t = (i / (64 * kUnits)) % 4, kbl = (i / (256 * kUnits)) % kStageBlocks;
      const int wg = i / (256 * kUnits * kStageBlocks);
      const uint32_t dst = weight_dst + (((wg * kStageBlocks + kbl) * 4 + t) * Tile<T>::kUnits + u) * kWarpChunk;
      if (whole || weight_kbl(j, tid) < nb) cp_async16(st + dst, weight[j]);
      weight[j] += kStageBlocks * kUnits * kWarpChunk;
    }
    if constexpr (F == WFormat::kFP4) {
      static_assert(2 * kStageBlocks * 4 * 4 <= kThreads);
      if (tid < 2 * kStageBlocks * 16 && (tid / 16) % kStageBlocks < nb) cp_async16(st + scale_dst, scale);
      scale += kStageBlocks * 64;
    } else {
      if (tid < 2 * kStageBlocks && tid % kStageBlocks < nb) cp_async4(st + scale_dst, scale);
      scale += 4 * kStageBlocks;
    }
    static_assert(kStageBlocks * T <= kThreads);  // one activation scale a thread at most
    if (tid < kStageBlocks * T && tid / T < nb) cp_async4(st + xscale_dst, xscale);
    xscale += kStageBlocks;
  }
};

// Lane (g, c) of warp `warp` in warpgroup wg: its raw bytes of K block kbl of stage st, decoded.
template <WFormat F, int T>
__device__ __forceinline__ void decode_stage(const uint8_t* st, int wg, int kbl, int warp, int lane,
                                             uint32_t (&a)[4][4], float (&sw)[2]) {
  constexpr int kActBytes = Tile<T>::kActBytes, kWeightBytes = Tile<T>::kWeightBytes, kSlots = Tile<T>::kUnits;
  Raw<F> r;
  const int chunk = (wg * kStageBlocks + kbl) * 4 + warp;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int u = 0; u < Raw<F>::kUnits; ++u)
      r.unit[h][u] = *reinterpret_cast<const uint4*>(st + kActBytes + (chunk * kSlots + u) * kWarpChunk + 16 * (32 * h + lane));
    if constexpr (F == WFormat::kFP4)
      r.scales[h] = *reinterpret_cast<const uint32_t*>(st + kActBytes + kWeightBytes + chunk * 64 + 32 * h + lane - lane % 4);
  }
  if constexpr (F == WFormat::kFP8)
    r.block_scale = reinterpret_cast<const float*>(st + kActBytes + kWeightBytes)[wg * kStageBlocks + kbl];
  decode<F>(r, lane % 4, a, sw);
}

// Issues K block kbl of stage st: its four wgmma steps into part (a cleared start), as one commit group.
template <int T>
__device__ __forceinline__ void issue(const uint8_t* st, int kbl, const uint32_t (&a)[4][4],
                                      float (&part)[Tile<T>::kAcc]) {
  using namespace tc;
  const uint64_t desc = smem_descriptor_sw128(st + kbl * Tile<T>::kTileBytes);
  wgmma_fence();  // a was just written
#pragma unroll
  for (int step = 0; step < 4; ++step)  // 32 bytes of K a step: 2 descriptor units
    if constexpr (T == 64) wgmma_m64n64k32_e4m3_rs(part, a[step], desc + 2 * step, step > 0 ? 1u : 0u);
    else wgmma_m64n16k32_e4m3_rs(part, a[step], desc + 2 * step, step > 0 ? 1u : 0u);
  wgmma_commit();
}

// The warpgroup's 64 rows × the tile's 64 pairs over K blocks [kb_begin, kb_end), in units of the output. Per
// stage: K block 0's wgmmas run while block 1 is decoded, block 1's while block 0 is promoted.
template <WFormat F, int T>
__device__ __forceinline__ void gemm_tile(const Mats& w, const uint8_t* act, const float* act_scale,
                                          const Rows<T>& rows, int kb_begin, int kb_end, uint8_t* ring,
                                          float (&total)[Tile<T>::kAcc]) {
  using namespace tc;
  const int wg = int(threadIdx.x / 128), warp = int(threadIdx.x / 32) % 4, lane = int(threadIdx.x % 32);
  const int c = lane % 4;
#pragma unroll
  for (int i = 0; i < Tile<T>::kAcc; ++i) total[i] = 0.0f;
  const int blocks = kb_end - kb_begin, stages = (blocks + kStageBlocks - 1) / kStageBlocks;
  const uint32_t ring_address = smem_address(ring);
  Loader<F, T> loader(kb_begin, act, act_scale, rows, w);
  const auto load = [&](int stage) {  // stages in order: the loader's pointers step one stage a call
    loader.load(ring_address + (stage % Tile<T>::kStages) * Tile<T>::kStageBytes,
                min(kStageBlocks, kb_end - kb_begin - stage * kStageBlocks));
  };
  constexpr int kStages = Tile<T>::kStages;
  for (int i = 0; i < kStages - 1; ++i) {  // one commit group a stage, empty past the end
    if (i < stages) load(i);
    cp_async_commit();
  }
  for (int s = 0; s < stages; ++s) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage s has landed for all threads, and stage s − 1 is read: its buffer takes the next
    if (s + kStages - 1 < stages) load(s + kStages - 1);
    cp_async_commit();
    const uint8_t* st = ring + (s % kStages) * Tile<T>::kStageBytes;
    const float* xs = reinterpret_cast<const float*>(st + Tile<T>::kActBytes + Tile<T>::kWeightBytes +
                                                     kWScaleBytes);
    // A stage's second block is issued whether or not it exists (the last stage of an odd count): its wgmmas
    // then run on stale stage bytes and are not promoted. No branch around the wgmmas, so ptxas sees which group
    // each wait completes.
    const bool second = s * kStageBlocks + 1 < blocks;
    uint32_t a0[4][4], a1[4][4];
    float sw0[2], sw1[2], part0[Tile<T>::kAcc], part1[Tile<T>::kAcc];
    decode_stage<F, T>(st, wg, 0, warp, lane, a0, sw0);
    issue<T>(st, 0, a0, part0);
    decode_stage<F, T>(st, wg, 1, warp, lane, a1, sw1);
    issue<T>(st, 1, a1, part1);
    wgmma_wait<1>();
    fence_registers(part0);
#pragma unroll
    for (int step = 0; step < 4; ++step) fence_registers(a0[step]);
    promote(total, part0, sw0, xs, c);
    wgmma_wait<0>();
    fence_registers(part1);
#pragma unroll
    for (int step = 0; step < 4; ++step) fence_registers(a1[step]);
    if (second) promote(total, part1, sw1, xs + T, c);
  }
  cp_async_wait<0>();
  __syncthreads();  // every stage is read: the caller may reuse the ring
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// Block (tile, row block): tile tile_begin + blockIdx.x / row_blocks of the plan, all of K.
template <bool kUp, int T>
__global__ void __launch_bounds__(kThreads, Tile<T>::kBlocksPerSm)
    grouped_wgmma_kernel(ExpertParams p, GroupedBuffers g, int tile_begin) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_wgmma[];
  // NOTE: swizzled tiles start on 1024-byte boundaries (the 128-byte swizzle repeats every 8 rows).
  uint8_t* const ring = smem_wgmma + ((1024 - (tc::smem_address(smem_wgmma) & 1023)) & 1023);
  __shared__ Rows<T> rows;
  // The decode tiles beside the shared expert's (launch_grouped_wgmma's beside_shared) may start now: they read
  // nothing this launch writes. They wait for it in their last block only, at its exit, so that what follows them
  // in the stream follows both launches. Their other blocks read without a wait (and through L1, unlike
  // launch.cuh's rule) what the launches before this one wrote: safe only because this launch is a plain one,
  // begun after those completed, and nothing runs between the two (launch_gemm_all).
  pdl_trigger();
  const bool last_block = T == kGroupedDecodeTokens && blockIdx.x == gridDim.x - 1;
  const int64_t out_rows = kUp ? p.I : p.D;
  const int row_blocks = int(out_rows / (kUp ? kUpRows : kDownRows));
  const int tile = tile_begin + int(blockIdx.x) / row_blocks, rb = int(blockIdx.x) % row_blocks;
  if (tile >= g.tiles[0]) {
    if (last_block) pdl_wait_predecessor();
    return;
  }
  const int expert = g.tile_expert[tile], pair0 = g.tile_pair0[tile], count = g.tile_count[tile];
  const int wg = int(threadIdx.x / 128), warp = int(threadIdx.x / 32) % 4, lane = int(threadIdx.x % 32);
  const MatFormat& fmt = expert < 0 ? (kUp ? p.shared_up : p.shared_down) : (kUp ? p.routed_up : p.routed_down);
  // up: both warpgroups the block's 64 rows, warpgroup 0 of w1, 1 of w3; down: 64 rows of w2 each.
  Mats w;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint8_t* data;
    const void* scale;
    if (expert < 0) {
      const MatView m = kUp ? (i == 0 ? p.shared_w1 : p.shared_w3) : p.shared_w2;
      data = m.data;
      scale = m.scale;
    } else {
      const ExpertPtrs e = p.experts[expert];
      data = kUp ? (i == 0 ? e.w1 : e.w3) : e.w2;
      scale = kUp ? (i == 0 ? e.s1 : e.s3) : e.s2;
    }
    w.data[i] = data;
    w.scale[i] = static_cast<const uint8_t*>(scale);
    w.tile0[i] = (rb * (kUp ? kUpRows : kDownRows) + (kUp ? 0 : 64 * i)) / kTileRows;
  }
  w.groups = int(fmt.row_bytes / kTileGroupBytes);
  w.scale_cols = int(fmt.scale_cols);
  const int64_t row0 = (wg ? w.tile0[1] : w.tile0[0]) * kTileRows;  // the warpgroup's first row
  const int K = int(kUp ? p.D : p.I), kblocks = K / kBlockK;
  if (threadIdx.x < T) {
    const int pair = pair0 + min(int(threadIdx.x), count - 1);
    const uint32_t row = uint32_t(kUp ? p.plan.pair_token[pair] : pair);
    rows.bytes[threadIdx.x] = row * 2 * uint32_t(K);
    rows.scales[threadIdx.x] = row * uint32_t(kblocks);
  }
  __syncthreads();
  const auto* act = reinterpret_cast<const uint8_t*>(kUp ? (expert < 0 ? g.xq_shared : g.xq_routed) : g.hq);
  const float* act_scale = kUp ? g.xs : g.hs;
  float total[Tile<T>::kAcc];
  if constexpr (T == kGroupedDecodeTokens) {  // routed FP4 alone (launch_gemm_all checks)
    gemm_tile<WFormat::kFP4, T>(w, act, act_scale, rows, 0, kblocks, ring, total);
  } else {
    if (fmt.format == WFormat::kFP4) gemm_tile<WFormat::kFP4, T>(w, act, act_scale, rows, 0, kblocks, ring, total);
    else gemm_tile<WFormat::kFP8, T>(w, act, act_scale, rows, 0, kblocks, ring, total);
  }

  const int g8 = lane / 4, c = lane % 4;
  const int64_t row = row0 + 16 * warp + g8;  // this thread's rows: row, row + 8
  if constexpr (kUp) {
    float* const w3_sums = reinterpret_cast<float*>(ring);  // the ring is drained: gemm_tile ends in a barrier
    const int t = int(threadIdx.x % 128);
    if (wg == 1)
#pragma unroll
      for (int i = 0; i < Tile<T>::kAcc; ++i) w3_sums[i * 128 + t] = total[i];
    __syncthreads();
    if (wg == 1) return;  // warpgroup 0 waits for the predecessor below, where the last block must
    float weight[Tile<T>::kAcc / 2];  // the shared expert (expert < 0) loads none: its pairs weigh 1
    load_pairs<Tile<T>::kAcc>(weight, p.plan.pair_weight, pair0, expert < 0 ? 0 : count, c, 1.0f);
#pragma unroll
    for (int i = 0; i < Tile<T>::kAcc; ++i) {
      if (tile_pair(i, c) >= count) continue;
      p.plan.h[int64_t(pair0 + tile_pair(i, c)) * p.I + row + 8 * ((i / 2) % 2)] =
          hidden(p, fmt.format, total[i], w3_sums[i * 128 + t], weight[pair_slot(i)]);
    }
  } else {
    int out[Tile<T>::kAcc / 2];
    load_pairs<Tile<T>::kAcc>(out, p.plan.pair_out, pair0, count, c, 0);
#pragma unroll
    for (int i = 0; i < Tile<T>::kAcc; ++i)
      if (tile_pair(i, c) < count)
        p.plan.y[int64_t(out[pair_slot(i)]) * p.D + row + 8 * ((i / 2) % 2)] = round_bf16(total[i]);
  }
  if (last_block) pdl_wait_predecessor();
#endif  // NOTE: other architectures get an empty body; CudaOps::moe sets GroupedBuffers::wgmma on sm_90 only
}

std::atomic<int64_t> g_launches{0}, g_decode_launches{0};

}  // namespace

int64_t grouped_wgmma_launches() { return g_launches.load(std::memory_order_relaxed); }
int64_t grouped_decode_tile_launches() { return g_decode_launches.load(std::memory_order_relaxed); }

namespace {

template <int T>
void launch_tiles(bool up, const ExpertParams& p, const GroupedBuffers& g, int64_t tile_begin, int64_t tile_end,
                  cudaStream_t stream, bool pdl) {
  const int64_t out_rows = up ? p.I : p.D;
  const int block_rows = up ? kUpRows : kDownRows;
  const auto kernel = up ? grouped_wgmma_kernel<true, T> : grouped_wgmma_kernel<false, T>;
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), Tile<T>::kSmemBytes);
  const int64_t blocks = (tile_end - tile_begin) * (out_rows / block_rows);
  DSV4_CHECK(blocks < (int64_t(1) << 31), "moe: too many grouped tiles");
  if (blocks == 0) return;
  g_launches.fetch_add(1, std::memory_order_relaxed);
  if (T == kGroupedDecodeTokens) g_decode_launches.fetch_add(1, std::memory_order_relaxed);
  launch_pdl_args(kernel, dim3(unsigned(blocks)), dim3(kThreads), size_t(Tile<T>::kSmemBytes), stream, pdl,
                  /*cluster=*/1, p, g, int(tile_begin));
}

}  // namespace

void launch_grouped_wgmma(bool up, const ExpertParams& p, const GroupedBuffers& g, int64_t tile_begin,
                          int64_t tile_end, int tile_pairs, cudaStream_t stream, bool beside_shared) {
  const int64_t out_rows = up ? p.I : p.D;
  const int block_rows = up ? kUpRows : kDownRows;
  DSV4_CHECK(out_rows % block_rows == 0 && p.D % kBlockK == 0 && p.I % kBlockK == 0,
             "moe: the wgmma grouped GEMMs need D and I multiples of 128 (D ", p.D, ", I ", p.I, ")");
  // 32-bit offsets (Mats, Rows): activation rows of 2K bytes, matrices of rows × row_bytes.
  const int64_t act_rows = p.n * (p.k + 1);
  DSV4_CHECK(act_rows * 2 * std::max(p.D, p.I) < (int64_t(1) << 32) && p.I * p.D < (int64_t(1) << 31),
             "moe: a step of ", p.n, " tokens is too large for the wgmma grouped GEMMs' 32-bit offsets");
  DSV4_CHECK(tile_pairs == kGroupedTokens || tile_pairs == kGroupedDecodeTokens, "moe: wgmma tiles of ", tile_pairs,
             " pairs");
  DSV4_CHECK(!beside_shared || tile_pairs == kGroupedDecodeTokens, "moe: only decode tiles run beside the shared "
             "expert's");
  if (tile_pairs == kGroupedTokens) launch_tiles<kGroupedTokens>(up, p, g, tile_begin, tile_end, stream, false);
  else launch_tiles<kGroupedDecodeTokens>(up, p, g, tile_begin, tile_end, stream, beside_shared);
}

}  // namespace dsv4::cuda::moe
