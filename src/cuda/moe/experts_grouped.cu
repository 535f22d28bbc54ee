// moe family (CUDA): the grouped FP8 GEMM path of the expert kernels, for fast numerics at prefill sizes
// (moe_kernels.h lists its launches). At n tokens × top-k each expert holds ~n·k/E pairs: a real GEMM per
// expert, where the item kernels (experts_items.cu) multiply at most kChunk pairs per pass and decode every
// weight once per pass.
//
// The official V4 arithmetic (fast-numerics.md §1.4, §1.5): activations act_quant'ed to e4m3 with a power-of-two
// scale per token per 128 columns, weights as e4m3 values, their exact products summed on the tensor cores into
// fp32, the scales applied to the fp32 partial sum of each 128-column K block, the sums in fp32; the w1 / w3
// outputs rounded to bf16, the SwiGLU with its clamp and the routing weight in fp32, h rounded to bf16 and
// act_quant'ed again for w2, the w2 outputs bf16, the combine in the CPU's order (ascending expert, then the
// shared one) rounded once. The e4m3 values multiply as f16 operands (mma.sync m16n8k16, exact): sm_90 has no
// native e4m3 mma.sync, and its emulation of one (f16 conversions of both operands, four f16 MMAs, fp32 adds)
// cost ~5× the instructions (docs/design/moe.md, "What bounds the grouped GEMMs"). Where it differs from
// DeepSeek's fp4_gemm: FP4's per-32 weight scale is applied inside the f16 value, relative to the largest of the
// row's four scales in the K block, which is applied to the partial sum with the activation scale (exact: the
// products e2m1 · 2^(b − b_max + 1) are f16 values for b_max − b ≤ kGroupedScaleSpan, checked on the host), so
// the tensor cores sum 128 products before the fp32 scaling instead of 32. Only the order of the sums changes.
// The FP4 words are in the MMA bit order (weight_mma.cuh), decoded to f16 by a table lifted by b − b_max + 1.
//
// Weights are read as they lie on the device, in the MMA tile order (weight_mma.cuh, laid out for e4m3
// m16n8k32): for K group G of tile T, lane (g, c) loads 16 bytes of rows g and g + 8. Step j of a K block
// (32 columns, two k16 MMAs) takes from them:
//   FP4: one K group is one 128-column K block; the lane's chunk c (32 columns) gives step j its word j: the
//        elements 0, 2 | 4, 6 as the first MMA's a0 / a1 | a2 / a3 and 1, 3 | 5, 7 as the second's (f16 pairs).
//   FP8: two K groups make a K block; step j takes words x = 2(j % 2) and y = x + 1 of group 2·kb + j / 2:
//        x's bytes 0, 1 | 2, 3 as the first MMA's a0 / a1 | a2 / a3, y's as the second's.
// The activations are written once (grouped_quant) as f16 codes in the matching "fragment order": per
// 128-column block, 16 bytes per (step j, lane c) at byte (4j + c)·16, the b0, b1 of the first MMA then of the
// second — one 16-byte shared-memory load per token per step.
// From grouped_wgmma_min_pairs() pairs an expert on average the tiles of kGroupedTokens run on wgmma instead
// (experts_wgmma.cu, GroupedBuffers::wgmma), and grouped_quant writes their activations as e4m3 bytes in its order;
// so do routed FP4 decode tiles of kGroupedDecodeTokens pairs, wgmma's alone (grouped_routed_tile).
//
// Work: a block owns one tile (≤ kGroupedTokens pairs of one expert; routed FP4 tiles of ≤ kGroupedSmallTokens
// where experts hold few pairs, on a kernel of 128 registers: grouped_routed_tile) × one block of output rows;
// its 8 warps own 2 row tiles each (up: the same 16 rows of w1 and w3, so the SwiGLU stays in registers; down:
// 32 rows of w2) over all the tile's pairs. Each warp decodes its weights once per K block from registers (loads one block
// ahead: a shared-memory ring for them measured 8% slower) and reuses them over the tile's 8-pair MMA columns;
// the pairs' activations come through a two-stage cp.async ring in shared memory that all 8 warps read. The shared expert alone (launch_shared_grouped) has one to
// three tiles: 16 row blocks of w1 / w3 at I = 2048 (8 at a tensor-parallel rank's 1024) would leave most SMs
// idle, so its K is split over blocks (GroupedBuffers::up_splits / down_splits) whose fp32 sums a finish launch
// adds in split order: only the order of the sums changes.
#include "cuda/common/cp_async.cuh"
#include "cuda/common/fp_grid.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/smem.h"
#include "cuda/moe/experts.cuh"
#include "cuda/moe/moe_grouped.h"

#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <limits>

namespace dsv4::cuda::moe {

namespace {

constexpr int kGBlockK = 128;                     // K block: one act_quant block, four (e4m3-order) MMA steps
constexpr int kGBlockBytes = kGBlockK * 2;        // a token's K block: f16 codes
constexpr int kGStageBlocks = 4;                  // K blocks per ring stage
constexpr int kGStageBytes = kGBlockBytes * kGStageBlocks;
// A token's stage row: 64 bytes of padding put the 64 bytes that tokens g and g + 1 give one MMA step (16 per
// lane) in the two halves of a 128-byte bank window: a 16-byte load per lane takes four wavefronts, the least.
constexpr int kGRowStride = kGStageBytes + 64;
constexpr int kGWarps = 8, kGThreads = kGWarps * 32;
constexpr int kGUpRows = kGWarps * 16;    // up: each warp 16 rows of w1 and of w3
constexpr int kGDownRows = kGWarps * 32;  // down: each warp 32 rows of w2
// The ring of a kernel whose tiles hold `tokens` pairs: two stages of rows and scales.
constexpr size_t grouped_smem_bytes(int tokens) {
  return 2 * (size_t(tokens) * kGRowStride + kGStageBlocks * size_t(tokens) * 4);
}

// Floats of one (tile, split)'s partial sums: up [w1 | w3][I][tokens], down [D][tokens].
__host__ __device__ inline int64_t split_slab(const ExpertParams& p, bool up) {
  return (up ? 2 * p.I : p.D) * kGroupedTokens;
}

// Blocks a GEMM's K splits into: enough (tile, row block, split) blocks for one per SM, at most one K block each.
int grouped_splits(int64_t tiles, int64_t out_rows, int block_rows, int64_t K, int sm_count) {
  const int64_t blocks = tiles * ((out_rows + block_rows - 1) / block_rows);
  return int(std::clamp<int64_t>(sm_count / std::max<int64_t>(blocks, 1), 1, K / kGBlockK));
}

// The crossovers against the item kernels (docs/design/moe.md, "The grouped path", "The shared expert alone" and
// "The loads' addresses"): the grouped path from 5 tokens at I ≥ 2048, 8 at a `--tp 2` rank's 1024, 12 below (the
// narrower the experts, the fewer blocks the decode tiles have to fill the GPU with); the shared expert alone from
// 32 tokens where I ≥ 1024.
constexpr int64_t kGroupedMinTokensWide = 5, kGroupedMinTokensHalf = 8, kGroupedMinTokensNarrow = 12;
constexpr int64_t kSharedGroupedMinTokens = 32, kSharedGroupedMinInter = 1024;
std::atomic<int64_t> g_min_tokens{0};  // 0: the default (set_grouped_min_tokens)
std::atomic<int64_t> g_shared_min_tokens{0};
// Small routed tiles up to this many pairs an expert on average (docs/design/moe.md, "Small routed tiles").
constexpr int64_t kSmallTileMaxPairs = 16;
std::atomic<int64_t> g_small_tile_max_pairs{-1};  // < 0: the default
// Decode tiles on wgmma up to this many pairs an expert on average (docs/design/moe.md, "Decode tiles on wgmma" and
// "The FP4 bit order": 1024 tokens of V4-Flash, 2500 against 2686 µs a layer for tiles of 64 on an H200; at 1536
// tokens, 36 pairs, 3430 against 2893).
constexpr int64_t kDecodeTileMaxPairs = 24;
std::atomic<int64_t> g_decode_tile_max_pairs{-1};  // < 0: the default
// Wide tiles from this many pairs an expert on average (docs/design/moe.md, "Wide tiles": 2560 tokens of V4-Flash,
// 4460 against 4625 µs a layer on an H200; 5695 against 6681 at 4096).
constexpr int64_t kWideTileMinPairs = 60;
std::atomic<int64_t> g_wide_tile_min_pairs{-1};  // < 0: the default
std::atomic<bool> g_wgmma{true};
// wgmma from this many pairs an expert on average (docs/design/moe.md, "wgmma").
constexpr int64_t kWgmmaMinPairs = 32;
std::atomic<int64_t> g_wgmma_min_pairs{0};  // 0: the default

// ---- fragment order

// Place (in f16 codes) of column `col` (0 .. 127) of a K block in the fragment order of format fp4 / fp8 (file
// comment).
__device__ __forceinline__ int fragment_pos(bool fp4, int col) {
  if (fp4) {  // col = 32c + 8j + m: the even m (first MMA), then the odd
    const int c = col / 32, j = (col / 8) % 4, m = col % 8;
    return (j * 4 + c) * 8 + (m % 2) * 4 + m / 2;
  }
  const int q = col / 64, c = (col / 16) % 4, h = (col / 8) % 2, i = col % 8;  // col = 64q + 16c + 8h + i
  return ((2 * q + h) * 4 + c) * 8 + i;
}

// ---- grouped_quant: act_quant of rows into e4m3 in fragment order

// Which GEMM kernel reads the rows, for which weight format: mma.sync's f16 codes in fragment_pos order, wgmma's
// e4m3 bytes in wgmma_pos order (moe_kernels.h), or the wide tiles' e4m3 bytes in column order (natural).
struct ActOrder {
  bool wgmma = false;
  bool fp4 = false;
  bool natural = false;
};

struct QuantParams {
  const float* src = nullptr;  // [rows, K]
  int64_t rows = 0, K = 0;
  uint16_t* out0 = nullptr;  // rows [0, end0) in order0
  int64_t end0 = 0;
  ActOrder order0;
  uint16_t* out1 = nullptr;  // rows [begin1, rows) in order1 (nullptr: none)
  int64_t begin1 = 0;
  ActOrder order1;
  float* scale = nullptr;  // [rows, K / 128] 2^e
  // Wide tiles' rows (order0.natural: moe_kernels.h): e4m3 bytes, K a row, at out0's pair rows — row r's pairs
  // pairs[r·k + j] (j < k; −1: none), or row r itself where pairs is nullptr — and their scales also into
  // pair_scale [K / 128, pairs_ld], the layout the wide tiles' TMA boxes read.
  const int32_t* pairs = nullptr;
  int64_t k = 1;
  float* pair_scale = nullptr;
  int64_t pairs_ld = 0;
};

// One warp per (row, K block): lane l holds columns 4l .. 4l + 3; src/cpu/quant.cpp's fp8_round_trip of the
// bf16-rounded row (act_quant_codes_warp), the e4m3 values written as e4m3 bytes or as f16 codes (exact). A lane's
// four columns lie together in the wgmma order (one 4-byte store) and in FP8's fragment order (one 8-byte store);
// in FP4's they interleave with the next lane's (columns 8g + 0, 2, 4, 6, then 1, 3, 5, 7), so lanes 2g, 2g + 1
// trade half their codes and store 8 bytes each. Stores of a code at a time took 34 µs a layer for the down GEMM's
// 3,072 rows at 512 tokens (H200), five times their bytes.
__global__ void __launch_bounds__(256) grouped_quant_kernel(QuantParams p) {
  const int lane = int(threadIdx.x % 32);
  const int64_t kblocks = p.K / kGBlockK;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t w = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; w < p.rows * kblocks; w += warps) {
    const int64_t row = w / kblocks, kb = w % kblocks;
    const float4 v4 = *reinterpret_cast<const float4*>(p.src + row * p.K + kb * kGBlockK + 4 * lane);
    float v[4] = {round_bf16(v4.x), round_bf16(v4.y), round_bf16(v4.z), round_bf16(v4.w)};
    int e;
    const uint32_t codes4 = act_quant_codes_warp(v, e);
    // A row takes 2K bytes in either order (moe_kernels.h: GroupedBuffers::wgmma), so that rows of both can share
    // a buffer.
    const float scale = __uint_as_float(uint32_t(127 + e) << 23);
    const auto write = [&](uint16_t* out, ActOrder order) {  // warp-uniform (a warp's row)
      if (order.natural) {  // a byte a code, at the row's pairs
        const auto put = [&](int64_t pair) {
          *reinterpret_cast<uint32_t*>(reinterpret_cast<uint8_t*>(out) + pair * p.K + kb * kGBlockK + 4 * lane) = codes4;
          if (lane == 0) p.pair_scale[kb * p.pairs_ld + pair] = scale;
        };
        if (!p.pairs) put(row);
        for (int64_t j = 0; p.pairs && j < p.k; ++j)
          if (const int pair = p.pairs[row * p.k + j]; pair >= 0) put(pair);
        return;
      }
      uint16_t* const row_start = out + row * p.K;
      if (order.wgmma) {  // a byte a code
        uint8_t* const block = reinterpret_cast<uint8_t*>(row_start) + kb * kGBlockK;
        *reinterpret_cast<uint32_t*>(block + wgmma_pos(order.fp4, 4 * lane)) = codes4;
        return;
      }
      uint16_t* const block = row_start + kb * kGBlockK;  // an f16 code a value
      const uint32_t w01 = e4m3x2_to_f16x2(codes4), w23 = e4m3x2_to_f16x2(codes4 >> 16);
      uint2 codes = make_uint2(w01, w23);
      int at = fragment_pos(order.fp4, 4 * lane);
      if (order.fp4) {
        const bool odd = lane % 2;
        const uint32_t own02 = __byte_perm(w01, w23, 0x5410), own13 = __byte_perm(w01, w23, 0x7632);
        const uint32_t got = __shfl_xor_sync(0xFFFFFFFFu, odd ? own02 : own13, 1);
        codes = odd ? make_uint2(got, own13) : make_uint2(own02, got);  // odd: the group's places 4 .. 7
        at += odd ? 2 : 0;
      }
      *reinterpret_cast<uint2*>(block + at) = codes;
    };
    if (row < p.end0) write(p.out0, p.order0);
    if (p.out1 && row >= p.begin1) write(p.out1, p.order1);
    if (lane == 0) p.scale[row * kblocks + kb] = scale;
  }
}

// ---- grouped_tiles: the plan's expert segments (contiguous pairs) cut into tiles: the shared expert's of
// ≤ kGroupedTokens pairs first, then the routed ones' of ≤ g.routed_tile

// One block. The routed chunks of the plan are consecutive pairs of one expert, experts ascending; an expert's
// segment starts at its smallest chunk pair and holds the sum of its chunks' counts.
__global__ void __launch_bounds__(1024) grouped_tiles_kernel(ExpertParams p, GroupedBuffers g) {
  __shared__ int first[kMaxExperts], count[kMaxExperts];
  const int E = int(p.E), P = int(p.n * p.k), n = int(p.n);
  for (int e = int(threadIdx.x); e < E; e += blockDim.x) {
    first[e] = 0x7FFFFFFF;
    count[e] = 0;
  }
  int32_t* const slot_pair = g.routed ? g.slot_pair : nullptr;
  for (int s = int(threadIdx.x); slot_pair && s < P; s += blockDim.x) slot_pair[s] = -1;
  __syncthreads();
  const int chunks = g.routed ? p.plan.counters[0] : 0, N = g.routed_tile, k = int(p.k);
  for (int c = shared_chunks(n, p.shared_items) + int(threadIdx.x); c < chunks; c += blockDim.x) {
    const int e = p.plan.chunk_expert[c], pair0 = p.plan.chunk_pair[c], pairs = p.plan.chunk_count[c];
    atomicMin(&first[e], pair0);
    atomicAdd(&count[e], pairs);
    for (int q = 0; slot_pair && q < pairs; ++q) {
      const int out = p.plan.pair_out[pair0 + q];  // t·(k + 1) + j
      slot_pair[out / (k + 1) * k + out % (k + 1)] = pair0 + q;
    }
  }
  __syncthreads();
  if (threadIdx.x >= 32) return;
  // Warp 0: lane l takes experts [l·per, (l + 1)·per); an exclusive scan of their tile counts.
  const int lane = int(threadIdx.x), per = (E + 31) / 32;
  const int e0 = min(E, lane * per), e1 = min(E, e0 + per);
  int mine = 0;
  for (int e = e0; e < e1; ++e) mine += (count[e] + N - 1) / N;
  int before = mine;
  for (int off = 1; off < 32; off <<= 1) {
    const int v = __shfl_up_sync(0xFFFFFFFFu, before, off);
    if (lane >= off) before += v;
  }
  const int total = __shfl_sync(0xFFFFFFFFu, before, 31);
  before -= mine;
  const int shared_tiles = p.has_shared ? (n + kGroupedTokens - 1) / kGroupedTokens : 0;
  for (int t = lane; t < shared_tiles; t += 32) {
    g.tile_expert[t] = -1;
    g.tile_pair0[t] = P + t * kGroupedTokens;
    g.tile_count[t] = min(kGroupedTokens, n - t * kGroupedTokens);
  }
  int t = shared_tiles + before;
  for (int e = e0; e < e1; ++e)
    for (int q = 0; q < count[e]; q += N, ++t) {
      g.tile_expert[t] = e;
      g.tile_pair0[t] = first[e] + q;
      g.tile_count[t] = min(N, count[e] - q);
    }
  if (lane == 0) g.tiles[0] = shared_tiles + total;
}

// ---- the GEMMs

// The raw bytes of one K block of a warp's two row tiles, lane (g, c): FP4 one 16-byte unit per (tile, row half)
// and the u32 of the row's four scale bytes; FP8 two units (K groups) per (tile, row half).
template <WFormat F>
struct RawBlock {
  static constexpr int kUnits = F == WFormat::kFP4 ? 1 : 2;
  uint4 unit[2][2][kUnits];  // [tile][row half][group]
  uint32_t scales[2][2];     // FP4: bytes of chunks 0..3 of rows g, g + 8
  float block_scale[2];      // FP8: the tile's 128 x 128 block scale
};

// Lane (g, c)'s addresses in K group 0 of row half 0 of its warp's two row tiles (weight_mma.cuh's tile order: a
// tile's K group G lies kTileBytesPerGroup·G further, its row half h kHalfUnits·h units further; the FP4 scale
// bytes, one per 16-byte unit, as many units further), computed once rather than by 64-bit index arithmetic at
// every load. One pointer a tile, not one a row half: the small-tile kernel's 128 registers.
struct WarpTiles {
  const uint8_t* unit[2];   // [tile]: the lane's 16-byte unit
  const uint8_t* scale[2];  // FP4: the u32 of its row's four chunk scales; FP8: the tile's block scale
  bool live[2];
};

template <WFormat F>
__device__ __forceinline__ void load_block(const WarpTiles& w, int64_t kb, RawBlock<F>& r) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int u = 0; u < RawBlock<F>::kUnits; ++u) {
        const int64_t G = kb * RawBlock<F>::kUnits + u;
        r.unit[i][h][u] =
            w.live[i] ? load_stream16(w.unit[i] + 16 * kHalfUnits * h + kTileBytesPerGroup * G) : make_uint4(0, 0, 0, 0);
      }
      if constexpr (F == WFormat::kFP4)
        r.scales[i][h] = w.live[i] ? __ldg(reinterpret_cast<const uint32_t*>(w.scale[i] + kHalfUnits * h +
                                                                               kTileUnitsPerGroup * kb))
                                   : 0x7F7F7F7Fu;
    }
    if constexpr (F == WFormat::kFP8)
      r.block_scale[i] = w.live[i] ? __ldg(reinterpret_cast<const float*>(w.scale[i]) + kb) : 0.0f;
  }
}

// A fragments of the K block's eight k16 MMAs for both tiles — a[tile][step j][8]: step j's first MMA a0..a3,
// then its second's — and each tile row's weight factor (rows g, g + 8).
static_assert(1 - kGroupedScaleSpan >= kHalfLiftMin, "a K block's FP4 weights must lift within the f16 table");

template <WFormat F>
__device__ __forceinline__ void decode_block(const RawBlock<F>& r, int lane, uint32_t (&a)[2][4][8], float (&sw)[2][2]) {
  const int c = lane % 4;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if constexpr (F == WFormat::kFP4) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t s = r.scales[i][h];
        const uint32_t mx = __vmaxu4(s, s >> 16);
        const int bmax = int(max(mx & 0xFFu, (mx >> 8) & 0xFFu));
        const int b = int((s >> (8 * c)) & 0xFFu);
        // e2m1 · 2^(b − bmax + 1), exact in f16 (lift ≥ 1 − kGroupedScaleSpan); 2^(bmax − 128) joins the scaling.
        uint32_t tab_lo, tab_hi;
        fp4_half_tables(b - bmax + 1, tab_lo, tab_hi);
        sw[i][h] = __uint_as_float(uint32_t(max(bmax - 1, 1)) << 23);  // 2^(bmax − 128)
        const uint4 v = r.unit[i][h][0];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t p[4];
          fp4_to_half2(j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w, tab_lo, tab_hi, p);
          a[i][j][h] = p[0];      // elements 0, 2: k 2c, 2c + 1
          a[i][j][2 + h] = p[1];  // 4, 6: k 2c + 8, 2c + 9
          a[i][j][4 + h] = p[2];  // second MMA: 1, 3
          a[i][j][6 + h] = p[3];  // 5, 7
        }
      }
    } else {
      sw[i][0] = sw[i][1] = r.block_scale[i];
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint4 v = r.unit[i][h][j / 2];
          const uint32_t x = j % 2 == 0 ? v.x : v.z, y = j % 2 == 0 ? v.y : v.w;  // 4 e4m3 each
          a[i][j][h] = e4m3x2_to_f16x2(x);
          a[i][j][2 + h] = e4m3x2_to_f16x2(x >> 16);
          a[i][j][4 + h] = e4m3x2_to_f16x2(y);
          a[i][j][6 + h] = e4m3x2_to_f16x2(y >> 16);
        }
    }
  }
}

// The ring of a kernel of kTokens-pair tiles: stage s holds K blocks [4s, 4s + 4) of the tile's activation rows
// and their scales.
struct Ring {
  uint8_t* rows;   // [2][kTokens][kGRowStride] f16 codes
  float* scales;   // [2][kGStageBlocks][kTokens]
};

// Stage `stage` of the K blocks [kb_begin, kb_end): blocks kb_begin + 4·stage .., of the first `rows` tokens.
template <int kTokens>
__device__ __forceinline__ void load_stage(const Ring& ring, int buf, int64_t stage, int64_t kb_begin, int64_t kb_end,
                                           int64_t K, const uint16_t* act, const float* act_scale,
                                           const int* row_index, int rows) {
  const int64_t kb0 = kb_begin + stage * kGStageBlocks;
  const int nb = int(std::min<int64_t>(kGStageBlocks, kb_end - kb0));
  uint8_t* stage_rows = ring.rows + size_t(buf) * kTokens * kGRowStride;
  const int row16 = nb * (kGBlockBytes / 16);  // 16-byte pieces of a token's stage row
  for (int i = int(threadIdx.x); i < rows * row16; i += kGThreads) {
    const int m = i / row16, col16 = i % row16;
    cp_async16(stage_rows + m * kGRowStride + 16 * col16, act + int64_t(row_index[m]) * K + kb0 * kGBlockK + 8 * col16);
  }
  for (int i = int(threadIdx.x); i < nb * rows; i += kGThreads) {
    const int kb = i / rows, m = i % rows;
    cp_async4(ring.scales + (buf * kGStageBlocks + kb) * kTokens + m,
              act_scale + int64_t(row_index[m]) * (K / kGBlockK) + kb0 + kb);
  }
  cp_async_commit();
}

// One K block of the warp's two row tiles × the first NT token tiles: per (row tile, token tile) four chained
// MMAs into a cleared fragment, then scaled by weight × activation scale into acc. NT is a constant so that the
// loop is one basic block: with a run-time bound per token tile (a branch each) the compiler could not overlap
// one tile's dependent MMAs with the next tile's.
template <int NT, int kTT>
__device__ __forceinline__ void mma_block(const uint32_t (&a)[2][4][8], const float (&sw)[2][2], const uint8_t* xb,
                                          const float* sb, float (&acc)[2][kTT][4]) {
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    float part[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // step j: two k16 MMAs, their b0 / b1 in one 16-byte load
      const uint4 b = *reinterpret_cast<const uint4*>(xb + t * 8 * kGRowStride + j * 64);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        mma_f16(part[i], a[i][j][0], a[i][j][1], a[i][j][2], a[i][j][3], b.x, b.y);
        mma_f16(part[i], a[i][j][4], a[i][j][5], a[i][j][6], a[i][j][7], b.z, b.w);
      }
    }
    const float2 sa = *reinterpret_cast<const float2*>(sb + t * 8);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      acc[i][t][0] = fmaf(part[i][0], sw[i][0] * sa.x, acc[i][t][0]);
      acc[i][t][1] = fmaf(part[i][1], sw[i][0] * sa.y, acc[i][t][1]);
      acc[i][t][2] = fmaf(part[i][2], sw[i][1] * sa.x, acc[i][t][2]);
      acc[i][t][3] = fmaf(part[i][3], sw[i][1] * sa.y, acc[i][t][3]);
    }
  }
}

// One block: tile `tile` × row block `rb` of a GEMM (kUp: w1 and w3 of I rows over K = D; else w2, D rows over
// K = I), over the K blocks [kb_begin, kb_end); leaves acc[tile i][token tile][fragment] in units of the output.
template <bool kUp, WFormat F, int kTokens>
__device__ __forceinline__ void gemm_tile(const ExpertParams& p, const WarpTiles& w, int count, const uint16_t* act,
                                          const float* act_scale, const int* row_index, const Ring& ring,
                                          int64_t kb_begin, int64_t kb_end, float (&acc)[2][kTokens / 8][4]) {
  constexpr int kTT = kTokens / 8;  // token tiles
  const int lane = int(threadIdx.x % 32), g8 = lane / 4, c = lane % 4;
  const int64_t K = kUp ? p.D : p.I;
  const int64_t stages = (kb_end - kb_begin + kGStageBlocks - 1) / kGStageBlocks;
  const int token_tiles = (count + 7) / 8;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int t = 0; t < kTT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][t][e] = 0.0f;
  RawBlock<F> raw;
  load_block<F>(w, kb_begin, raw);
  load_stage<kTokens>(ring, 0, 0, kb_begin, kb_end, K, act, act_scale, row_index, 8 * token_tiles);
  const bool any = w.live[0] || w.live[1];
  for (int64_t s = 0; s < stages; ++s) {
    if (s + 1 < stages) {
      load_stage<kTokens>(ring, int((s + 1) % 2), s + 1, kb_begin, kb_end, K, act, act_scale, row_index,
                          8 * token_tiles);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint8_t* rows = ring.rows + size_t(s % 2) * kTokens * kGRowStride;
    const float* scales = ring.scales + (s % 2) * kGStageBlocks * kTokens;
    const int nb = int(std::min<int64_t>(kGStageBlocks, kb_end - kb_begin - s * kGStageBlocks));
    if (any) {
      for (int kbl = 0; kbl < nb; ++kbl) {
        const int64_t kb = kb_begin + s * kGStageBlocks + kbl;
        uint32_t a[2][4][8];
        float sw[2][2];
        decode_block<F>(raw, lane, a, sw);
        if (kb + 1 < kb_end) load_block<F>(w, kb + 1, raw);  // the next block's loads fly over the MMAs
        const uint8_t* xb = rows + g8 * kGRowStride + kbl * kGBlockBytes + c * 16;
        const float* sb = scales + kbl * kTokens + 2 * c;
        if constexpr (kTT == 3) {
          if (token_tiles == 1) mma_block<1>(a, sw, xb, sb, acc);
          else if (token_tiles == 2) mma_block<2>(a, sw, xb, sb, acc);
          else mma_block<3>(a, sw, xb, sb, acc);
        } else {
          static_assert(kTT == 8);
          switch (token_tiles) {  // straight-line code: the MMAs of all token tiles interleave
            case 1: mma_block<1>(a, sw, xb, sb, acc); break;
            case 2: mma_block<2>(a, sw, xb, sb, acc); break;
            case 3: mma_block<3>(a, sw, xb, sb, acc); break;
            case 4: mma_block<4>(a, sw, xb, sb, acc); break;
            case 5: mma_block<5>(a, sw, xb, sb, acc); break;
            case 6: mma_block<6>(a, sw, xb, sb, acc); break;
            case 7: mma_block<7>(a, sw, xb, sb, acc); break;
            default: mma_block<8>(a, sw, xb, sb, acc); break;
          }
        }
      }
    }
    __syncthreads();  // the stage is read: the next iteration's copies may overwrite it
  }
}

// Tiles [tile_begin, g.tiles[0]) of kTokens pairs or fewer. kTokens = kGroupedTokens: any format, K split over
// blocks where g asks; kGroupedSmallTokens: routed FP4 tiles only (grouped_routed_tile), unsplit, in ≤ 128 registers
// so that two blocks share an SM — at ~12 pairs an expert a 64-pair kernel's 255 registers left two warps a
// scheduler, each waiting on its own decode → MMA → scaling chain (docs/design/moe.md, "Small routed tiles").
template <bool kUp, int kTokens>
__global__ void __launch_bounds__(kGThreads, kTokens == kGroupedTokens ? 1 : 2)
    grouped_gemm_kernel(ExpertParams p, GroupedBuffers g, int tile_begin) {
  constexpr bool kSmall = kTokens < kGroupedTokens;
  constexpr int kTT = kTokens / 8;
  extern __shared__ __align__(16) uint8_t smem_grouped[];
  __shared__ int row_index[kTokens];
  const int64_t out_rows = kUp ? p.I : p.D;
  const int block_rows = kUp ? kGUpRows : kGDownRows;
  const int row_blocks = int((out_rows + block_rows - 1) / block_rows);
  const int splits = kSmall ? 1 : kUp ? g.up_splits : g.down_splits;
  const int split = int(blockIdx.x) % splits, item = int(blockIdx.x) / splits;
  const int tile = tile_begin + item / row_blocks, rb = item % row_blocks;
  if (tile >= g.tiles[0]) return;
  const int expert = g.tile_expert[tile], pair0 = g.tile_pair0[tile], count = g.tile_count[tile];
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const MatFormat& fmt = expert < 0 ? (kUp ? p.shared_up : p.shared_down) : (kUp ? p.routed_up : p.routed_down);
  const uint8_t* data[2];
  const void* scale[2];
  if (expert < 0) {
    const MatView a = kUp ? p.shared_w1 : p.shared_w2, b = kUp ? p.shared_w3 : p.shared_w2;
    data[0] = a.data;
    data[1] = b.data;
    scale[0] = a.scale;
    scale[1] = b.scale;
  } else {
    const ExpertPtrs e = p.experts[expert];
    data[0] = kUp ? e.w1 : e.w2;
    data[1] = kUp ? e.w3 : e.w2;
    scale[0] = kUp ? e.s1 : e.s2;
    scale[1] = kUp ? e.s3 : e.s2;
  }
  const int64_t groups = fmt.row_bytes / kTileGroupBytes;
  const int64_t row0 = int64_t(rb) * block_rows + (kUp ? warp * 16 : warp * 32);
  WarpTiles w;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t r = kUp ? row0 : row0 + 16 * i, tile_index = r / 16;
    w.live[i] = r < out_rows;
    const int64_t unit = mma_tile_unit(tile_index, 0, 0, lane, groups);
    w.unit[i] = data[i] + 16 * unit;
    w.scale[i] = fmt.format == WFormat::kFP4 ? static_cast<const uint8_t*>(scale[i]) + (unit - lane % 4)
                                             : reinterpret_cast<const uint8_t*>(static_cast<const float*>(scale[i]) +
                                                                                (tile_index * 16 / 128) * fmt.scale_cols);
  }
  if (threadIdx.x < kTokens) {  // clamped: columns past count compute on a real row and are dropped
    const int pair = pair0 + min(int(threadIdx.x), count - 1);
    row_index[threadIdx.x] = kUp ? p.plan.pair_token[pair] : pair;
  }
  __syncthreads();
  const bool fp4 = fmt.format == WFormat::kFP4;
  const uint16_t* act = kUp ? (expert < 0 ? g.xq_shared : g.xq_routed) : g.hq;
  const float* act_scale = kUp ? g.xs : g.hs;
  Ring ring{smem_grouped, reinterpret_cast<float*>(smem_grouped + 2 * size_t(kTokens) * kGRowStride)};
  float acc[2][kTT][4];
  const int64_t kblocks = (kUp ? p.D : p.I) / kGBlockK;
  const int64_t kb_begin = kblocks * split / splits, kb_end = kblocks * (split + 1) / splits;
  if (fp4) gemm_tile<kUp, WFormat::kFP4, kTokens>(p, w, count, act, act_scale, row_index, ring, kb_begin, kb_end, acc);
  else if constexpr (!kSmall)
    gemm_tile<kUp, WFormat::kFP8, kTokens>(p, w, count, act, act_scale, row_index, ring, kb_begin, kb_end, acc);

  const int g8 = lane / 4, c = lane % 4;
  if (!kSmall && splits > 1) {  // this split's fp32 partial sums: grouped_finish_kernel adds them up
    float* slab = g.partials + (int64_t(tile) * splits + split) * split_slab(p, kUp);
#pragma unroll
    for (int t = 0; t < kTT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = t * 8 + 2 * c + (e % 2);
        if (m >= count) continue;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          if (!w.live[i]) continue;
          // up: [w1 | w3][I][tokens]; down: [D][tokens] (tile i: rows 16 further)
          const int64_t row = row0 + (kUp ? 0 : 16 * i) + g8 + 8 * (e / 2);
          slab[((kUp ? i * out_rows : 0) + row) * kGroupedTokens + m] = acc[i][t][e];
        }
      }
    return;
  }
#pragma unroll
  for (int t = 0; t < kTT; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int m = t * 8 + 2 * c + (e % 2);
      if (m >= count) continue;
      const int pair = pair0 + m;
      if constexpr (kUp) {
        if (!w.live[0]) continue;
        const int64_t row = row0 + g8 + 8 * (e / 2);
        const float weight = expert < 0 ? 1.0f : p.plan.pair_weight[pair];
        p.plan.h[int64_t(pair) * p.I + row] = hidden(p, fmt.format, acc[0][t][e], acc[1][t][e], weight);
      } else {
        const int64_t y_row = int64_t(p.plan.pair_out[pair]) * p.D;
#pragma unroll
        for (int i = 0; i < 2; ++i)
          if (w.live[i]) p.plan.y[y_row + row0 + 16 * i + g8 + 8 * (e / 2)] = round_bf16(acc[i][t][e]);
      }
    }
}

// The split GEMMs' sums (GroupedBuffers::partials), in split order, and what the unsplit kernel writes after
// them: up the SwiGLU of the w1 and w3 sums into h, down y. One thread per (tile, output row, pair).
template <bool kUp>
__global__ void __launch_bounds__(256) grouped_finish_kernel(ExpertParams p, GroupedBuffers g) {
  const int64_t out_rows = kUp ? p.I : p.D;
  const int splits = kUp ? g.up_splits : g.down_splits;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int tile = int(i / (out_rows * kGroupedTokens));
  const int64_t row = i / kGroupedTokens % out_rows;
  const int m = int(i % kGroupedTokens);
  if (tile >= g.tiles[0] || m >= g.tile_count[tile]) return;
  const int pair = g.tile_pair0[tile] + m;
  const float* slab = g.partials + int64_t(tile) * splits * split_slab(p, kUp) + row * kGroupedTokens + m;
  float a = 0.0f, b = 0.0f;
  for (int s = 0; s < splits; ++s) {
    a += slab[s * split_slab(p, kUp)];
    if constexpr (kUp) b += slab[s * split_slab(p, kUp) + out_rows * kGroupedTokens];
  }
  if constexpr (kUp) {
    const int expert = g.tile_expert[tile];
    const float weight = expert < 0 ? 1.0f : p.plan.pair_weight[pair];
    const MatFormat& fmt = expert < 0 ? p.shared_up : p.routed_up;
    p.plan.h[int64_t(pair) * p.I + row] = hidden(p, fmt.format, a, b, weight);
  } else {
    p.plan.y[int64_t(p.plan.pair_out[pair]) * p.D + row] = round_bf16(a);
  }
}

int quant_grid(int64_t warps) { return int(std::min<int64_t>((warps + 7) / 8, 132 * 16)); }

// Rows [0, end0) of src [rows, K] in order0 into out0, their scales into scale (rows [begin1, rows) also into out1
// where the caller sets it).
QuantParams quant_rows(const float* src, int64_t rows, int64_t K, uint16_t* out0, int64_t end0, ActOrder order0,
                       float* scale) {
  return {.src = src, .rows = rows, .K = K, .out0 = out0, .end0 = end0, .order0 = order0, .scale = scale};
}

// The order of the activations of a GEMM in format f on tiles of `tile` pairs.
ActOrder order_of(const GroupedBuffers& g, WFormat f, int tile) {
  return {g.wgmma && (tile == kGroupedTokens || tile == kGroupedDecodeTokens), f == WFormat::kFP4,
          tile == kGroupedWideTokens};
}


void launch_quant(const QuantParams& q, cudaStream_t stream) {
  grouped_quant_kernel<<<quant_grid(q.rows * (q.K / kGBlockK)), 256, 0, stream>>>(q);
  DSV4_CUDA_CHECK(cudaGetLastError());
}

// One GEMM (up or down) on the kernel of kTokens-pair tiles over tiles [tile_begin, tile_end) of the plan, K split
// over `splits` blocks.
template <bool kUp, int kTokens>
void launch_gemm(const ExpertParams& p, const GroupedBuffers& g, int64_t tile_begin, int64_t tile_end, int splits,
                 cudaStream_t stream, bool beside_shared = false) {
  if (kTokens == kGroupedDecodeTokens || (kTokens == kGroupedTokens && g.wgmma)) {
    DSV4_CHECK(splits == 1 && g.wgmma, "moe: the wgmma grouped GEMMs take unsplit K, with wgmma on");
    launch_grouped_wgmma(kUp, p, g, tile_begin, tile_end, kTokens, stream, beside_shared);
    return;
  }
  if constexpr (kTokens != kGroupedDecodeTokens) {  // decode tiles are wgmma's alone
    const auto kernel = grouped_gemm_kernel<kUp, kTokens>;
    constexpr int smem = int(grouped_smem_bytes(kTokens));
    allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
    const int64_t blocks = (tile_end - tile_begin) * ceil_div(kUp ? p.I : p.D, kUp ? kGUpRows : kGDownRows) * splits;
    DSV4_CHECK(blocks < (int64_t(1) << 31), "moe: too many grouped tiles");
    if (blocks == 0) return;
    kernel<<<unsigned(blocks), kGThreads, smem, stream>>>(p, g, int(tile_begin));
    DSV4_CUDA_CHECK(cudaGetLastError());
  }
}

// Up or down over every tile: the shared expert's tiles (the first shared_tiles) and the routed ones on one kernel,
// or, with small routed tiles, each on its own.
template <bool kUp>
void launch_gemm_all(const ExpertParams& p, const GroupedBuffers& g, int64_t shared_tiles, int64_t max_tiles,
                     cudaStream_t stream) {
  const int splits = kUp ? g.up_splits : g.down_splits;
  if (g.routed_tile == kGroupedTokens) {
    launch_gemm<kUp, kGroupedTokens>(p, g, 0, max_tiles, splits, stream);
    return;
  }
  if (g.routed_tile == kGroupedWideTokens) {  // the shared expert's tiles on wgmma, the routed ones wide
    DSV4_CHECK(splits == 1 && g.wgmma, "moe: wide tiles are never split, with wgmma on");
    launch_gemm<kUp, kGroupedTokens>(p, g, 0, shared_tiles, 1, stream);
    launch_grouped_wide(kUp, p, g, shared_tiles, max_tiles, stream);
    return;
  }
  if (g.routed_tile == kGroupedDecodeTokens) {
    DSV4_CHECK(splits == 1 && p.routed_up.format == WFormat::kFP4 && p.routed_down.format == WFormat::kFP4,
               "moe: decode tiles are FP4, never split, on wgmma");
    // NOTE: the decode tiles start beside the shared expert's launch (PDL) and rely on it being a plain launch
    // right before them: no launch between the two, and no PDL attribute on the shared expert's (experts_wgmma.cu).
    launch_gemm<kUp, kGroupedTokens>(p, g, 0, shared_tiles, 1, stream);
    launch_gemm<kUp, kGroupedDecodeTokens>(p, g, shared_tiles, max_tiles, 1, stream, shared_tiles > 0);
    return;
  }
  // The small-tile kernel compiles the FP4 path only: another format would leave its sums unset.
  DSV4_CHECK(g.routed_tile == kGroupedSmallTokens && splits == 1 && p.routed_up.format == WFormat::kFP4 &&
                 p.routed_down.format == WFormat::kFP4,
             "moe: small routed tiles are FP4, never split, on mma.sync");
  launch_gemm<kUp, kGroupedTokens>(p, g, 0, shared_tiles, 1, stream);
  launch_gemm<kUp, kGroupedSmallTokens>(p, g, shared_tiles, max_tiles, 1, stream);
}

// The launches between the plan and the combine: x's quantisation (qx), the tiles, up, h's quantisation (qh),
// down; at most max_tiles tiles.
void launch_gemms(const ExpertParams& p, const GroupedBuffers& g, const QuantParams& qx, const QuantParams& qh,
                  int64_t max_tiles, cudaStream_t stream) {
  grouped_tiles_kernel<<<1, 1024, 0, stream>>>(p, g);  // first: wide tiles' x goes to the pairs it maps
  DSV4_CUDA_CHECK(cudaGetLastError());
  launch_quant(qx, stream);
  const int64_t shared_tiles = p.has_shared ? ceil_div(p.n, int64_t(kGroupedTokens)) : 0;
  launch_gemm_all<true>(p, g, shared_tiles, max_tiles, stream);
  const auto finish_grid = [&](int64_t rows) { return unsigned(ceil_div(max_tiles * rows * kGroupedTokens, 256)); };
  if (g.up_splits > 1) {
    grouped_finish_kernel<true><<<finish_grid(p.I), 256, 0, stream>>>(p, g);
    DSV4_CUDA_CHECK(cudaGetLastError());
  }
  launch_quant(qh, stream);
  launch_gemm_all<false>(p, g, shared_tiles, max_tiles, stream);
  if (g.down_splits > 1) {
    grouped_finish_kernel<false><<<finish_grid(p.D), 256, 0, stream>>>(p, g);
    DSV4_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace

int64_t grouped_min_tokens(int64_t I) {
  const int64_t v = g_min_tokens.load(std::memory_order_relaxed);
  if (v > 0) return v;
  return I >= 2048 ? kGroupedMinTokensWide : I >= 1024 ? kGroupedMinTokensHalf : kGroupedMinTokensNarrow;
}

void set_grouped_min_tokens(int64_t n) {
  g_min_tokens.store(n > 0 ? n : 0, std::memory_order_relaxed);
}

int64_t shared_grouped_min_tokens(int64_t I) {
  const int64_t v = g_shared_min_tokens.load(std::memory_order_relaxed);
  if (v > 0) return v;
  return I >= kSharedGroupedMinInter ? kSharedGroupedMinTokens : std::numeric_limits<int64_t>::max();
}

void set_shared_grouped_min_tokens(int64_t n) {
  g_shared_min_tokens.store(n > 0 ? n : 0, std::memory_order_relaxed);
}

int64_t grouped_small_tile_max_pairs() {
  const int64_t v = g_small_tile_max_pairs.load(std::memory_order_relaxed);
  return v < 0 ? kSmallTileMaxPairs : v;
}

void set_grouped_small_tile_max_pairs(int64_t pairs) {
  g_small_tile_max_pairs.store(pairs < 0 ? -1 : pairs, std::memory_order_relaxed);
}

bool grouped_wgmma() { return g_wgmma.load(std::memory_order_relaxed); }

void set_grouped_wgmma(bool on) { g_wgmma.store(on, std::memory_order_relaxed); }

int64_t grouped_wgmma_min_pairs() {
  const int64_t v = g_wgmma_min_pairs.load(std::memory_order_relaxed);
  return v > 0 ? v : kWgmmaMinPairs;
}

void set_grouped_wgmma_min_pairs(int64_t pairs) {
  g_wgmma_min_pairs.store(pairs > 0 ? pairs : 0, std::memory_order_relaxed);
}

int64_t grouped_decode_tile_max_pairs() {
  const int64_t v = g_decode_tile_max_pairs.load(std::memory_order_relaxed);
  return v >= 0 ? v : kDecodeTileMaxPairs;
}

void set_grouped_decode_tile_max_pairs(int64_t pairs) {
  g_decode_tile_max_pairs.store(pairs < 0 ? -1 : pairs, std::memory_order_relaxed);
}

int64_t grouped_wide_tile_min_pairs() {
  const int64_t v = g_wide_tile_min_pairs.load(std::memory_order_relaxed);
  return v < 0 ? kWideTileMinPairs : v == 0 ? std::numeric_limits<int64_t>::max() : v;  // ≥ 1
}

void set_grouped_wide_tile_min_pairs(int64_t pairs) {
  g_wide_tile_min_pairs.store(pairs < 0 ? -1 : pairs, std::memory_order_relaxed);
}

int grouped_routed_tile(int64_t n, int64_t k, int64_t E, bool routed_fp4, int cc_major) {
  if (routed_fp4 && cc_major == 9 && grouped_wgmma()) {
    if (n * k / E >= grouped_wide_tile_min_pairs()) return kGroupedWideTokens;  // the average rounded down
    if (n * k <= grouped_decode_tile_max_pairs() * E) return kGroupedDecodeTokens;
  }
  return routed_fp4 && n * k <= grouped_small_tile_max_pairs() * E ? kGroupedSmallTokens : kGroupedTokens;
}

bool grouped_takes_wgmma(int64_t n, int64_t k, int64_t E, int routed_tile, int cc_major) {
  if (cc_major != 9 || !grouped_wgmma()) return false;
  return routed_tile != kGroupedTokens || n * k >= grouped_wgmma_min_pairs() * E;
}

bool grouped_fits(const ExpertParams& p) {
  return p.fast && p.routed_up.grouped && p.routed_down.grouped && p.shared_up.grouped && p.shared_down.grouped &&
         p.D % kGBlockK == 0 && p.I % kGBlockK == 0 && p.E <= kMaxExperts;
}

void launch_experts_grouped(const ExpertParams& p, const GroupedBuffers& g, cudaStream_t stream) {
  DSV4_CHECK(grouped_fits(p), "moe: the grouped expert path does not fit this layer");
  DSV4_CHECK(p.shared_items == p.has_shared, "moe: the grouped path computes the shared expert itself");
  const int64_t P = p.n * p.k;
  // x in both fragment orders; every pair's h: the routed ones' rows, then the shared expert's.
  const bool wide = g.routed_tile == kGroupedWideTokens;
  QuantParams qx = quant_rows(p.x, p.n, p.D, wide ? reinterpret_cast<uint16_t*>(g.xq_pairs) : g.xq_routed, p.n,
                              order_of(g, p.routed_up.format, g.routed_tile), g.xs);
  qx.out1 = p.has_shared ? g.xq_shared : nullptr;
  qx.begin1 = 0;
  qx.order1 = order_of(g, p.shared_up.format, kGroupedTokens);
  QuantParams qh = quant_rows(p.plan.h, p.has_shared ? P + p.n : P, p.I, g.hq, P,
                              order_of(g, p.routed_down.format, g.routed_tile), g.hs);
  qh.out1 = g.hq;
  qh.begin1 = P;
  qh.order1 = order_of(g, p.shared_down.format, kGroupedTokens);
  if (wide) {  // the routed rows at their pairs, scales by K block (moe_kernels.h)
    qx.pairs = g.slot_pair;
    qx.k = p.k;
    qx.pair_scale = g.xs_pairs;
    qx.pairs_ld = qh.pairs_ld = g.pairs_ld;
    qh.pair_scale = g.hs_pairs;
  }
  launch_gemms(p, g, qx, qh, g.max_tiles, stream);
  launch_combine(p, /*pdl=*/false, stream);
}

bool shared_grouped_fits(const ExpertParams& p) {
  return p.fast && p.has_shared && p.shared_up.grouped && p.shared_down.grouped && p.D % kGBlockK == 0 &&
         p.I % kGBlockK == 0;
}

int64_t shared_split_floats(int64_t n, int64_t D, int64_t I, int sm_count) {
  const int64_t tiles = (n + kGroupedTokens - 1) / kGroupedTokens;
  const int up = grouped_splits(tiles, I, kGUpRows, D, sm_count), down = grouped_splits(tiles, D, kGDownRows, I, sm_count);
  const int64_t up_floats = up > 1 ? tiles * up * 2 * I * kGroupedTokens : 0;
  const int64_t down_floats = down > 1 ? tiles * down * D * kGroupedTokens : 0;
  return std::max(up_floats, down_floats);
}

void launch_shared_grouped(const ExpertParams& p, const GroupedBuffers& g, int sm_count, cudaStream_t stream) {
  DSV4_CHECK(shared_grouped_fits(p) && !p.shared_items, "moe: the shared expert cannot take the grouped path here");
  const int64_t P = p.n * p.k;
  // x in the shared expert's fragment order; the shared pairs' h rows P .. P + n − 1, at the same rows of hq, hs.
  const QuantParams qx = quant_rows(p.x, p.n, p.D, g.xq_shared, p.n, order_of(g, p.shared_up.format, kGroupedTokens),
                                    g.xs);
  const QuantParams qh = quant_rows(p.plan.h + P * p.I, p.n, p.I, g.hq + P * p.I, p.n,
                                    order_of(g, p.shared_down.format, kGroupedTokens), g.hs + P * (p.I / kGBlockK));
  GroupedBuffers shared = g;
  shared.routed = false;
  shared.routed_tile = kGroupedTokens;
  const int64_t tiles = (p.n + kGroupedTokens - 1) / kGroupedTokens;
  shared.up_splits = grouped_splits(tiles, p.I, kGUpRows, p.D, sm_count);
  shared.down_splits = grouped_splits(tiles, p.D, kGDownRows, p.I, sm_count);
  DSV4_CHECK(g.partial_floats >= shared_split_floats(p.n, p.D, p.I, sm_count), "moe: no room for the shared expert's "
             "split sums");
  launch_gemms(p, shared, qx, qh, tiles, stream);
}

}  // namespace dsv4::cuda::moe
