// gemm family, decode path on the tensor cores, 5 ≤ n ≤ 16 activation rows, the weight rows as the MMA's 16 rows
// and the activation rows as its 8 (or 2 × 8) columns:
//  * gemv_mma_kernel: y = act_quant(x) · Wᵀ for FP8 weights in fast numerics (quant_x, bf16_out) — the FP8 × FP8
//    product DeepSeek's GPU code computes, the e4m3 values as exact f16 operands of mma.sync m16n8k16 (sm_90 has no
//    native e4m3 mma.sync: its emulation converted both operands for every MMA and added four MMAs' results);
//  * gemv_bf16_kernel: y = x · Wᵀ for bf16-valued x (fast numerics) and BF16 weights, or FP8 ones multiplied in
//    bf16 (wo_a, the grouped projection), as mma.sync m16n8k16 bf16: every product exact in fp32; the sums are
//    the tensor cores' fp32 accumulation (not IEEE round-to-nearest at every add) in another order than the
//    fp32 GEMV's. Its NOTE is at the kernel.
//
// Why: the CUDA-core GEMVs decode every weight byte to fp32 and multiply it once per activation row; at n = 8
// that is ~16 instructions per weight byte, and the FP8 matrices ran at ~20% of the copy bandwidth in the
// batch-8 step. Here a weight byte costs 1/32 of a 16-byte load and 1/32 (n ≤ 8) or 1/16 of an MMA, and FP8 ×
// FP8 needs only an exact cvt to f16: the kernel streams the weights as the GEMV does.
//
// NOTE: layout.
//  * Each block stages x act_quant'ed (per row and 128 columns: e4m3 codes and the block's power-of-two scale,
//    fp_grid.cuh's e4m3_block_exponent, bit for bit the CPU's fp8_round_trip) in shared memory, then walks
//    16-row tiles (blockIdx.x, + gridDim.x, ...); warp w takes K blocks w, w + 8, ... of every tile, and the 8
//    warps' partial tiles are summed in a fixed order in shared memory. A linear_pair's two matrices (same x)
//    are one list of tiles.
//  * Within a 128-column K block, lane (g, c) = (lane / 4, lane % 4) loads bytes [32c, 32c + 32) of rows g and
//    g + 8 of the tile (4 lanes read a row's 128 contiguous bytes). The MMAs' k order is a permutation of the
//    block's: step s is two f16 MMAs, the first over bytes 32c + 8s .. + 3 (k slots 2c, 2c + 1 from bytes 0, 1,
//    slots 2c + 8, 2c + 9 from bytes 2, 3), the second over bytes + 4 .. + 7, and the activations' B fragments
//    read the same bytes of x, so each step is a dot product over 32 of the block's columns.
//  * K blocks multiply in fp32 by the weight's 128 × 128 block scale and each activation row's scale; the MMA
//    sums 128 exact e4m3 products per block (DeepGEMM promotes to fp32 at the same granularity).
//  * The weights stream through each warp's ring of (tile, K block) chunks in shared memory ("The weight ring"
//    below); the ring's first chunks are requested before the PDL wait and the staging (weights do not depend
//    on the predecessor).
//  * x act_quant'ed already (GemmParams::x_codes: by its producer, or once beforehand where K ≥
//    kGemvCodesMinCols): the blocks copy its codes and scales instead of each reading and quantising the fp32
//    rows (wo_b at batch 8: 64 MB of L2 reads for 33.5 MB of weights).
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "cuda/common/smem.h"
#include "cuda/common/check.h"
#include "cuda/common/cp_async.cuh"
#include "cuda/common/fp_grid.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/gemm/gemv_decode.cuh"

namespace dsv4::cuda::gemv_detail {

namespace {

constexpr int kMmaThreads = 256;
constexpr int kMmaWarps = kMmaThreads / 32;
constexpr int kTileRows = 16;  // the MMA's m
constexpr int kBlockK = 128;   // the weight's scale block and the act_quant block along K
constexpr int kStageBatch = 8;  // act_quant items per warp with their loads in flight together
// The streaming GEMV (gemv_stream.cu, n ≤ 4) was faster at n = 1 in the batch-1 step (1.096 against 1.216 ms,
// H100): this kernel takes n ≥ 5.
constexpr int64_t kMmaMinRows = 5;

struct MmaMatrix {
  const uint8_t* w = nullptr;     // [rows, cols] e4m3
  const float* scale = nullptr;   // [ceil(rows / 128), scale_cols]
  int64_t scale_cols = 0;
  float* y = nullptr;             // [n, ldy]
  int64_t ldy = 0;
  int tiles = 0;                  // rows / 16
};

struct MmaParams {
  const float* x = nullptr;  // [n, ldx], bf16-valued
  int64_t ldx = 0;
  const uint8_t* codes = nullptr;  // or x act_quant'ed already: [n, cols] e4m3 (GemmParams::x_codes), x not read
  const float* code_scale = nullptr;  // [cols / 128, code_scale_ld]
  int64_t code_scale_ld = 0;
  int n = 0, cols = 0;       // cols a multiple of 128
  int x_stride = 0;          // bytes between staged rows of x: cols + 8, so B fragment reads are conflict-free
  MmaMatrix m[2];            // a linear_pair's matrices (tiles of m[0] first); m[1].tiles = 0 for one
  bool bf16_out = false;
  int slots = 0;             // weight chunks in flight a warp (mma_slots)
};

// ---- The weight ring both kernels stream through
//
// A warp's (tile, K block) chunks pass through a ring of `slots` chunks in shared memory (cp.async), the warp's
// lanes copying a chunk together in memory order so that each instruction reads whole 32-byte sectors (a lane
// copying only its own pieces, 16 bytes of a sector each, doubled the L2 traffic of the bypassing copies:
// docs/design/gemm.md, "The weights through a ring"); after cp.async.wait_group and a __syncwarp each lane reads
// its fragment pieces. No block barrier: a slot is refilled after the warp's next __syncwarp. Up to 16 KB of
// weights in flight a warp, one block an SM: registers holding a chunk or two ahead kept 4 KB a warp in flight.
// kFp8: 1-byte weights (FP8), else 2 (BF16). The caller commits a group per chunk.
constexpr int kRingSmemBytes = 227 * 1024;  // one block an SM, sm_90's largest

template <bool kFp8>
struct WeightChunk {
  static constexpr int kPieces = kFp8 ? 2 : 4;       // 16-byte pieces of a row a lane: its 32 columns
  static constexpr int kRowPieces = 4 * kPieces;       // of a tile row's K block
  static constexpr int kCopies = kTileRows * kRowPieces / 32;  // cp.async a lane a chunk
  // A slot: the tile's 16 rows of the K block in memory order, 16-byte piece q of row r at 16·swizzle(r, q), then
  // the block scale (FP8).
  static constexpr int kDataBytes = kTileRows * kRowPieces * 16;
  static constexpr int kSlotBytes = kDataBytes + 16;
  static constexpr int kMaxSlots = 16 * 1024 / kDataBytes;  // 16 KB of weights a warp
  // The 8 lanes of a 16-byte shared-memory phase, (g, c) for g = 2i, 2i + 1 and every c, read piece q of lane c's
  // columns (kPieces·c + q) of rows g: the swizzle puts the eight in distinct 16-byte bank groups (BF16: c and c + 2
  // apart by bit 1, the two rows by bit 0; FP8: the rows by bit 0).
  __device__ static int swizzle(int row, int q) {
    return row * kRowPieces + (q ^ (row & 1) ^ (kFp8 ? 0 : ((q >> 3) & 1) << 1));
  }
  uint4 r[2][kPieces];  // [row g, g + 8][piece]: lane (g, c)'s 32 columns
  float scale;          // the 128 × 128 block scale (FP8)
};

// Copies K block kb of tile t of m (cols columns a row) into the slot at shared address `slot`.
template <bool kFp8>
__device__ __forceinline__ void copy_chunk(const MmaMatrix& m, int t, int cols, int kb, int lane, uint32_t slot) {
  using C = WeightChunk<kFp8>;
  constexpr int kBytes = kFp8 ? 1 : 2;  // per weight
  const int64_t row_bytes = int64_t(cols) * kBytes;
  const uint8_t* src = m.w + int64_t(t) * kTileRows * row_bytes + int64_t(kb) * kBlockK * kBytes;
#pragma unroll
  for (int i = 0; i < C::kCopies; ++i) {
    const int piece = i * 32 + lane, row = piece / C::kRowPieces, q = piece % C::kRowPieces;
    cp_async16(slot + uint32_t(16 * C::swizzle(row, q)), src + row * row_bytes + 16 * q);
  }
  if constexpr (kFp8)
    if (lane == 0)  // one 128-row scale block holds the tile
      cp_async4(slot + uint32_t(C::kDataBytes), m.scale + (int64_t(t) * kTileRows / 128) * m.scale_cols + kb);
}

// Lane (g, c)'s share of the chunk in slot: 32 columns of rows g and g + 8, and the block scale.
template <bool kFp8>
__device__ __forceinline__ WeightChunk<kFp8> read_chunk(uint32_t slot, int lane) {
  using C = WeightChunk<kFp8>;
  const int g = lane / 4, c = lane % 4;
  C v;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int q = 0; q < C::kPieces; ++q) {
      uint4& u = v.r[h][q];
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                   : "r"(slot + uint32_t(16 * C::swizzle(g + 8 * h, C::kPieces * c + q))));
    }
  v.scale = 1.0f;
  if constexpr (kFp8) asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v.scale) : "r"(slot + uint32_t(C::kDataBytes)));
  return v;
}

// A warp's ring over its chunk sequence 0 .. total − 1 (chunk it in slot it % slots), the protocol in one place:
// fill() requests the first `slots` chunks (one commit group a slot, empty past total), take() waits for the next
// chunk in order and reads this lane's share of it, refill() — after the share is used — requests chunk it + slots
// into the slot just read. copy(it, slot) copies chunk it (copy_chunk).
template <bool kFp8>
struct WeightRing {
  uint32_t base;  // this warp's first slot
  int slots, total, slot = 0;

  template <class Copy>
  __device__ __forceinline__ void fill(const Copy& copy) const {
    for (int s = 0; s < slots; ++s) {
      if (s < total) copy(s, base + uint32_t(s * WeightChunk<kFp8>::kSlotBytes));
      cp_async_commit();
    }
  }
  __device__ __forceinline__ WeightChunk<kFp8> take(int lane) const {
    cp_async_wait_dyn(slots - 1);  // groups complete in order: the next chunk has landed
    __syncwarp();                  // ... every lane's pieces of it
    return read_chunk<kFp8>(here(), lane);
  }
  template <class Copy>
  __device__ __forceinline__ void refill(int it, const Copy& copy) {
    __syncwarp();  // every lane has read the slot
    if (it + slots < total) copy(it + slots, here());
    cp_async_commit();
    slot = slot + 1 == slots ? 0 : slot + 1;
  }
  __device__ __forceinline__ uint32_t here() const { return base + uint32_t(slot * WeightChunk<kFp8>::kSlotBytes); }
};

// The ring's depth for a block whose other shared memory takes `base` bytes: up to kMaxSlots, as many as fit; 0
// where fewer than two fit (the shape does not take the kernel).
int ring_slots(size_t base, bool fp8) {
  const size_t per_slot = size_t(kMmaWarps) * (fp8 ? WeightChunk<true>::kSlotBytes : WeightChunk<false>::kSlotBytes);
  const int max_slots = fp8 ? WeightChunk<true>::kMaxSlots : WeightChunk<false>::kMaxSlots;
  const int fit = base >= size_t(kRingSmemBytes) ? 0 : int((size_t(kRingSmemBytes) - base) / per_slot);
  const int slots = std::min(max_slots, fit);
  return slots >= 2 ? slots : 0;
}
size_t ring_bytes(int slots, bool fp8) {
  return size_t(kMmaWarps) * slots * (fp8 ? WeightChunk<true>::kSlotBytes : WeightChunk<false>::kSlotBytes);
}

// Tile `tile` of a linear_pair's list (m[0]'s tiles, then m[1]'s): its matrix, and its index there in `local`.
template <class Params>
__device__ __forceinline__ const MmaMatrix& matrix_of(const Params& p, int tile, int& local) {
  local = tile < p.m[0].tiles ? tile : tile - p.m[0].tiles;
  return tile < p.m[0].tiles ? p.m[0] : p.m[1];
}

// NT: 8-column activation tiles (n ≤ 8·NT). grid: blocks walking the tiles; dynamic smem
// mma_smem_bytes(NT, cols, slots).
template <int NT>
__global__ void __launch_bounds__(kMmaThreads) gemv_mma_kernel(const __grid_constant__ MmaParams p) {
  constexpr int NP = 8 * NT;  // staged activation rows, zero past n
  extern __shared__ __align__(16) uint8_t smem[];
  const int KB = p.cols / kBlockK;
  uint8_t* xq = smem;                                                            // [NP][x_stride] e4m3 codes
  float* xscale = reinterpret_cast<float*>(smem + NP * p.x_stride);              // [NP][KB] 2^e
  float* red = xscale + NP * KB;                                                 // [warps][16][NP]
  // then [warps][slots] ring slots (WeightChunk)
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;

  // This warp's (tile, K block) sequence: tiles blockIdx.x + j·gridDim.x, K blocks warp + 8i.
  const int tiles = p.m[0].tiles + p.m[1].tiles;
  const int my_tiles = int(blockIdx.x) < tiles ? (tiles - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x) : 0;
  const int kbw = warp < KB ? (KB - warp + kMmaWarps - 1) / kMmaWarps : 0;
  const int total = my_tiles * kbw;
  const auto tile_of = [&](int it) { return int(blockIdx.x) + (it / kbw) * int(gridDim.x); };
  const auto kb_of = [&](int it) { return warp + kMmaWarps * (it % kbw); };
  const auto copy = [&](int it, uint32_t slot) {
    int t;
    const MmaMatrix& m = matrix_of(p, tile_of(it), t);
    copy_chunk<true>(m, t, p.cols, kb_of(it), lane, slot);
  };
  const uint32_t ring0 = uint32_t(__cvta_generic_to_shared(red + kMmaWarps * kTileRows * NP));
  WeightRing<true> ring{ring0 + uint32_t(warp * p.slots * WeightChunk<true>::kSlotBytes), p.slots, total};
  ring.fill(copy);
  pdl_wait();

  if (p.codes) {
    // x act_quant'ed already: its codes copied 8 bytes at a time (staged rows start 8 bytes apart from 16-byte
    // alignment), zero rows past n; the scales transposed to [row][K block].
    const int units = p.cols / 8;
    for (int i = int(threadIdx.x); i < NP * units; i += kMmaThreads) {
      const int r = i / units, u = i % units;
      const uint2 v =
          r < p.n ? *reinterpret_cast<const uint2*>(p.codes + int64_t(r) * p.cols + 8 * u) : make_uint2(0, 0);
      *reinterpret_cast<uint2*>(xq + r * p.x_stride + 8 * u) = v;
    }
    for (int i = int(threadIdx.x); i < NP * KB; i += kMmaThreads) {
      const int r = i / KB, kb = i % KB;
      xscale[i] = r < p.n ? p.code_scale[kb * p.code_scale_ld + r] : 0.0f;
    }
  } else {
    // act_quant: one warp per (row, K block), 4 columns per lane; a warp's next kStageBatch items' loads are in
    // flight together (one item at a time left wo_b's 512 blocks of x as a chain of L2 round trips per warp).
    for (int base = warp * kStageBatch; base < NP * KB; base += kMmaWarps * kStageBatch) {
      float4 v[kStageBatch];
#pragma unroll
      for (int u = 0; u < kStageBatch; ++u) {
        const int item = base + u, r = item / KB, kb = item % KB;
        v[u] = item < NP * KB && r < p.n ? reinterpret_cast<const float4*>(p.x + r * p.ldx + kb * kBlockK)[lane]
                                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int u = 0; u < kStageBatch; ++u) {
        const int item = base + u, r = item / KB, kb = item % KB;
        if (item >= NP * KB) break;  // warp-uniform
        const int e = e4m3_block_exponent(warp_max_f32(abs_max4(v[u])));
        const float down = __uint_as_float(uint32_t(127 - e) << 23);
        const __nv_fp8x2_storage_t lo =
            __nv_cvt_float2_to_fp8x2(make_float2(v[u].x * down, v[u].y * down), __NV_SATFINITE, __NV_E4M3);
        const __nv_fp8x2_storage_t hi =
            __nv_cvt_float2_to_fp8x2(make_float2(v[u].z * down, v[u].w * down), __NV_SATFINITE, __NV_E4M3);
        *reinterpret_cast<uint32_t*>(xq + r * p.x_stride + kb * kBlockK + 4 * lane) =
            uint32_t(lo) | (uint32_t(hi) << 16);
        if (lane == 0) xscale[r * KB + kb] = r < p.n ? __uint_as_float(uint32_t(127 + e) << 23) : 0.0f;
      }
    }
  }
  __syncthreads();

  for (int j = 0; j < my_tiles; ++j) {
    float acc[NT][4] = {};
    for (int i = 0; i < kbw; ++i) {
      const int it = j * kbw + i, kb = kb_of(it);
      const WeightChunk<true> cur = ring.take(lane);
      float blk[NT][4] = {};
      const uint32_t a_row0[8] = {cur.r[0][0].x, cur.r[0][0].y, cur.r[0][0].z, cur.r[0][0].w,
                                  cur.r[0][1].x, cur.r[0][1].y, cur.r[0][1].z, cur.r[0][1].w};
      const uint32_t a_row1[8] = {cur.r[1][0].x, cur.r[1][0].y, cur.r[1][0].z, cur.r[1][0].w,
                                  cur.r[1][1].x, cur.r[1][1].y, cur.r[1][1].z, cur.r[1][1].w};
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        // Step s as two f16 MMAs (sm_90 emulates the e4m3 one): the first over bytes 32c + 8s .. + 3 of the lane's
        // rows and of x (k slots 2c, 2c + 1 | 2c + 8, 2c + 9: bytes 0, 1 | 2, 3), the second over bytes + 4 .. + 7.
        uint32_t a[2][4];
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          a[m][0] = e4m3x2_to_f16x2(a_row0[2 * s + m]);
          a[m][1] = e4m3x2_to_f16x2(a_row1[2 * s + m]);
          a[m][2] = e4m3x2_to_f16x2(a_row0[2 * s + m] >> 16);
          a[m][3] = e4m3x2_to_f16x2(a_row1[2 * s + m] >> 16);
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint2 b = *reinterpret_cast<const uint2*>(xq + (nt * 8 + g) * p.x_stride + kb * kBlockK + 32 * c + 8 * s);
          mma_f16(blk[nt], a[0][0], a[0][1], a[0][2], a[0][3], e4m3x2_to_f16x2(b.x), e4m3x2_to_f16x2(b.x >> 16));
          mma_f16(blk[nt], a[1][0], a[1][1], a[1][2], a[1][3], e4m3x2_to_f16x2(b.y), e4m3x2_to_f16x2(b.y >> 16));
        }
      }
      // C fragment: blk[nt][0 / 1] = row g, activation rows 8nt + 2c / + 1; [2 / 3] = row g + 8.
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float s0 = xscale[(nt * 8 + 2 * c) * KB + kb] * cur.scale;
        const float s1 = xscale[(nt * 8 + 2 * c + 1) * KB + kb] * cur.scale;
        acc[nt][0] = fmaf(blk[nt][0], s0, acc[nt][0]);
        acc[nt][1] = fmaf(blk[nt][1], s1, acc[nt][1]);
        acc[nt][2] = fmaf(blk[nt][2], s0, acc[nt][2]);
        acc[nt][3] = fmaf(blk[nt][3], s1, acc[nt][3]);
      }
      ring.refill(it, copy);  // cur's registers are used
    }
    // The warps' partial tiles, summed in warp order.
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int q = 0; q < 4; ++q) red[(warp * kTileRows + g + 8 * (q / 2)) * NP + nt * 8 + 2 * c + q % 2] = acc[nt][q];
    __syncthreads();
    if (int(threadIdx.x) < kTileRows * p.n) {
      const int row = threadIdx.x % kTileRows, r = threadIdx.x / kTileRows;
      float sum = 0.0f;
      for (int w = 0; w < kMmaWarps; ++w) sum += red[(w * kTileRows + row) * NP + r];
      int t;
      const MmaMatrix& m = matrix_of(p, int(blockIdx.x) + j * int(gridDim.x), t);
      m.y[r * m.ldy + int64_t(t) * kTileRows + row] = p.bf16_out ? round_bf16(sum) : sum;
    }
    __syncthreads();
  }
}

// ---- gemv_bf16_kernel
//
// NOTE: layout, as gemv_mma_kernel's but for bf16 operands.
//  * x (bf16-valued fp32) is staged as bf16, row stride bf16_x_stride(cols); a grouped projection's block stages
//    only its group's columns (blocks are dealt to the groups evenly) and walks that group's tiles.
//  * Within a 128-column K block, lane (g, c) holds columns [32c, 32c + 32) of rows g and g + 8: 64 bytes of a BF16
//    row, 32 of an FP8 one. As bf16 pairs P[0..15] (pair j = columns 32c + 2j, + 1), k16 step s takes P[2s] and
//    P[2s + 1] of each row (a0 / a2, a1 / a3) and the B fragment reads the same four columns of x, 32c + 4s ..,
//    one 8-byte shared-memory load: each step is a dot product over 16 of the block's columns.
//  * FP8 weights become bf16 exactly (e4m3 → f16 → f32 → bf16); the 128 × 128 block scale multiplies each K
//    block's fp32 sum, as the CPU's fp32 dequantisation does (an FP8 weight times its scale, exact for the
//    power-of-two scales of V4's checkpoints). BF16 weights accumulate straight into acc.
//  * The weights stream through the warp's ring as gemv_mma_kernel's do. The warps' partial tiles are summed in a
//    fixed order in shared memory.

struct Bf16Params {
  const float* x = nullptr;  // [n, ldx], bf16-valued
  int64_t ldx = 0;
  int n = 0, cols = 0;       // cols: the width of one group, a multiple of 128
  int groups = 1;            // > 1: m[0] only, groups of m[0].tiles / groups tiles over x's column groups
  int x_stride = 0;          // bytes between staged rows
  MmaMatrix m[2];
  bool fp8 = false;          // else BF16 weights
  bool bf16_out = false;
  int slots = 0;             // weight chunks in flight a warp (bf16_slots)
};

// Staged row stride: 16 bytes of padding put the 8 token rows of an MMA's B loads in different banks.
constexpr int64_t bf16_x_stride(int64_t cols) { return 2 * cols + 16; }

// Two e4m3 codes (low byte first) as a bf16 pair, exactly.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t two) {
  const float2 f = e4m3x2_to_float2(two);
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// NT: 8-column activation tiles (n ≤ 8·NT). grid: blocks walking the tiles (a multiple of groups); dynamic smem
// bf16_smem_bytes(NT, cols, slots).
template <int NT, bool kFp8>
__global__ void __launch_bounds__(kMmaThreads) gemv_bf16_kernel(const __grid_constant__ Bf16Params p) {
  constexpr int NP = 8 * NT;
  extern __shared__ __align__(16) uint8_t smem[];
  const int KB = p.cols / kBlockK;
  uint8_t* xs = smem;                                            // [NP][x_stride] bf16
  float* red = reinterpret_cast<float*>(smem + NP * p.x_stride);  // [warps][16][NP]
  // then [warps][slots] ring slots (WeightChunk)
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;

  // This block's tiles: with groups, tiles of its group g0 (blocks dealt evenly), else of both matrices.
  const int per_group = int(gridDim.x) / p.groups, group = int(blockIdx.x) / per_group;
  const int first = p.groups > 1 ? group * (p.m[0].tiles / p.groups) + int(blockIdx.x) % per_group : int(blockIdx.x);
  const int end = p.groups > 1 ? (group + 1) * (p.m[0].tiles / p.groups) : p.m[0].tiles + p.m[1].tiles;
  const int step = p.groups > 1 ? per_group : int(gridDim.x);
  const int my_tiles = first < end ? (end - first + step - 1) / step : 0;
  const int kbw = warp < KB ? (KB - warp + kMmaWarps - 1) / kMmaWarps : 0;
  const int total = my_tiles * kbw;
  const auto tile_of = [&](int it) { return first + (it / kbw) * step; };
  const auto kb_of = [&](int it) { return warp + kMmaWarps * (it % kbw); };
  const auto copy = [&](int it, uint32_t slot) {
    int t;
    const MmaMatrix& m = matrix_of(p, tile_of(it), t);
    copy_chunk<kFp8>(m, t, p.cols, kb_of(it), lane, slot);
  };
  const uint32_t ring0 = uint32_t(__cvta_generic_to_shared(red + kMmaWarps * kTileRows * NP));
  WeightRing<kFp8> ring{ring0 + uint32_t(warp * p.slots * WeightChunk<kFp8>::kSlotBytes), p.slots, total};
  ring.fill(copy);
  pdl_wait();

  // x as bf16 (exact: bf16-valued), one warp per (row, K block), 4 columns per lane; rows past n are zero.
  const int64_t x_col0 = p.groups > 1 ? int64_t(group) * p.cols : 0;
  for (int item = warp; item < NP * KB; item += kMmaWarps) {
    const int r = item / KB, kb = item % KB;
    const float4 v = r < p.n ? reinterpret_cast<const float4*>(p.x + r * p.ldx + x_col0 + kb * kBlockK)[lane]
                             : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    *reinterpret_cast<uint2*>(xs + r * p.x_stride + (kb * kBlockK + 4 * lane) * 2) =
        make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  }
  __syncthreads();

  for (int j = 0; j < my_tiles; ++j) {
    float acc[NT][4] = {};
    for (int i = 0; i < kbw; ++i) {
      const int it = j * kbw + i, kb = kb_of(it);
      const WeightChunk<kFp8> cur = ring.take(lane);
      float blk[NT][4] = {};
      float (&sum)[NT][4] = kFp8 ? blk : acc;  // FP8: the block's sum, scaled below
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        uint32_t a[2][2];  // [row g, g + 8][pair 2s, 2s + 1]
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if constexpr (kFp8) {
            const uint32_t w = word(cur.r[h][s / 4], s % 4);
            a[h][0] = e4m3x2_to_bf16x2(w & 0xFFFFu);
            a[h][1] = e4m3x2_to_bf16x2(w >> 16);
          } else {
            a[h][0] = word(cur.r[h][s / 2], 2 * (s % 2));
            a[h][1] = word(cur.r[h][s / 2], 2 * (s % 2) + 1);
          }
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint8_t* xb = xs + (nt * 8 + g) * p.x_stride + (kb * kBlockK + 32 * c + 4 * s) * 2;
          const uint2 b = *reinterpret_cast<const uint2*>(xb);
          mma_bf16(sum[nt], a[0][0], a[1][0], a[0][1], a[1][1], b.x, b.y);
        }
      }
      if constexpr (kFp8)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int q = 0; q < 4; ++q) acc[nt][q] = fmaf(blk[nt][q], cur.scale, acc[nt][q]);
      ring.refill(it, copy);  // cur's registers are used
    }
    // The warps' partial tiles, summed in warp order (C fragment: [nt][0 / 1] row g, activation rows 8nt + 2c,
    // + 1; [2 / 3] row g + 8).
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int q = 0; q < 4; ++q) red[(warp * kTileRows + g + 8 * (q / 2)) * NP + nt * 8 + 2 * c + q % 2] = acc[nt][q];
    __syncthreads();
    if (int(threadIdx.x) < kTileRows * p.n) {
      const int row = threadIdx.x % kTileRows, r = threadIdx.x / kTileRows;
      float total_sum = 0.0f;
      for (int w = 0; w < kMmaWarps; ++w) total_sum += red[(w * kTileRows + row) * NP + r];
      int t;
      const MmaMatrix& m = matrix_of(p, first + j * step, t);
      m.y[r * m.ldy + int64_t(t) * kTileRows + row] = p.bf16_out ? round_bf16(total_sum) : total_sum;
    }
    __syncthreads();
  }
}

// gemv_mma_kernel: staged codes and scales of x, the warps' partial tiles, and `slots` ring slots a warp.
size_t mma_smem_bytes(int nt, int64_t cols, int slots) {
  const int64_t np = 8 * nt;
  return size_t(np * (cols + 8) + np * (cols / kBlockK) * 4 + kMmaWarps * kTileRows * np * 4) + ring_bytes(slots, true);
}
int mma_slots(int nt, int64_t cols) { return ring_slots(mma_smem_bytes(nt, cols, 0), true); }

// gemv_bf16_kernel: staged x, the warps' partial tiles, and `slots` ring slots a warp.
size_t bf16_smem_bytes(int nt, int64_t cols, bool fp8, int slots) {
  const int64_t np = 8 * nt;
  return size_t(np * bf16_x_stride(cols) + kMmaWarps * kTileRows * np * 4) + ring_bytes(slots, fp8);
}
int bf16_slots(int nt, int64_t cols, bool fp8) { return ring_slots(bf16_smem_bytes(nt, cols, fp8, 0), fp8); }

// Activation tiles of 8 rows the kernels take for n rows.
int activation_tiles(int64_t n) { return n <= 8 ? 1 : 2; }

bool common_shape(const GemmParams& p) {
  return !p.w.mma_tiles && !p.w.mma_bits && p.n >= kMmaMinRows && p.n <= kGemvMaxRows && p.w.cols % kBlockK == 0 &&
         (p.w.rows / p.groups) % kTileRows == 0 && p.ldx % 4 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.w.data) % 16 == 0 && p.w.rows / kTileRows < (int64_t(1) << 30) &&
         device_info().cc_major >= 9;
}

// gemv_mma_kernel's calls: FP8 weights with act_quant'ed x (y rounded to bf16, or not: Ops::linear_partial).
bool e4m3_shape(const GemmParams& p) {
  return p.w.format == WFormat::kFP8 && p.quant_x && p.groups == 1 && common_shape(p) &&
         mma_slots(activation_tiles(p.n), p.w.cols) > 0;
}

// gemv_bf16_kernel's: bf16-valued x (fast numerics) times BF16 or FP8 weights, in bf16.
bool bf16_shape(const GemmParams& p) {
  return (p.w.format == WFormat::kBF16 || (p.w.format == WFormat::kFP8 && p.w.scale_f32)) && !p.quant_x &&
         (p.x_bf16 || p.bf16_out) && common_shape(p) &&
         bf16_slots(activation_tiles(p.n), p.w.cols, p.w.format == WFormat::kFP8) > 0;
}

}  // namespace

bool mma_shape(const GemmParams& p) { return e4m3_shape(p) || bf16_shape(p); }

namespace {

// As many blocks as fit the SMs at once (each stages x once), but no more than there are tiles (of a group).
int mma_blocks(size_t smem, int tiles, int groups) {
  const int per_sm = int(std::clamp<size_t>(size_t(220 * 1024) / (smem + 1024), 1, 2));
  return groups * std::max(1, std::min(tiles / groups, device_info().sms * per_sm / groups));
}

template <int NT>
void launch_mma(const MmaParams& k, int tiles, cudaStream_t stream) {
  allow_dynamic_smem(reinterpret_cast<const void*>(gemv_mma_kernel<NT>), kRingSmemBytes);
  const size_t smem = mma_smem_bytes(NT, k.cols, k.slots);
  launch_pdl(gemv_mma_kernel<NT>, dim3(unsigned(mma_blocks(smem, tiles, 1))), dim3(kMmaThreads), smem, stream, true, k);
}

template <int NT, bool kFp8>
void launch_bf16(const Bf16Params& k, int tiles, cudaStream_t stream) {
  allow_dynamic_smem(reinterpret_cast<const void*>(gemv_bf16_kernel<NT, kFp8>), kRingSmemBytes);
  const size_t smem = bf16_smem_bytes(NT, k.cols, kFp8, k.slots);
  launch_pdl(gemv_bf16_kernel<NT, kFp8>, dim3(unsigned(mma_blocks(smem, tiles, k.groups))), dim3(kMmaThreads), smem,
             stream, true, k);
}

MmaMatrix matrix_view(const GemmParams& p) {
  return MmaMatrix{p.w.data, p.w.scale_f32, p.w.scale_cols, p.y, p.ldy, int(p.w.rows / kTileRows)};
}

MmaParams mma_params(const GemmParams& p) {
  MmaParams k;
  k.x = p.x;
  k.ldx = p.ldx;
  k.n = int(p.n);
  k.cols = int(p.w.cols);
  k.x_stride = k.cols + 8;
  k.bf16_out = p.bf16_out;
  k.slots = mma_slots(activation_tiles(p.n), p.w.cols);
  k.m[0] = matrix_view(p);
  k.codes = p.x_codes;
  k.code_scale = p.x_scales;
  k.code_scale_ld = p.x_scale_ld;
  return k;
}

void launch_e4m3(const MmaParams& k, int tiles, cudaStream_t stream) {
  if (k.n <= 8) launch_mma<1>(k, tiles, stream);
  else launch_mma<2>(k, tiles, stream);
}

}  // namespace

bool mma_pair_covers(const GemmParams& a, const GemmParams& b) {
  const bool same = a.x == b.x && a.ldx == b.ldx && a.x_codes == b.x_codes && a.n == b.n && a.w.cols == b.w.cols && a.groups == 1 &&
                    b.groups == 1 && a.w.format == b.w.format && a.bf16_out == b.bf16_out;
  return same && ((e4m3_shape(a) && e4m3_shape(b)) || (bf16_shape(a) && bf16_shape(b)));
}

void mma(const GemmParams& a, cudaStream_t stream, const GemmParams* b) {
  DSV4_CHECK(b ? mma_pair_covers(a, *b) : mma_shape(a), "gemv: [", a.w.rows, ", ", a.w.cols,
             "] does not take the tensor-core GEMV");
  const int tiles = int(a.w.rows / kTileRows) + (b ? int(b->w.rows / kTileRows) : 0);
  if (e4m3_shape(a)) {
    MmaParams k = mma_params(a);
    if (b) k.m[1] = matrix_view(*b);
    launch_e4m3(k, tiles, stream);
    return;
  }
  Bf16Params k;
  k.x = a.x;
  k.ldx = a.ldx;
  k.n = int(a.n);
  k.cols = int(a.w.cols);
  k.groups = int(a.groups);
  k.x_stride = int(bf16_x_stride(a.w.cols));
  k.fp8 = a.w.format == WFormat::kFP8;
  k.bf16_out = a.bf16_out;
  k.m[0] = matrix_view(a);
  if (b) k.m[1] = matrix_view(*b);
  k.slots = bf16_slots(activation_tiles(a.n), a.w.cols, k.fp8);
  if (a.n <= 8) k.fp8 ? launch_bf16<1, true>(k, tiles, stream) : launch_bf16<1, false>(k, tiles, stream);
  else k.fp8 ? launch_bf16<2, true>(k, tiles, stream) : launch_bf16<2, false>(k, tiles, stream);
}

}  // namespace dsv4::cuda::gemv_detail

namespace dsv4::cuda {

bool gemv_mma_covers(const GemmParams& p) { return gemv_detail::mma_shape(p); }

bool gemv_codes_covers(const GemmParams& p) {
  return gemv_detail::e4m3_shape(p) && p.w.cols >= kGemvCodesMinCols;
}

}  // namespace dsv4::cuda
