// moe family: the tensor-core inner loop for FP4 and FP8 weights (mma.sync m16n8k16, fp16 in, fp32 out).
// A warp multiplies 16-row tiles of a matrix by ≤ 4 activation rows: the MMA's n = 8 columns are the hi and lo
// halves (below) of each token, column 2m + h, so one MMA takes both halves of up to four tokens.
//
// Exactness (the CPU computes in fp32): every weight is exact in fp16 (e4m3 always; e2m1 × its power-of-two
// block scale within the window found at upload, moe.cu's fp4_scales_fit), and each activation row is
// scaled by a power of two t into [2^14, 2^15) and split into two fp16 halves, hi = fp16(x·t) and
// lo = fp16(x·t − hi): 22 significant bits, and below hi's range lo keeps an absolute 2^-24 of 2^15, so
// hi + lo is within 2^-23 of x·t relative to the row's largest element. Products of fp16 are exact in the fp32
// accumulator, so W·x = (W·hi + W·lo) / t matches an fp32 dot to rounding of the sum (different order).
//
// Loads: lane (g, c) = (lane / 4, lane % 4) reads the 16-byte chunk 4·G + c of rows g and g + 8 of the tile
// for each K group G (FP4: 128 columns, FP8: 64): in row order the four lanes of a row cover 64 contiguous
// bytes, in the MMA tile order (below) the warp's 32 lanes 512. The MMA's k slots of lane c are 2c, 2c+1,
// 2c+8, 2c+9; they take four elements of the lane's own chunk (the K order inside a group is permuted;
// stage_rows_mma writes the activations in the same permuted order).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/moe/weight_dot.cuh"

namespace dsv4::cuda::moe {

// FP4 words in the MMA bit order. A tensor-core FP4 matrix (MatFormat::tensor_cores; CudaOps::to_mma_layout) keeps
// each 32-bit word of eight e2m1 codes (element i in nibble i, its sign at bit 4i + 3) with the magnitudes in place
// and the signs moved into the nibbles' top bits where the decoders want them: element i < 4's sign at bit 8i + 7,
// element 4 + i's at bit 8i + 3. Then one byte permute looks up four magnitudes in a table of their values, and one
// LOP3 puts their signs at bit 7 of each byte (fp4_lookup): 7 instructions for 8 weights, against 11 when a sign
// had to be shifted out of each nibble (docs/design/moe.md, "The FP4 bit order").
__host__ __device__ constexpr uint32_t fp4_mma_bits(uint32_t w) {
  uint32_t out = w & 0x77777777u;
  for (int i = 0; i < 8; ++i) out |= ((w >> (4 * i + 3)) & 1u) << (i < 4 ? 8 * i + 7 : 8 * (i - 4) + 3);
  return out;
}

// A word in the MMA bit order through a table of eight byte values (tab_lo: magnitudes 0..3, tab_hi: 4..7, each
// with bit 7 clear): lo gets the bytes of elements 0..3, hi of 4..7, with the elements' signs at bit 7.
// PTX's prmt, not __byte_perm: the intrinsic promises to ignore a selector nibble's bit 3, so the compiler masks
// each selector again (one more instruction a word); mag has those bits cleared already.
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
  return r;
}
__device__ __forceinline__ void fp4_lookup(uint32_t w, uint32_t tab_lo, uint32_t tab_hi, uint32_t& lo, uint32_t& hi) {
  const uint32_t mag = w & 0x77777777u;  // a selector nibble's bit 3 would replicate a sign: cleared
  lo = prmt(tab_lo, tab_hi, mag) | (w & 0x80808080u);
  hi = prmt(tab_lo, tab_hi, mag >> 16) | ((w << 4) & 0x80808080u);
}

// f16 weights from FP4 by table: the f16 of an e2m1 value times 2^lift is zero but for its high byte wherever it is
// a normal f16 — sign, five exponent bits, the mantissa's top two — and 2^lift adds 4·lift to that byte. So the
// table holds the high bytes of 0, 0.5, 1, 1.5 | 2, 3, 4, 6 lifted by 2^lift (0 stays 0), exact for lift in
// [kHalfLiftMin, kHalfLiftMax]: the smallest nonzero byte 0x38 + 4·lift ≥ 0x04 (a normal exponent) and the
// largest 0x46 + 4·lift ≤ 0x7A (1.5 · 2^15); no byte borrows from its neighbour.
constexpr int kHalfLiftMin = -13, kHalfLiftMax = 13;
__device__ __forceinline__ void fp4_half_tables(int lift, uint32_t& tab_lo, uint32_t& tab_hi) {
  const uint32_t l = uint32_t(lift) * 4u;
  tab_lo = 0x3E3C3800u + l * 0x01010100u;
  tab_hi = 0x46444240u + l * 0x01010101u;
}

// A word in the MMA bit order → f16 pairs of its elements in the MMA's fragment order (mma_columns): p[0] = (0, 2),
// p[1] = (4, 6), p[2] = (1, 3), p[3] = (5, 7), the first of a pair in the low half.
__device__ __forceinline__ void fp4_to_half2(uint32_t w, uint32_t tab_lo, uint32_t tab_hi, uint32_t (&p)[4]) {
  uint32_t lo, hi;
  fp4_lookup(w, tab_lo, tab_hi, lo, hi);
  p[0] = __byte_perm(lo, 0u, 0x2404u);  // bytes {0, lo.0, 0, lo.2}
  p[1] = __byte_perm(hi, 0u, 0x2404u);
  p[2] = __byte_perm(lo, 0u, 0x3414u);  // bytes {0, lo.1, 0, lo.3}
  p[3] = __byte_perm(hi, 0u, 0x3414u);
}

// The item and decode kernels' FP4 weights enter the MMA as fp16(e2m1 · s · 2^kFp4Offset), s = 2^(b − 127) for the
// E8M0 byte b, by the table lifted by b − 127 + kFp4Offset: exact for b in [kFp4ScaleMin, kFp4ScaleMax], whose lifts
// [−13, 11] lie in the table's range (the products e2m1 · 2^(b − 115) are normal f16 values from 2^-14 to 12288).
// The offset is divided out after the MMA.
constexpr int kFp4Offset = 12;
constexpr int kFp4ScaleMin = 102, kFp4ScaleMax = 126;
static_assert(kFp4ScaleMin - 127 + kFp4Offset >= kHalfLiftMin && kFp4ScaleMax - 127 + kFp4Offset <= kHalfLiftMax,
              "the item kernels' FP4 scales must lift within the f16 table's range");

template <WFormat F>
constexpr int kGroupCols = 4 * kChunkElems<F>;  // columns of one K group: FP4 128, FP8 64
template <WFormat F>
constexpr int kMmasPerChunk = kChunkElems<F> / 4;  // MMAs a lane's 16-byte chunk feeds: FP4 8, FP8 4

// The MMA tile order (DeviceWeight::mma_tiles, MatView::tiled). A matrix of whole 16-row tiles and whole K
// groups (64 bytes of a row: FP4 128 columns, FP8 64) stored as 16-byte units
//   unit ((T · groups + G) · 2 + h) · 32 + lane  =  chunk 4·G + c of row 16·T + g + 8·h,  lane = 4·g + c,
// the chunk lane (g, c) of warp_mma loads for tile T, group G and row half h. In row order one warp load
// reads 64 bytes of each of 8 rows; in this order it reads 512 contiguous bytes, which the expert kernels'
// grid loads faster (bench/moe/bench_load_pattern.cu, the loads alone). FP4's E8M0 scales (one per 16-byte
// chunk) follow the same order, one byte per unit; FP8's 128 x 128 block scales keep theirs.
// CudaOps::to_mma_layout permutes a matrix once, on the MoE's first call of its layer.
constexpr int kTileRows = 16;
constexpr int kTileGroupBytes = 64;
__host__ __device__ constexpr bool mma_tiles_fit(int64_t rows, int64_t row_bytes) {
  return rows > 0 && rows % kTileRows == 0 && row_bytes > 0 && row_bytes % kTileGroupBytes == 0;
}
__host__ __device__ constexpr int64_t mma_tile_unit(int64_t tile, int64_t group, int h, int lane, int64_t groups) {
  return ((tile * groups + group) * 2 + h) * 32 + lane;
}
constexpr int64_t kTileBytesPerGroup = kTileRows * kTileGroupBytes;  // a 16-row tile's K group
constexpr int64_t kTileUnitsPerGroup = kTileBytesPerGroup / 16;
constexpr int64_t kHalfUnits = mma_tile_unit(0, 0, 1, 0, 1);  // row half 1 of a (tile, group), in units

// Staged row stride in uint4 for `cols` columns: one uint4 per (group, MMA, lane) plus 4 so that token rows
// n and n + 1 (read in the same phase of a 128-bit load) fall on different banks.
template <WFormat F>
__host__ __device__ constexpr int64_t mma_stride16(int64_t cols) {
  return (cols + kGroupCols<F> - 1) / kGroupCols<F> * kMmasPerChunk<F> * 4 + 4;
}

// The four columns (relative to the lane chunk's first) whose activations feed MMA j of a chunk, in fragment
// order: b0 = (x[a], x[b]), b1 = (x[c], x[d]). FP4 follows the decoder in warp_mma, FP8 the bytes in order.
template <WFormat F>
__device__ __forceinline__ void mma_columns(int j, int (&col)[4]) {
  if constexpr (F == WFormat::kFP4) {
    const int base = 8 * (j / 2) + 4 * (j % 2);
    col[0] = base; col[1] = base + 2; col[2] = base + 1; col[3] = base + 3;
  } else {
    col[0] = 4 * j; col[1] = 4 * j + 1; col[2] = 4 * j + 2; col[3] = 4 * j + 3;
  }
}

__device__ __forceinline__ uint32_t pack_half2(__half lo, __half hi) {
  return uint32_t(__half_as_ushort(lo)) | (uint32_t(__half_as_ushort(hi)) << 16);
}

// The staging shift of a row whose largest magnitude is mx: x·2^shift lies in [2^14, 2^15); 0 (or a
// non-finite max) leaves the row unscaled.
__device__ __forceinline__ int staging_shift(float mx) { return (mx > 0.0f && mx <= 3.4e38f) ? 14 - ilogbf(mx) : 0; }

// max |x| over the columns of `row` that thread `rank` of `size` visits (the caller reduces over the threads).
// kInFlight float4 loads are issued together: each batch is an L2 round trip on the caller's path.
template <int kInFlight = 4>
__device__ __forceinline__ float row_abs_max_part(const float* __restrict__ row, int64_t cols, int rank, int size) {
  float mx = 0.0f;
  if (cols % 4 == 0) {  // 16-byte aligned rows: batches of float4 loads in flight
#pragma unroll kInFlight
    for (int64_t k = 4 * int64_t(rank); k < cols; k += 4 * int64_t(size)) {
      const float4 v = *reinterpret_cast<const float4*>(row + k);
      mx = fmaxf(mx, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
  } else {
    for (int64_t k = rank; k < cols; k += size) mx = fmaxf(mx, fabsf(row[k]));
  }
  return mx;
}

// One staged row (stride mma_stride16<F>(cols) uint4) written by thread `rank` of `size`: one uint4 per (group,
// MMA, lane), {hi(a,b), hi(c,d), lo(a,b), lo(c,d)} of x·2^sh; zeros for row == nullptr and past `cols`.
// A slot's four columns are four consecutive elements (FP4 in the order 0, 2, 1, 3: mma_columns): one 16-byte
// load where the row allows. x·2^sh is two exact multiplies, 2^min(sh, 127) then the rest (sh ≥ −113, from
// staging_shift): the value ldexpf gives, without its range handling — the staging is a per-warp serial
// prologue of expert_down's decode kernel, before its first weight load.
// act_quant (fast numerics, StageRounding::kActQuant) rounds x first. A warp's rounds are uniform (rank % 32 is
// the lane, size a multiple of 32) and cover 32 consecutive slots from a multiple of 32: the 128 columns of one
// act_quant block (FP4: one K group, FP8: two), whose amax act_quant_lanes takes by shuffles. sh still comes
// from the row as stored: the quantised values are at most 17/16 · (1 + 2^-8) of its max, so x·2^sh < 2^16 stays
// inside fp16 (max 65504); they have 4 significant bits, so hi holds them exactly (lo = 0) down to about 2^-35
// of the row's max.
template <WFormat F>
__device__ void stage_row_fragments(const float* __restrict__ row, int64_t cols, int sh, bool act_quant, uint4* xs_row,
                                    int rank, int size) {
  const int64_t stride = mma_stride16<F>(cols);
  const int64_t slots = (cols + kGroupCols<F> - 1) / kGroupCols<F> * kMmasPerChunk<F> * 4;
  const float s1 = __int_as_float((min(sh, 127) + 127) << 23), s2 = __int_as_float((max(sh - 127, 0) + 127) << 23);
  const bool vec = cols % 4 == 0 && reinterpret_cast<uintptr_t>(row) % 16 == 0;
  const int lane = rank % 32;
  for (int64_t s0 = rank - lane; s0 < stride; s0 += size) {  // the row is in L1 since the max pass
    const int64_t s = s0 + lane;
    const bool live = row && s < slots;
    const int64_t g = s / (kMmasPerChunk<F> * 4);
    const int j = int(s / 4 % kMmasPerChunk<F>), c = int(s % 4);
    int col[4];
    mma_columns<F>(j, col);
    const int64_t k0 = g * kGroupCols<F> + int64_t(c) * kChunkElems<F> + col[0];  // col[0] is the smallest
    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // the four consecutive elements k0 .. k0 + 3
    if (live) {
      if (vec && k0 + 3 < cols) {
        const float4 q = *reinterpret_cast<const float4*>(row + k0);
        x[0] = q.x; x[1] = q.y; x[2] = q.z; x[3] = q.w;
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) x[e] = k0 + e < cols ? row[k0 + e] : 0.0f;
      }
    }
    if (act_quant) act_quant_lanes(x);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (live) {
      float xs[4];  // in fragment order, scaled
#pragma unroll
      for (int e = 0; e < 4; ++e) xs[e] = x[col[e] - col[0]] * s1 * s2;
      const __half2 hi01 = __floats2half2_rn(xs[0], xs[1]), hi23 = __floats2half2_rn(xs[2], xs[3]);
      const float2 h01 = __half22float2(hi01), h23 = __half22float2(hi23);
      const __half2 lo01 = __floats2half2_rn(xs[0] - h01.x, xs[1] - h01.y);
      const __half2 lo23 = __floats2half2_rn(xs[2] - h23.x, xs[3] - h23.y);
      v = make_uint4(*reinterpret_cast<const uint32_t*>(&hi01), *reinterpret_cast<const uint32_t*>(&hi23),
                     *reinterpret_cast<const uint32_t*>(&lo01), *reinterpret_cast<const uint32_t*>(&lo23));
    }
    if (s < stride) xs_row[s] = v;
  }
}

// Stages `count` activation rows (row m at src + row_index(m)·cols) for format F: per row the power-of-two
// exponent shift[m] (staging_shift, from the row as stored) and the split fp16 pairs in fragment order, act_quant'ed
// where `act_quant` (fast numerics); rows count .. rows_total−1 and columns past `cols` are zero. Called by the
// whole block (blockDim.x a multiple of 32); ends with a barrier.
template <WFormat F, class RowIndex>
__device__ void stage_rows_mma(const float* __restrict__ src, int64_t cols, int count, int rows_total,
                               RowIndex row_index, bool act_quant, uint4* xs, int* shift, float* block_max) {
  const int64_t stride = mma_stride16<F>(cols);
  // 1. max |x| per row (block reduction through block_max[rows × warps]).
  const int warps = int(blockDim.x / 32), lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
  for (int m = 0; m < rows_total; ++m) {
    float mx = m < count ? row_abs_max_part(src + int64_t(row_index(m)) * cols, cols, int(threadIdx.x), int(blockDim.x))
                         : 0.0f;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, off));
    if (lane == 0) block_max[m * warps + warp] = mx;
  }
  __syncthreads();
  if (threadIdx.x < unsigned(rows_total)) {
    float mx = 0.0f;
    for (int w = 0; w < warps; ++w) mx = fmaxf(mx, block_max[int(threadIdx.x) * warps + w]);
    shift[threadIdx.x] = staging_shift(mx);
  }
  __syncthreads();
  // 2. The rows in fragment order.
  for (int m = 0; m < rows_total; ++m)
    stage_row_fragments<F>(m < count ? src + int64_t(row_index(m)) * cols : nullptr, cols, shift[m], act_quant,
                           xs + m * stride, int(threadIdx.x), int(blockDim.x));
  __syncthreads();
}

// stage_rows_mma by one warp into its own rows (no block barrier): shift[m] as there, ends with __syncwarp.
template <WFormat F, class RowIndex>
__device__ void stage_rows_mma_warp(const float* __restrict__ src, int64_t cols, int count, int rows_total,
                                    RowIndex row_index, bool act_quant, uint4* xs, int* shift) {
  const int64_t stride = mma_stride16<F>(cols);
  const int lane = int(threadIdx.x % 32);
  __syncwarp();  // every lane is done reading the rows and shifts this replaces
  for (int m = 0; m < rows_total; ++m) {
    const float* row = m < count ? src + int64_t(row_index(m)) * cols : nullptr;
    // A decode row (I = 2048: 16 float4 per lane) in one batch of loads, not four, each an L2 round trip: the
    // staging is the per-warp prologue of expert_down's decode kernel, before its first weight load.
    float mx = row ? row_abs_max_part<16>(row, cols, lane, 32) : 0.0f;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, off));
    const int sh = staging_shift(mx);
    if (lane == 0) shift[m] = sh;
    stage_row_fragments<F>(row, cols, sh, act_quant, xs + m * stride, lane, 32);
  }
  __syncwarp();
}

__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ uint32_t e4m3x2_to_half2(uint32_t two_bytes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two_bytes), __NV_E4M3);
  return uint32_t(h.x) | (uint32_t(h.y) << 16);
}

// One warp, NT tiles of 16 rows (tile i: rows row0[i] .. +15 of mats[i], rows_valid[i] of them real; a tiled
// matrix's row0 is a multiple of 16 and its tiles are whole), K groups [g_begin, g_end), activations xs
// (stride mma_stride16 per token row, ntok ≤ 4 rows). acc[i] gets the tile's D fragment: d0 = (row g, token
// c, hi), d1 = (g, c, lo), d2 = (g+8, c, hi), d3 = (g+8, c, lo), in units of
// (x·2^shift) · (FP4: 2^kFp4Offset; FP8: 1), block scales applied; a token's product is its hi + lo.
// Each round issues the loads of kUnroll groups (NT · kUnroll · 2 chunks per lane) before their MMAs.
template <WFormat F, int NT, int kUnroll = 2>
__device__ __forceinline__ void warp_mma(const MatView (&mats)[NT], const int64_t (&row0)[NT], const int (&rows_valid)[NT],
                                         int64_t cols, int64_t g_begin, int64_t g_end, const uint4* xs,
                                         int64_t xs_stride, int ntok, float (&acc)[NT][4]) {
  static_assert(F == WFormat::kFP4 || F == WFormat::kFP8, "tensor-core path: FP4 and FP8 weights");
  const int lane = int(threadIdx.x % 32), g = lane / 4, c = lane % 4;
  const int64_t chunks = chunks_per_row<F>(cols);
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;
  // Where (tile i, row half h) reads K group G: byte offset offset[i][h] + G · step[i] of the data, and FP4
  // scale offset[i][h] + G · scale_step[i] — in row order chunk 4G + c of row g + 8h (64 bytes, 4 scales
  // per group), in the tile order its unit (1024 bytes, 64 scales per group). 32 bits: a matrix is < 4 GiB
  // (launch_expert_* check). live: the row exists (a tiled tile is whole, or absent past expert_down's D).
  uint32_t offset[NT][2], scale_offset[NT][2], step[NT], scale_step[NT];
  bool row_live[NT][2];
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    const bool tiled = mats[i].tiled;
    step[i] = tiled ? 2 * 32 * 16 : 4 * 16;
    scale_step[i] = tiled ? 2 * 32 : 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row0[i] + g + 8 * h;
      const int64_t unit = mma_tile_unit(row0[i] / kTileRows, 0, h, lane, mats[i].row_bytes / kTileGroupBytes);
      offset[i][h] = uint32_t(tiled ? 16 * unit : row * mats[i].row_bytes + 16 * c);
      scale_offset[i][h] = uint32_t(tiled ? unit : row * mats[i].scale_cols + c);
      row_live[i][h] = tiled ? rows_valid[i] > 0 : g + 8 * h < rows_valid[i];
    }
  }
  for (int64_t g0 = g_begin; g0 < g_end; g0 += kUnroll) {
    uint4 raw[kUnroll][NT][2];
    int fp4_lift[kUnroll][NT][2];
    float fp8_scale[kUnroll][NT];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t q = (g0 + u) * 4 + c;
#pragma unroll
      for (int i = 0; i < NT; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t G = uint32_t(g0 + u);
          const bool live = g0 + u < g_end && q < chunks && row_live[i][h];  // tiled: q < chunks for every group
          raw[u][i][h] = live ? load_stream16(mats[i].data + (offset[i][h] + G * step[i])) : make_uint4(0, 0, 0, 0);
          if constexpr (F == WFormat::kFP4) {
            const uint8_t* scales = static_cast<const uint8_t*>(mats[i].scale);
            fp4_lift[u][i][h] = (live ? int(scales[scale_offset[i][h] + G * scale_step[i]]) : 127) - 127 + kFp4Offset;
          }
        }
        if constexpr (F == WFormat::kFP8) {  // one 128x128 block scale for the whole tile and group
          const int64_t srow = (row0[i]) / 128, scol = (g0 + u) * kGroupCols<F> / 128;
          fp8_scale[u][i] = g0 + u < g_end ? static_cast<const float*>(mats[i].scale)[srow * mats[i].scale_cols + scol] : 0.0f;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (g0 + u >= g_end) break;
      // Column g of B is token g / 2's hi (g even) or lo (g odd) half: the .xy or .zw of its staged uint4.
      const uint2* xg = reinterpret_cast<const uint2*>(xs + int64_t(g / 2) * xs_stride + (g0 + u) * kMmasPerChunk<F> * 4 + c) + g % 2;
      // FP4 carries its scales in the weights and accumulates straight into acc; FP8 scales each group's sum.
      float part[NT][4];
#pragma unroll
      for (int i = 0; i < NT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[i][e] = F == WFormat::kFP4 ? acc[i][e] : 0.0f;
      if constexpr (F == WFormat::kFP4) {
        // Word wi of a lane's chunk feeds MMA 2wi its elements (0, 2) and (1, 3), MMA 2wi + 1 (4, 6) and (5, 7):
        // mma_columns. Each word is decoded once, by the table of its (tile, row half) lifted by its scale.
        uint32_t tab[NT][2][2];
#pragma unroll
        for (int i = 0; i < NT; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) fp4_half_tables(fp4_lift[u][i][h], tab[i][h][0], tab[i][h][1]);
#pragma unroll
        for (int wi = 0; wi < 4; ++wi) {
          uint32_t p[NT][2][4];
#pragma unroll
          for (int i = 0; i < NT; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const uint4& v = raw[u][i][h];
              fp4_to_half2(wi == 0 ? v.x : wi == 1 ? v.y : wi == 2 ? v.z : v.w, tab[i][h][0], tab[i][h][1], p[i][h]);
            }
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) {
            const int j = 2 * wi + jj;
            const uint2 b = g / 2 < ntok ? xg[j * 8] : make_uint2(0, 0);
#pragma unroll
            for (int i = 0; i < NT; ++i)
              mma_f16(part[i], p[i][0][jj], p[i][1][jj], p[i][0][2 + jj], p[i][1][2 + jj], b.x, b.y);
          }
        }
      } else {
#pragma unroll
        for (int j = 0; j < kMmasPerChunk<F>; ++j) {
          const uint2 b = g / 2 < ntok ? xg[j * 8] : make_uint2(0, 0);
#pragma unroll
          for (int i = 0; i < NT; ++i) {
            uint32_t a[2][2];  // [row half h][pair]: pair 0 → k slots 2c, 2c+1; pair 1 → 2c+8, 2c+9
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const uint4& v = raw[u][i][h];
              const uint32_t w = j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
              a[h][0] = e4m3x2_to_half2(w & 0xFFFFu);
              a[h][1] = e4m3x2_to_half2(w >> 16);
            }
            mma_f16(part[i], a[0][0], a[1][0], a[0][1], a[1][1], b.x, b.y);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < NT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if constexpr (F == WFormat::kFP4) acc[i][e] = part[i][e];
          else acc[i][e] = fmaf(part[i][e], fp8_scale[u][i], acc[i][e]);
        }
    }
  }
}

}  // namespace dsv4::cuda::moe
