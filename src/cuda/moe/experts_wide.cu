// moe family (CUDA): the grouped path's routed FP4 GEMMs in wide tiles of kGroupedWideTokens pairs, on wgmma with
// both operands in shared memory (sm_90a), where experts hold many pairs (prefill). The same function and
// arithmetic as grouped_wgmma_kernel (experts_wgmma.cu: e4m3 weights widened from FP4 as wgmma_fp4.cuh says ×
// act_quant'ed e4m3 activations, each K block's wgmma sums promoted into fp32 with both scales); what differs is
// who does the work. There every consumer warp decoded its own weights into wgmma's A registers between its MMAs,
// and the kernel was bound by instruction issue on those chains (docs/design/moe.md, "wgmma"). Here:
//   warpgroup 0, the producer: its warps 0–1 copy each K block's weights into a ring of kWStages stages (kWAhead
//     K blocks ahead: they stream from HBM) by cp.async completing on an mbarrier; one thread of warp 2 copies the
//     tile's activation rows and their scales into a ring of kOStages operand stages (kOAhead ahead: L2, since
//     every row block of a tile reads them) as two TMA boxes — the rows lie a pair a row (grouped_quant writes x
//     to each of its pairs' rows for these tiles) and land in the 128-byte swizzle wgmma reads; then all four warps
//     decode the K block's 128 weight rows to e4m3 into the operand stage as wgmma's A (K-major, the same swizzle)
//     and mark the stage ready.
//     NOTE: a thread's cp.async arrival on an mbarrier waits for all its earlier cp.async copies, so a thread
//     copying weights must not also signal activation stages that way;
//   warpgroups 1 and 2, the consumers: 64 A rows each × the tile's 128 pairs (m64n128k32, four a K block) and the
//     promotion, then release the stage.
// A block is persistent over the launch's (tile, row block) items, the rings running on from one item to the next,
// so an item's epilogue overlaps the next one's first copies.
// Items: up: 64 output rows of w1 and of w3. Each 16-row slice of A holds rows r .. r + 7 of w1 (slice rows 0–7)
// and the same rows of w3 (8–15), so a consumer thread holds the w1 and w3 sums of one output row (tc_wgmma.cuh's
// rows g and g + 8) and takes the SwiGLU in registers. down: 128 rows of w2, 64 a consumer.
// What bounds it (docs/design/moe.md, "The wide kernel by elimination"): ~2,300 cycles a K block against 512 of
// tensor time. The producer's decode is ~18% of it; the rest is the consumers' order: both warpgroups wait on one
// ready barrier, then run wgmma → wait → promotion in series, so the tensor cores idle through every promotion —
// with no decode and no promotion at all this skeleton still takes ~1,600 cycles a K block.
// The K order is the columns' own: a weight lane's 16-byte unit of the MMA tile order is 32 consecutive columns
// of one row (weight_mma.cuh), whose e4m3 codes are two 16-byte chunks of A's row; grouped_quant writes the
// activations in column order for these tiles (ActOrder::natural).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "cuda/common/barrier.cuh"
#include "cuda/common/check.h"
#include "cuda/common/cp_async.cuh"
#include "cuda/common/smem.h"
#include "cuda/common/tensor_map.h"
#include "cuda/gemm/tc_ptx.cuh"
#include "cuda/gemm/tc_wgmma.cuh"
#include "cuda/moe/experts.cuh"
#include "cuda/moe/moe_grouped.h"
#include "cuda/moe/wgmma_fp4.cuh"

namespace dsv4::cuda::moe {

namespace {

constexpr int kThreads = 384;  // the producer warpgroup, then two consumer warpgroups
constexpr int kBlockK = 128;   // one act_quant block: four wgmma steps of 32
constexpr int kN = kGroupedWideTokens;
constexpr int kARows = 128;                    // A rows a K block: 8 weight tiles of 16 rows
constexpr int kUpRows = 64, kDownRows = 128;   // output rows of an item
constexpr int kWTiles = kARows / kTileRows;
constexpr int kWTileBytes = kTileRows * kTileGroupBytes;  // a 16-row tile's FP4 K block: one 1 KB K group
// Weight stage: the 8 tiles' K groups as they lie in the MMA tile order, then their scale bytes (64 a tile).
constexpr int kWStageBytes = kWTiles * kWTileBytes + kWTiles * 64;
// Operand stage: A [128 rows][128 bytes] and B [kN rows][128 bytes], both K-major with the 128-byte swizzle (16-byte
// chunk q of row r at q ^ (r % 8), as TMA's SWIZZLE_128B writes B), then the A rows' weight factors and the pairs'
// activation scales in pair order from the tile's first pair rounded down to 4 (a TMA box starts on a 16-byte
// boundary of its inner dimension), padded to 1024 bytes.
constexpr int kABytes = kARows * kBlockK, kBBytes = kN * kBlockK;
constexpr int kScaleBox = kN + 4;
constexpr int kOStageBytes = (kABytes + kBBytes + kARows * 4 + kScaleBox * 4 + 1023) / 1024 * 1024;
static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "swizzled tiles start on 1024-byte boundaries");
constexpr int kWStages = 8, kOStages = 4;
constexpr int kSmemBytes = 1024 + kOStages * kOStageBytes + kWStages * kWStageBytes;  // + the 1024-byte alignment

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// The producer copies K block j + kWAhead's weights and j + kOAhead's activations, then decodes j. A weight stage
// is free once the producer decoded it; an operand stage once the consumers released it, and kOAhead = kOStages − 2
// lets the producer decode j while the consumers multiply j − 1 (its copies wait for j − 2's release).
constexpr int kWAhead = kWStages - 1, kOAhead = kOStages - 2;
constexpr int kProducerBarrier = 1;  // named barrier of the producer warpgroup
constexpr int kActivationThread = 64;  // warp 2's lane 0 issues the activations' TMA copies

struct Barriers {
  uint64_t wload[kWStages];  // a weight stage's copies landed (64 arrivals: warps 0–1)
  uint64_t oload[kOStages];  // an operand stage's activation boxes landed (TMA transactions)
  uint64_t ready[kOStages];  // its A decoded (128)
  uint64_t empty[kOStages];  // its products promoted (256 consumer arrivals)
};

// The launch's items in a block's order: item i of block b is b + i·gridDim.x; its tile and row block.
struct Item {
  int tile, rb;
};
__device__ __forceinline__ Item item_at(int local, int tile_begin, int row_blocks) {
  const int item = int(blockIdx.x) + local * int(gridDim.x);
  return {tile_begin + item / row_blocks, item % row_blocks};
}

// The weight tile tt (0..7) of an item: up tiles 0–3 of w1's and 4–7 of w3's 64 rows, down 8 tiles of w2.
template <bool kUp>
__device__ __forceinline__ void weight_tile(const ExpertPtrs& e, int rb, int tt, const uint8_t*& data,
                                            const uint8_t*& scale, int& tile) {
  if constexpr (kUp) {
    data = tt < 4 ? e.w1 : e.w3;
    scale = static_cast<const uint8_t*>(tt < 4 ? e.s1 : e.s3);
    tile = rb * (kUpRows / kTileRows) + tt % 4;
  } else {
    data = e.w2;
    scale = static_cast<const uint8_t*>(e.s2);
    tile = rb * (kDownRows / kTileRows) + tt;
  }
}

// A weight warp's thread t (0..63): its piece t of each of the item's 8 weight tiles (16 bytes of 1 KB), and for
// t < 32 piece t % 4 of tile t / 4's 64 scale bytes; K block 0's.
struct WeightCopies {
  const uint8_t* data[kWTiles];
  const uint8_t* scale;
};

template <bool kUp>
__device__ __forceinline__ WeightCopies weight_copies(const ExpertParams& p, const GroupedBuffers& g, Item it, int K,
                                                      int t) {
  WeightCopies c;
  const ExpertPtrs e = p.experts[g.tile_expert[it.tile]];
  const int groups = K / kBlockK;  // FP4: a K block is one 64-byte K group of a row
  const uint8_t *data, *scale;
  int tile;
#pragma unroll
  for (int tt = 0; tt < kWTiles; ++tt) {
    weight_tile<kUp>(e, it.rb, tt, data, scale, tile);
    c.data[tt] = data + uint32_t(tile * groups) * kWTileBytes + 16 * t;
  }
  weight_tile<kUp>(e, it.rb, t / 4 % kWTiles, data, scale, tile);
  c.scale = scale + uint32_t(tile * groups) * 64 + 16 * (t % 4);
  return c;
}

// Weight warps: the weight stage of K block kb.
__device__ __forceinline__ void copy_weights(const WeightCopies& c, int kb, uint32_t stage, uint32_t bar, int t) {
#pragma unroll
  for (int tt = 0; tt < kWTiles; ++tt) cp_async16(stage + tt * kWTileBytes + 16 * t, c.data[tt] + kb * kWTileBytes);
  if (t < 32) cp_async16(stage + kWTiles * kWTileBytes + 16 * t, c.scale + kb * 64);
  cp_async_mbarrier_arrive(bar);
}

// Producer warp pw, lane (g, c): weight tiles 2pw, 2pw + 1 of a weight stage, row halves h, decoded to e4m3 rows of
// A with their weight factors.
template <bool kUp>
__device__ __forceinline__ void decode_weights(const uint8_t* ws, uint8_t* os, int pw, int lane) {
  const int g = lane / 4, c = lane % 4;
  float* const sw = reinterpret_cast<float*>(os + kABytes + kBBytes);
  // Every load first: the stores below may alias them as far as the compiler knows, and would order each
  // (tile, half)'s loads after the previous one's stores.
  uint4 raw[2][2];
  uint32_t scales[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int tt = 2 * pw + i;
      raw[i][h] = *reinterpret_cast<const uint4*>(ws + tt * kWTileBytes + 16 * (32 * h + lane));
      scales[i][h] = *reinterpret_cast<const uint32_t*>(ws + kWTiles * kWTileBytes + tt * 64 + 32 * h + 4 * g);
    }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int tt = 2 * pw + i;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4 v = raw[i][h];
      uint32_t tab_lo, tab_hi;
      float factor;
      fp4_tables(scales[i][h], 0x4440u + c, tab_lo, tab_hi, factor);
      uint32_t x[8];
      fp4_lookup(v.x, tab_lo, tab_hi, x[0], x[1]);
      fp4_lookup(v.y, tab_lo, tab_hi, x[2], x[3]);
      fp4_lookup(v.z, tab_lo, tab_hi, x[4], x[5]);
      fp4_lookup(v.w, tab_lo, tab_hi, x[6], x[7]);
      // The tile's row 8h + g: up, slice 2(tt % 4) + h, its w1 half (tt < 4) or w3 half; down, in place.
      const int r = kUp ? 16 * (2 * (tt % 4) + h) + 8 * (tt / 4) + g : 16 * tt + 8 * h + g;
      uint8_t* const row = os + r * kBlockK;
      *reinterpret_cast<uint4*>(row + 16 * ((2 * c) ^ (r % 8))) = make_uint4(x[0], x[1], x[2], x[3]);
      *reinterpret_cast<uint4*>(row + 16 * ((2 * c + 1) ^ (r % 8))) = make_uint4(x[4], x[5], x[6], x[7]);
      if (c == 0) sw[r] = factor;
    }
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <bool kUp>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_wide_kernel(ExpertParams p, GroupedBuffers g, int tile_begin, const __grid_constant__ CUtensorMap act_map,
                        const __grid_constant__ CUtensorMap scale_map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace tc;
  extern __shared__ uint8_t smem_wide[];
  __shared__ Barriers bars;
  uint8_t* const oring = smem_wide + ((1024 - (smem_address(smem_wide) & 1023)) & 1023);
  uint8_t* const wring = oring + kOStages * kOStageBytes;
  const int t = int(threadIdx.x);
  const int K = int(kUp ? p.D : p.I), kblocks = K / kBlockK;
  const int row_blocks = int((kUp ? p.I : p.D) / (kUp ? kUpRows : kDownRows));
  const int items = (g.tiles[0] - tile_begin) * row_blocks;
  const int mine = items > int(blockIdx.x) ? (items - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x) : 0;
  const int jobs = mine * kblocks;  // (item, K block) pairs of this block, in order
  if (t == 0) {
    for (int s = 0; s < kWStages; ++s) mbar_init(&bars.wload[s], 64);
    for (int s = 0; s < kOStages; ++s) {
      mbar_init(&bars.oload[s], 1);
      mbar_init(&bars.ready[s], 128);
      mbar_init(&bars.empty[s], 256);
    }
    fence_barrier_init();
  }
  if (t == kActivationThread) {
    prefetch_tensor_map(&act_map);
    prefetch_tensor_map(&scale_map);
  }
  __syncthreads();

  if (t < 128) {  // ---- producer
    const uint32_t wring_a = smem_address(wring);
    // Copy cursors: the job whose weights / activations go next, and its item's copies.
    int wj = 0, oj = 0, pair0 = 0;
    WeightCopies wc{};
    const auto weights = [&](int j) {  // j = wj, in order; warps 0–1
      if (t >= 64) return;
      const int kb = j % kblocks;
      if (kb == 0) wc = weight_copies<kUp>(p, g, item_at(j / kblocks, tile_begin, row_blocks), K, t);
      const int s = j % kWStages;
      copy_weights(wc, kb, wring_a + s * kWStageBytes, smem_address(&bars.wload[s]), t);
    };
    // One thread: the tile's pair rows and their scales, two TMA boxes. Rows past the tile's count are the next
    // expert's pairs, rows never written this step (another rank's share) or zeros past P: only their own output
    // columns see them, and those are never stored.
    const auto activations = [&](int j) {
      if (t != kActivationThread) return;
      const int kb = j % kblocks;
      if (kb == 0) pair0 = g.tile_pair0[item_at(j / kblocks, tile_begin, row_blocks).tile];
      const int s = j % kOStages;
      mbar_wait(&bars.empty[s], ((j / kOStages) & 1) ^ 1);  // its previous use released (a fresh one passes)
      uint8_t* const stage = oring + s * kOStageBytes;
      mbar_arrive_expect_tx(&bars.oload[s], kBBytes + kScaleBox * 4);
      tma_load_2d(stage + kABytes, &act_map, &bars.oload[s], kb * kBlockK, pair0);
      tma_load_2d(stage + kABytes + kBBytes + kARows * 4, &scale_map, &bars.oload[s], pair0 & ~3, kb);
    };
    for (; wj < min(kWAhead, jobs); ++wj) weights(wj);
    for (; oj < min(kOAhead, jobs); ++oj) activations(oj);
    for (int j = 0; j < jobs; ++j) {
      if (wj < jobs) weights(wj++);
      if (oj < jobs) activations(oj++);
      mbar_wait(&bars.wload[j % kWStages], (j / kWStages) & 1);
      decode_weights<kUp>(wring + (j % kWStages) * kWStageBytes, oring + (j % kOStages) * kOStageBytes, t / 32,
                          t % 32);
      fence_proxy_async();  // A's plain stores, before the consumers' wgmma reads them
      mbar_arrive(&bars.ready[j % kOStages]);
      // Weight stage j is read by all before warps 0–1 refill it next; and the activation thread's wait for an
      // operand stage's release comes before the A stores of the other threads into it, two iterations on.
      barrier_sync(kProducerBarrier, 128);
    }
    return;
  }

  // ---- consumers: warpgroup cw, warp w of it, lane (g, c)
  const int cw = t / 128 - 1, w = (t / 32) % 4, lane = t % 32, g8 = lane / 4, c = lane % 4;
  const int arow = 64 * cw + 16 * w + g8;  // this thread's A rows: arow, arow + 8
  int j = 0;
  for (int local = 0; local < mine; ++local) {
    const Item it = item_at(local, tile_begin, row_blocks);
    const int pair0 = g.tile_pair0[it.tile], count = g.tile_count[it.tile];
    float total[kN / 2];
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) total[i] = 0.0f;
    for (int kb = 0; kb < kblocks; ++kb, ++j) {
      const int s = j % kOStages;
      const uint32_t parity = (j / kOStages) & 1;
      mbar_wait(&bars.oload[s], parity);
      mbar_wait(&bars.ready[s], parity);
      const uint8_t* const os = oring + s * kOStageBytes;
      const uint64_t desc_a = smem_descriptor_sw128(os + 64 * cw * kBlockK), desc_b = smem_descriptor_sw128(os + kABytes);
      float part[kN / 2];
      wgmma_fence();
#pragma unroll
      for (int step = 0; step < 4; ++step)  // 32 bytes of K a step: 2 descriptor units
        wgmma_m64n128k32_e4m3(part, desc_a + 2 * step, desc_b + 2 * step, step > 0 ? 1u : 0u);
      wgmma_commit();
      wgmma_wait<0>();
      fence_registers(part);
      const float* const sw_all = reinterpret_cast<const float*>(os + kABytes + kBBytes);
      const float sw[2] = {sw_all[arow], sw_all[arow + 8]};
      promote_natural<kN / 2>(total, part, sw, sw_all + kARows + (pair0 & 3), c);
      mbar_arrive(&bars.empty[s]);
    }
    if constexpr (kUp) {
      const int64_t row = int64_t(it.rb) * kUpRows + 8 * (4 * cw + w) + g8;  // slice 4cw + w's output row
      float weight[kN / 4];
      load_pairs<kN / 2>(weight, p.plan.pair_weight, pair0, count, c, 0.0f);
#pragma unroll
      for (int i = 0; i < kN / 2; ++i) {
        if ((i / 2) % 2 || tile_pair(i, c) >= count) continue;  // i: the w1 sum (row g); i + 2: the w3 sum (row g + 8)
        p.plan.h[int64_t(pair0 + tile_pair(i, c)) * p.I + row] =
            hidden(p, WFormat::kFP4, total[i], total[i + 2], weight[pair_slot(i)]);
      }
    } else {
      const int64_t row = int64_t(it.rb) * kDownRows + arow;
      int out[kN / 4];
      load_pairs<kN / 2>(out, p.plan.pair_out, pair0, count, c, 0);
#pragma unroll
      for (int i = 0; i < kN / 2; ++i)
        if (tile_pair(i, c) < count)
          p.plan.y[int64_t(out[pair_slot(i)]) * p.D + row + 8 * ((i / 2) % 2)] = round_bf16(total[i]);
    }
  }
#endif  // NOTE: other architectures get an empty body; grouped_routed_tile picks wide tiles on sm_90 only
}

std::atomic<int64_t> g_launches{0};

}  // namespace

int64_t grouped_wide_launches() { return g_launches.load(std::memory_order_relaxed); }

void launch_grouped_wide(bool up, const ExpertParams& p, const GroupedBuffers& g, int64_t tile_begin,
                         int64_t tile_end, cudaStream_t stream) {
  DSV4_CHECK(p.routed_up.format == WFormat::kFP4 && p.routed_down.format == WFormat::kFP4 && p.routed_up.tiled &&
                 p.routed_down.tiled,
             "moe: wide tiles take routed FP4 experts in the MMA tile order");
  static_assert(kBlockK % kUpRows == 0 && kBlockK % kDownRows == 0, "whole K blocks make whole row blocks");
  DSV4_CHECK(p.D % kBlockK == 0 && p.I % kBlockK == 0,
             "moe: wide tiles need D and I multiples of 128 (D ", p.D, ", I ", p.I, ")");
  // 32-bit offsets (weight_copies): matrices of rows × row_bytes; TMA coordinates: pairs.
  const int64_t P = p.n * p.k;
  DSV4_CHECK(P < (int64_t(1) << 31) && p.I * p.D < (int64_t(1) << 31),
             "moe: a step of ", p.n, " tokens is too large for the wide tiles' 32-bit offsets");
  DSV4_CHECK(g.xq_pairs && g.xs_pairs && g.hs_pairs && g.pairs_ld >= P, "moe: wide tiles without their buffers");
  const int64_t items = (tile_end - tile_begin) * (up ? p.I / kUpRows : p.D / kDownRows);
  if (items <= 0) return;
  DSV4_CHECK(items < (int64_t(1) << 31), "moe: too many grouped tiles");
  int device = 0, sms = 0;
  DSV4_CUDA_CHECK(cudaGetDevice(&device));
  DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const auto kernel = up ? grouped_wide_kernel<true> : grouped_wide_kernel<false>;
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), kSmemBytes);
  g_launches.fetch_add(1, std::memory_order_relaxed);
  // The pair rows: x's (xq_pairs) or h's (hq's first P·I bytes), in boxes of a tile's rows × one K block; their
  // scales [K / 128, pairs_ld] in boxes of one K block × a tile's pairs. Rows past P read as zeros.
  const int64_t K = up ? p.D : p.I;
  static_assert(kBlockK == 128, "a K block of e4m3 is one 128-byte swizzle row");
  const CUtensorMap act_map =
      operand_map(up ? static_cast<const void*>(g.xq_pairs) : g.hq, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, P, K, kN);
  const CUtensorMap scale_map = tensor_map_2d(up ? g.xs_pairs : g.hs_pairs, CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
                                              K / kBlockK, g.pairs_ld, g.pairs_ld * 4, 1, kScaleBox,
                                              CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                              "wide tiles' activation scales");
  kernel<<<unsigned(std::min<int64_t>(sms, items)), kThreads, kSmemBytes, stream>>>(p, g, int(tile_begin), act_map,
                                                                                    scale_map);
  DSV4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dsv4::cuda::moe
