// gemm family: the tensor-core path for prefill shapes on sm_90a (H100/H200) — gemm.h's gemm_tensor_core,
// in two steps (tc_gemm.h).
//
// y[n, N] = x[n, K] · Wᵀ, W [N, K] in BF16 or FP8 e4m3 with 128×128 block scales, fp32 accumulation and output.
// The tensor cores take both operands in one format, so x is first rounded to the weight's:
//   BF16: round to nearest even;
//   FP8:  e4m3 per (row, 128-column block) with a power-of-two scale — DeepSeek's act_quant, the same function
//         as CpuOps::sim_fp8(x, block 128).
// Then one persistent warp-specialised kernel, a CTA per SM looping over output tiles (128 activation rows ×
// kBlockN weight rows):
//   warpgroup 0 (producer): one thread streams K slices of the x tile and of the W tile (FP8: and the slice's
//     x scales of the tile rows) into a ring of shared memory stages with TMA (128-byte swizzle), each stage
//     guarded by a full / empty mbarrier pair; the ring runs on across tiles, so the next tile loads while the
//     last one is stored;
//   warpgroups 1, 2 (consumers): 64 tile rows each, wgmma straight from shared memory, fp32 accumulators in
//     registers, results stored from registers.
// BF16 tiles are 128 × 256 (128 × 128 when narrow tiles take fewer waves) with K slices of 64; FP8 tiles
// are 128 × 128 with K slices of 128 = one scale block. The FP8 tensor-core accumulator keeps only ~14 bits,
// so each slice is accumulated in fresh registers and promoted into the fp32 total with scale_x[row] · scale_w
// (DeepGEMM style); two register sets alternate so the next slice's wgmmas run while one is promoted, and the
// scales are in registers before the promotion waits for them (kScaleAhead).
// When there are still too few tiles to fill the GPU, K is split across CTAs: each writes its partial tile to a
// workspace and a second kernel adds the partials in a fixed order (deterministic results).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/common/smem.h"
#include "cuda/common/tensor_map.h"
#include "cuda/common/check.h"
#include "cuda/common/fp_grid.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/gemm/gemm.h"
#include "cuda/gemm/tc_gemm.h"
#include "cuda/gemm/tc_ptx.cuh"
#include "cuda/gemm/tc_wgmma.cuh"

namespace dsv4::cuda {

namespace {

// Workspace slots of this path (CudaOps::workspace): the rounded activations, their FP8 scales, the
// split-K partial tiles.

constexpr int kThreads = 384;       // producer warpgroup + two consumer warpgroups
constexpr int kScaleBlock = 128;    // FP8 scales: weights per 128×128 block, activations per 1×128
constexpr int kSwizzleBytes = 128;  // one K slice = one swizzled 128-byte row per tile row

// Tile shapes. kBlockM = 128 activation rows: 64 (one wgmma M) per consumer warpgroup.
template <int kN>
struct Bf16Tiles {
  static constexpr bool kFp8 = false;
  static constexpr int kBlockM = 128, kBlockN = kN, kBlockK = 64, kElementBytes = 2;
  static constexpr int kStages = kN == 256 ? 4 : 6;  // ~192 KB of shared memory either way
  static constexpr int kMinSlicesPerSplit = 8;      // a split-K CTA still runs ≥ 512 of K (pipeline fill pays off)
};
struct Fp8Tiles {
  static constexpr bool kFp8 = true;
  static constexpr int kBlockM = 128, kBlockN = 128, kBlockK = 128, kStages = 6, kElementBytes = 1;
  static constexpr int kMinSlicesPerSplit = 4;
};

template <class T>
struct Smem {
  static constexpr int kTileA = T::kBlockM * kSwizzleBytes;  // [kBlockM rows][128 B]
  static constexpr int kTileB = T::kBlockN * kSwizzleBytes;  // [kBlockN rows][128 B]
  static constexpr int kScales = T::kFp8 ? T::kBlockM * 4 : 0;  // FP8: the slice's x scales of the tile rows
  static constexpr int kStage = kTileA + kTileB + kScales;   // bytes one stage's TMA copies deliver
  static constexpr int kBarriers = T::kStages * 2 * 8;       // full[stages], empty[stages]
  static constexpr int kBytes = 1024 + T::kStages * kStage + kBarriers;  // + slack for the 1024-byte alignment
  static_assert(T::kBlockK * T::kElementBytes == kSwizzleBytes, "one K slice must be one 128-byte swizzle row");
};

struct TcParams {
  int n;                   // activation rows
  int out_per_group;       // output columns (W rows) per group; even
  int in_per_group;        // K of one group (W columns), a multiple of 128
  int slices;              // K slices of one group: in_per_group / kBlockK
  int slices_per_split;    // K slices one output tile's CTA accumulates
  int splits;              // tiles along K per output tile
  int m_tiles, n_tiles;    // tiles along n and along one group's output columns
  int tiles;               // m_tiles · n_tiles · groups · splits; tile t = m + m_tiles·(nt + n_tiles·(group·splits + split))
  float* out;              // [n, ld_out] y itself, or [splits][n, ld_out] partial tiles when splits > 1
  uint16_t* out_bf16;      // instead of out, where set (no split, fast numerics): y as bf16 (GemmParams::y_bf16)
  int64_t ld_out;          // even
  int64_t split_stride;    // elements between partial planes (0 when splits == 1)
  const float* w_scale;    // FP8: [ceil(N / 128), w_scale_cols] weight block scales
  int64_t w_scale_cols;
  bool round_out;          // fast numerics: y in bf16 (GemmParams::bf16_out) and no split: rounded as stored
};

// Where tile t starts.
struct Tile {
  int row0;    // first activation row
  int col0;    // first output column, within the group
  int group, split;
  int w_row0;  // first W row
  int w_k0;    // first K element, in W
  int x_k0;    // the same, in x
  int slices;  // K slices to accumulate
};

template <class T>
__device__ __forceinline__ Tile tile_at(const TcParams& p, int t) {
  Tile tile;
  const int m = t % p.m_tiles;
  t /= p.m_tiles;
  const int nt = t % p.n_tiles, z = t / p.n_tiles;
  tile.group = z / p.splits;
  tile.split = z % p.splits;
  const int first_slice = tile.split * p.slices_per_split;
  tile.slices = min(p.slices, first_slice + p.slices_per_split) - first_slice;
  tile.row0 = m * T::kBlockM;
  tile.col0 = nt * T::kBlockN;
  tile.w_row0 = tile.group * p.out_per_group + tile.col0;
  tile.w_k0 = first_slice * T::kBlockK;
  tile.x_k0 = tile.group * p.in_per_group + tile.w_k0;
  return tile;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Writes this thread's accumulator fragment (tc_wgmma.cuh layout) of the tile at (row0, col0 within the
// group), whose first element is `base` elements into the output, clipping rows to n and columns to the group's
// width.
template <class T>
__device__ __forceinline__ void store_fragment(const float (&v)[T::kBlockN / 2], const TcParams& p, int64_t base,
                                               int row, int col) {
#pragma unroll
  for (int j = 0; j < T::kBlockN / 8; ++j) {
    const int c = col + 8 * j;
    if (c >= p.out_per_group) break;  // out_per_group is even: c + 1 is inside whenever c is
    const auto put = [&](int r, float a, float b) {
      if (r >= p.n) return;
      const int64_t at = base + int64_t(r) * p.ld_out + c;
      if (p.out_bf16) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        *reinterpret_cast<__nv_bfloat162*>(p.out_bf16 + at) = h;
      } else {
        *reinterpret_cast<float2*>(p.out + at) = make_float2(round_bf16_if(p.round_out, a), round_bf16_if(p.round_out, b));
      }
    };
    put(row, v[4 * j], v[4 * j + 1]);
    put(row + 8, v[4 * j + 2], v[4 * j + 3]);
  }
}

// FP8 scales must be in registers when a slice is promoted, and a load issued a slice earlier has not returned
// (an L2 round trip under the kernel's own L2 traffic outlasts a slice): the promotion waited on it, and with
// constant scales the kernel ran in cuBLASLt's time. So the x scales arrive in each stage by TMA with the
// slice's data, and the w scales (one per slice) are loaded kScaleAhead pairs of slices ahead, a lane holding
// slice 2q + lane % 2's. Loading a tile's first w scales during the previous tile did not help. The
// measurements: docs/design/gemm.md, "The FP8 scale loads".
constexpr int kScaleAhead = 4;

#endif

// x_map: activations [n, K_total] in the weight's format; w_map: W [N, K]. Persistent: CTA b computes tiles
// b, b + gridDim.x, ... (m tiles vary fastest, so the CTAs at work together share few W tiles and each W tile is
// read from HBM about once; the activations are the part re-read, from L2). The stage ring runs on across
// tiles, so the producer loads the next tile while the consumers store the last one.
template <class T>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_tc_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
                   const __grid_constant__ CUtensorMap scale_map,
                   const TcParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace tc;
  using S = Smem<T>;
  extern __shared__ uint8_t smem_raw[];
  // NOTE: swizzled tiles must start on 1024-byte boundaries (the 128-byte swizzle repeats every 8 rows), and
  // every tile size here is a multiple of 1024.
  uint8_t* const smem = smem_raw + ((1024 - (smem_address(smem_raw) & 1023)) & 1023);
  uint8_t* const tiles_a = smem;                               // [stages][kTileA]
  uint8_t* const tiles_b = smem + T::kStages * S::kTileA;      // [stages][kTileB]
  float* const x_scales = reinterpret_cast<float*>(tiles_b + T::kStages * S::kTileB);    // FP8: [stages][kBlockM]
  uint64_t* const full = reinterpret_cast<uint64_t*>(tiles_b + T::kStages * (S::kTileB + S::kScales));  // [stages]
  uint64_t* const empty = full + T::kStages;                                             // [stages]

  if (threadIdx.x == 0) {
    prefetch_tensor_map(&x_map);
    prefetch_tensor_map(&w_map);
    if constexpr (T::kFp8) prefetch_tensor_map(&scale_map);
    for (int s = 0; s < T::kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 8);  // lane 0 of each consumer warp releases a stage
    }
    fence_barrier_init();
  }
  __syncthreads();

  // Slice number `used` (counted over all of this CTA's tiles) lives in stage used % kStages, and that stage's
  // barriers are in their (used / kStages)-th phase.
  if (threadIdx.x < 128) {
    // Producer: stage s is refilled once all consumer warps released it.
    setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      int used = 0;
      for (int t = int(blockIdx.x); t < p.tiles; t += int(gridDim.x)) {
        const Tile tile = tile_at<T>(p, t);
        for (int i = 0; i < tile.slices; ++i, ++used) {
          const int s = used % T::kStages;
          mbar_wait(&empty[s], ((used / T::kStages) & 1) ^ 1);
          mbar_arrive_expect_tx(&full[s], S::kStage);
          tma_load_2d(tiles_a + s * S::kTileA, &x_map, &full[s], tile.x_k0 + i * T::kBlockK, tile.row0);
          tma_load_2d(tiles_b + s * S::kTileB, &w_map, &full[s], tile.w_k0 + i * T::kBlockK, tile.w_row0);
          if constexpr (T::kFp8)
            tma_load_2d(x_scales + s * T::kBlockM, &scale_map, &full[s], tile.row0, tile.x_k0 / kScaleBlock + i);
        }
      }
    }
    return;
  }

  // Consumers: warpgroup wg computes tile rows [64·wg, 64·wg + 64) × all kBlockN columns.
  setmaxnreg_inc<232>();
  const int wg = int(threadIdx.x) / 128 - 1;
  const int warp = (int(threadIdx.x) / 32) % 4, lane = int(threadIdx.x) % 32;
  const int fragment_row = wg * 64 + warp * 16 + lane / 4;  // this thread's tile rows: these, + 8
  const int fragment_col = 2 * (lane % 4);                  // and columns: these + 8j, + 8j + 1
  // Operand A of this warpgroup: its 64 rows of the x tile.
  const int a_offset = wg * 64 * kSwizzleBytes;
  const auto release = [&](int slice) {  // frees the stage of slice number `slice`
    if (lane == 0) mbar_arrive(&empty[slice % T::kStages]);
  };

  int used = 0;
  float acc[T::kBlockN / 2];
  // FP8: a tile's total is stored after the next tile's first wgmmas are issued, so the stores overlap them.
  float total[T::kBlockN / 2];
  int64_t stored_out = -1;  // where the tile whose total waits to be stored starts (−1: none)
  int stored_row = 0, stored_col = 0;
  for (int t = int(blockIdx.x); t < p.tiles; t += int(gridDim.x)) {
    const Tile tile = tile_at<T>(p, t);
    const int row = tile.row0 + fragment_row, col = tile.col0 + fragment_col;
    const int64_t out = tile.split * p.split_stride + int64_t(tile.group) * p.out_per_group;
    if constexpr (!T::kFp8) {
      for (int i = 0; i < tile.slices; ++i, ++used) {
        const int s = used % T::kStages;
        mbar_wait(&full[s], (used / T::kStages) & 1);
        const uint64_t a = smem_descriptor_sw128(tiles_a + s * S::kTileA + a_offset);
        const uint64_t b = smem_descriptor_sw128(tiles_b + s * S::kTileB);
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < T::kBlockK / 16; ++k) {  // 16 bf16 = 32 bytes = 2 descriptor units along K
          const uint32_t accumulate = (i > 0 || k > 0) ? 1u : 0u;
          if constexpr (T::kBlockN == 256) wgmma_m64n256k16_bf16(acc, a + 2 * k, b + 2 * k, accumulate);
          else wgmma_m64n128k16_bf16(acc, a + 2 * k, b + 2 * k, accumulate);
        }
        wgmma_commit();
        // Keep this slice's wgmmas in flight; the previous slice's are done, so its stage can be refilled.
        wgmma_wait<1>();
        if (i > 0) release(used - 1);
      }
      wgmma_wait<0>();
      fence_registers(acc);
      release(used - 1);
      store_fragment<T>(acc, p, out, row, col);
    } else {
      // Two accumulator sets: slice i + 1's wgmmas run on the tensor cores while slice i is promoted.
      float other[T::kBlockN / 2];
      // Issues slice i's wgmmas into d; returns its x scales at rows row, row + 8 (from the stage).
      const auto issue = [&](float(&d)[T::kBlockN / 2], int i) {
        const int s = (used + i) % T::kStages;
        mbar_wait(&full[s], ((used + i) / T::kStages) & 1);
        const uint64_t a = smem_descriptor_sw128(tiles_a + s * S::kTileA + a_offset);
        const uint64_t b = smem_descriptor_sw128(tiles_b + s * S::kTileB);
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < T::kBlockK / 32; ++k) wgmma_m64n128k32_e4m3(d, a + 2 * k, b + 2 * k, k > 0 ? 1u : 0u);
        wgmma_commit();
        const float* xs = x_scales + s * T::kBlockM + fragment_row;
        return make_float2(xs[0], xs[8]);
      };
      // Adds slice i (in d; sc = its scales at rows row, row + 8) to the total once all wgmma groups but the
      // newest `pending` are done.
      const auto promote = [&](float(&d)[T::kBlockN / 2], int i, float2 sc, auto pending) {
        wgmma_wait<decltype(pending)::value>();
        fence_registers(d);
        release(used + i);
#pragma unroll
        for (int j = 0; j < T::kBlockN / 8; ++j) {
          total[4 * j] += d[4 * j] * sc.x;
          total[4 * j + 1] += d[4 * j + 1] * sc.x;
          total[4 * j + 2] += d[4 * j + 2] * sc.y;
          total[4 * j + 3] += d[4 * j + 3] * sc.y;
        }
      };
      using One = std::integral_constant<int, 1>;
      using None = std::integral_constant<int, 0>;

      // W scales kScaleAhead pairs ahead: register q % kScaleAhead holds pair q's (lane e: slice 2q + e % 2).
      float scale_w[kScaleAhead];
      const float* w_scale = p.w_scale + int64_t(tile.w_row0 / kScaleBlock) * p.w_scale_cols + tile.w_k0 / kScaleBlock;
      const auto load_w = [&](int q, float& w) { w = w_scale[min(2 * q + lane % 2, tile.slices - 1)]; };
#pragma unroll
      for (int u = 0; u < kScaleAhead; ++u) load_w(u, scale_w[u]);
      const auto times = [](float2 x, float w) { return make_float2(x.x * w, x.y * w); };  // exact: x is 2^k
      float2 x_acc = issue(acc, 0), x_other;
      if (stored_out >= 0) store_fragment<T>(total, p, stored_out, stored_row, stored_col);
#pragma unroll
      for (int j = 0; j < T::kBlockN / 2; ++j) total[j] = 0.0f;
      // Slices i, i + 1 (i even: pair i / 2, its w scales in w) with slice i + 2 issued; then pair
      // i / 2 + kScaleAhead's into w.
      const auto pair = [&](int i, float& w) {
        const float w0 = __shfl_sync(0xFFFFFFFFu, w, 0), w1 = __shfl_sync(0xFFFFFFFFu, w, 1);
        x_other = issue(other, i + 1);
        promote(acc, i, times(x_acc, w0), One{});
        x_acc = issue(acc, i + 2);
        promote(other, i + 1, times(x_other, w1), One{});
        if (2 * (i / 2 + kScaleAhead) < tile.slices) load_w(i / 2 + kScaleAhead, w);
      };
      int i = 0;
      for (; i + 2 * kScaleAhead < tile.slices; i += 2 * kScaleAhead) {
#pragma unroll
        for (int u = 0; u < kScaleAhead; ++u) pair(i + 2 * u, scale_w[u]);
      }
      // At most kScaleAhead − 1 more pairs, then the last pair (one or two slices) with register u.
      int u = 0;
#pragma unroll
      for (int v = 0; v + 1 < kScaleAhead; ++v)
        if (i + 2 < tile.slices) {
          pair(i, scale_w[v]);
          i += 2;
          u = v + 1;
        }
      float w = scale_w[0];
#pragma unroll
      for (int v = 1; v < kScaleAhead; ++v)
        if (u == v) w = scale_w[v];
      const float w0 = __shfl_sync(0xFFFFFFFFu, w, 0), w1 = __shfl_sync(0xFFFFFFFFu, w, 1);
      if (i + 1 < tile.slices) {
        x_other = issue(other, i + 1);
        promote(acc, i, times(x_acc, w0), One{});
        promote(other, i + 1, times(x_other, w1), None{});
      } else {
        promote(acc, i, times(x_acc, w0), None{});
      }
      used += tile.slices;
      stored_out = out;
      stored_row = row;
      stored_col = col;
    }
  }
  if constexpr (T::kFp8) {
    if (stored_out >= 0) store_fragment<T>(total, p, stored_out, stored_row, stored_col);
  }
#endif  // NOTE: other architectures get an empty body; the launcher only runs this kernel on compute capability 9.x
}

// y[r, c] = Σ_s partial[s][r, c], splits added in order. Launched with PDL behind the GEMM: its launch overlaps
// the GEMM's last tiles, and it reads the partials (through L2) after the wait.
struct ReduceParams {
  const float* partial;  // [splits][n, N]
  int splits;
  int64_t split_stride;
  int n;
  int64_t N;  // even
  float* y;   // [n, ldy], ldy even
  uint16_t* y_bf16;  // instead of y, where set
  int64_t ldy;
  bool bf16_out;
};

__global__ void reduce_splits_kernel(const ReduceParams p) {
  pdl_wait();
  const int64_t pairs = p.N / 2, count = int64_t(p.n) * pairs;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / pairs, c = 2 * (i % pairs);
    const float* src = p.partial + r * p.N + c;
    float2 sum = __ldcg(reinterpret_cast<const float2*>(src));
    for (int s = 1; s < p.splits; ++s) {
      const float2 v = __ldcg(reinterpret_cast<const float2*>(src + s * p.split_stride));
      sum.x += v.x;
      sum.y += v.y;
    }
    if (p.y_bf16)
      *reinterpret_cast<__nv_bfloat162*>(p.y_bf16 + r * p.ldy + c) = __floats2bfloat162_rn(sum.x, sum.y);
    else
      *reinterpret_cast<float2*>(p.y + r * p.ldy + c) =
          make_float2(round_bf16_if(p.bf16_out, sum.x), round_bf16_if(p.bf16_out, sum.y));
  }
}

// xb[r, k] = bf16(x[r, k]), round to nearest even. x [n, ldx] fp32, xb [n, K] compact, K % 8 == 0.
// One thread per 8 columns (two 16-byte loads in flight, one 16-byte store); kVector when x and ldx allow
// 16-byte loads.
template <bool kVector>
__global__ void round_bf16_kernel(const float* __restrict__ x, int64_t ldx, int n, int64_t K,
                                  __nv_bfloat16* __restrict__ xb) {
  const int64_t octets_per_row = K / 8, count = int64_t(n) * octets_per_row;
  for (int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; q < count; q += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = q / octets_per_row, c = 8 * (q % octets_per_row);
    const float* src = x + r * ldx + c;
    float4 v0, v1;
    if constexpr (kVector) {
      v0 = *reinterpret_cast<const float4*>(src);
      v1 = *reinterpret_cast<const float4*>(src + 4);
    } else {
      v0 = make_float4(src[0], src[1], src[2], src[3]);
      v1 = make_float4(src[4], src[5], src[6], src[7]);
    }
    const __nv_bfloat162 b0 = __floats2bfloat162_rn(v0.x, v0.y), b1 = __floats2bfloat162_rn(v0.z, v0.w);
    const __nv_bfloat162 b2 = __floats2bfloat162_rn(v1.x, v1.y), b3 = __floats2bfloat162_rn(v1.z, v1.w);
    uint4 packed;
    packed.x = *reinterpret_cast<const uint32_t*>(&b0);
    packed.y = *reinterpret_cast<const uint32_t*>(&b1);
    packed.z = *reinterpret_cast<const uint32_t*>(&b2);
    packed.w = *reinterpret_cast<const uint32_t*>(&b3);
    *reinterpret_cast<uint4*>(xb + r * K + c) = packed;
  }
}

__device__ __forceinline__ float pow2(int e) { return __uint_as_float(uint32_t(e + 127) << 23); }  // |e| ≤ 126

// Per (row, 128-column block): s = 2^⌈log2(max(amax, 1e-4) / 448)⌉, xq = e4m3(x / s) (round to nearest even;
// |x / s| ≤ 448 by construction), x_scale[block, row] = s — CpuOps::sim_fp8 with block 128, split into codes
// and scales. x [n, ldx] fp32, xq [n, K] e4m3, x_scale [K / 128, scale_ld]. One warp per (row, block), 4 columns
// a lane.
template <bool kVector>
__global__ void quantize_e4m3_kernel(const float* __restrict__ x, int64_t ldx, int n, int64_t K,
                                     uint8_t* __restrict__ xq, float* __restrict__ x_scale, int64_t scale_ld) {
  const int64_t blocks = K / kScaleBlock, tasks = int64_t(n) * blocks;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
  const int lane = int(threadIdx.x) % 32;
  // The task index is uniform per warp, so the shuffles below always see full warps.
  for (int64_t task = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; task < tasks; task += warps) {
    const int64_t r = task / blocks, b = task % blocks;
    const float* src = x + r * ldx + b * kScaleBlock + 4 * lane;
    float4 v;
    if constexpr (kVector) v = *reinterpret_cast<const float4*>(src);
    else v = make_float4(src[0], src[1], src[2], src[3]);
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
    const int e = e4m3_block_exponent(amax);
    const float inv = pow2(-e);
    const __nv_fp8x2_storage_t lo =
        __nv_cvt_float2_to_fp8x2(make_float2(v.x * inv, v.y * inv), __NV_SATFINITE, __NV_E4M3);
    const __nv_fp8x2_storage_t hi =
        __nv_cvt_float2_to_fp8x2(make_float2(v.z * inv, v.w * inv), __NV_SATFINITE, __NV_E4M3);
    *reinterpret_cast<uint32_t*>(xq + r * K + b * kScaleBlock + 4 * lane) = uint32_t(lo) | (uint32_t(hi) << 16);
    if (lane == 0) x_scale[b * scale_ld + r] = pow2(e);
  }
}

// ---- host side

// FP8 activation scales [slices, scale_ld] in boxes of one slice × box_rows rows.
CUtensorMap scale_map_of(const TcActivations& a, int n, int64_t slices, int box_rows) {
  return tensor_map_2d(a.scale, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, slices, n, a.scale_ld * 4, 1, box_rows,
                       CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE, "activation scale array");
}

unsigned grid_for(int64_t items, int threads) {
  return unsigned(std::min<int64_t>(ceil_div(items, threads), int64_t(1) << 20));
}

// Output tiles and K splits of one launch.
struct Grid {
  int m_tiles = 0, n_tiles = 0, splits = 1, slices_per_split = 0;
};

template <class T>
Grid grid_of(const GemmParams& p, int sms) {
  Grid g;
  g.m_tiles = int(ceil_div(p.n, T::kBlockM));
  g.n_tiles = int(ceil_div(p.w.rows / p.groups, T::kBlockN));
  const int64_t tiles = int64_t(g.m_tiles) * g.n_tiles * p.groups;
  const int slices = int(p.w.cols / T::kBlockK);
  // Split K when one tile per CTA leaves more than half of the SMs idle.
  if (2 * tiles <= sms)
    g.splits = int(std::max<int64_t>(1, std::min<int64_t>(sms / tiles, slices / T::kMinSlicesPerSplit)));
  g.slices_per_split = int(ceil_div(slices, g.splits));
  g.splits = int(ceil_div(slices, g.slices_per_split));  // no empty split
  return g;
}

template <class T>
void launch(const GemmParams& p, const TcActivations& a, const Grid& g, CudaOps& ops) {
  using S = Smem<T>;
  const cudaStream_t stream = ops.stream();
  const int n = int(p.n);
  TcParams tp{};
  tp.n = n;
  tp.out_per_group = int(p.w.rows / p.groups);
  tp.in_per_group = int(p.w.cols);
  tp.slices = int(p.w.cols / T::kBlockK);
  tp.slices_per_split = g.slices_per_split;
  tp.splits = g.splits;
  tp.m_tiles = g.m_tiles;
  tp.n_tiles = g.n_tiles;
  tp.tiles = int(int64_t(g.m_tiles) * g.n_tiles * p.groups * g.splits);
  if (g.splits == 1) {
    tp.out = p.y;
    tp.out_bf16 = p.y_bf16;
    tp.ld_out = p.ldy;
  } else {
    tp.split_stride = int64_t(n) * p.w.rows;
    tp.out = static_cast<float*>(ops.workspace(kWsGemmPartials, size_t(g.splits) * size_t(tp.split_stride) * 4));
    tp.ld_out = p.w.rows;
  }
  tp.w_scale = p.w.scale_f32;
  tp.w_scale_cols = p.w.scale_cols;
  tp.round_out = p.bf16_out && g.splits == 1;  // split partials stay fp32; the reduction rounds their sum

  const CUtensorMapDataType type = T::kFp8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUtensorMap x_map = operand_map(a.data, type, T::kElementBytes, n, p.groups * p.w.cols, T::kBlockM);
  const CUtensorMap w_map = operand_map(p.w.data, type, T::kElementBytes, p.w.rows, p.w.cols, T::kBlockN);
  // FP8: the x scales [K_total / 128, scale_ld] in boxes of one slice × kBlockM rows (rows past n read as 0).
  // BF16 kernels never read it: x_map fills the parameter.
  const CUtensorMap scale_map = T::kFp8 ? scale_map_of(a, n, p.groups * p.w.cols / kScaleBlock, T::kBlockM) : x_map;

  allow_dynamic_smem(reinterpret_cast<const void*>(gemm_tc_kernel<T>), S::kBytes);
  const int ctas = std::min(tp.tiles, ops.props().multiProcessorCount);  // one per SM (~192 KB of shared memory)
  gemm_tc_kernel<T><<<ctas, kThreads, S::kBytes, stream>>>(x_map, w_map, scale_map, tp);
  DSV4_LAUNCH_CHECK();

  if (g.splits > 1) {
    const ReduceParams rp{tp.out, g.splits, tp.split_stride, n, p.w.rows, p.y, p.y_bf16, p.ldy, p.bf16_out};
    launch_pdl(reduce_splits_kernel, dim3(grid_for(int64_t(n) * p.w.rows / 2, 256)), dim3(256), 0, stream,
               /*pdl=*/true, rp);  // this path runs on compute capability 9.x only
  }
}

}  // namespace

bool tc_covers(const GemmParams& p, const CudaOps& ops) {
  const DeviceWeight& w = p.w;
  if (ops.props().major != 9) return false;  // the wgmma and TMA kernels are built for sm_90a only
  const bool fp8 = w.format == WFormat::kFP8;
  if (w.format != WFormat::kBF16 && !fp8) return false;
  const int64_t out_per_group = w.rows / p.groups;
  if (w.cols % 128 != 0 || out_per_group % 2 != 0) return false;  // whole K slices; float2 stores
  if (p.ldy % 2 != 0 || reinterpret_cast<uintptr_t>(p.y) % 8 != 0 || reinterpret_cast<uintptr_t>(p.y_bf16) % 4 != 0)
    return false;
  if (reinterpret_cast<uintptr_t>(w.data) % 16 != 0) return false;  // TMA base alignment
  if (fp8 && (w.scale_f32 == nullptr || (p.groups > 1 && out_per_group % kScaleBlock != 0)))
    return false;  // an FP8 tile must sit inside one 128-row scale block
  // int32 TMA coordinates and tile numbers (tiles · splits, splits ≤ the SM count)
  return p.n <= (int64_t(1) << 30) && p.groups * w.cols <= (int64_t(1) << 30) && w.rows <= (int64_t(1) << 30) &&
         ceil_div(p.n, 128) * ceil_div(out_per_group, 128) * p.groups <= (int64_t(1) << 22);
}

TcActivations tc_round_activations(const GemmParams& p, CudaOps& ops) {
  const cudaStream_t stream = ops.stream();
  const int n = int(p.n);
  const int64_t k_total = p.groups * p.w.cols;
  const bool vector_loads = p.ldx % 4 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0;
  TcActivations a;
  if (p.w.format == WFormat::kFP8) {
    auto* xq = static_cast<uint8_t*>(ops.workspace(kWsGemmActivations, size_t(n) * size_t(k_total)));
    const int64_t ld = (n + 3) / 4 * 4;  // 16-byte rows: the GEMM copies a slice's scales by TMA
    auto* scale =
        static_cast<float*>(ops.workspace(kWsGemmActivationScales, size_t(ld) * size_t(k_total / kScaleBlock) * 4));
    const unsigned blocks = grid_for(int64_t(n) * (k_total / kScaleBlock) * 32, 256);
    if (vector_loads) quantize_e4m3_kernel<true><<<blocks, 256, 0, stream>>>(p.x, p.ldx, n, k_total, xq, scale, ld);
    else quantize_e4m3_kernel<false><<<blocks, 256, 0, stream>>>(p.x, p.ldx, n, k_total, xq, scale, ld);
    a.data = xq;
    a.scale = scale;
    a.scale_ld = ld;
  } else {
    auto* xb = static_cast<__nv_bfloat16*>(ops.workspace(kWsGemmActivations, size_t(n) * size_t(k_total) * 2));
    const unsigned blocks = grid_for(int64_t(n) * k_total / 8, 256);
    if (vector_loads) round_bf16_kernel<true><<<blocks, 256, 0, stream>>>(p.x, p.ldx, n, k_total, xb);
    else round_bf16_kernel<false><<<blocks, 256, 0, stream>>>(p.x, p.ldx, n, k_total, xb);
    a.data = xb;
  }
  DSV4_LAUNCH_CHECK();
  return a;
}

void tc_gemm(const GemmParams& p, const TcActivations& a, CudaOps& ops) {
  const int sms = ops.props().multiProcessorCount;
  if (p.w.format == WFormat::kFP8) {
    launch<Fp8Tiles>(p, a, grid_of<Fp8Tiles>(p, sms), ops);
    return;
  }
  // 256-wide tiles read the activations half as often and run faster per flop; 128-wide ones fill the GPU with
  // twice the tiles. Wide unless they leave more than half of the SMs idle, or the narrow ones take fewer
  // waves, counting a narrow wave as 0.55 of a wide one: half the work at a lower rate per flop (the
  // measurement behind the factor: docs/design/gemm.md).
  const Grid wide = grid_of<Bf16Tiles<256>>(p, sms);
  const int64_t wide_tiles = int64_t(wide.m_tiles) * wide.n_tiles * p.groups;
  const Grid narrow = grid_of<Bf16Tiles<128>>(p, sms);
  const int64_t narrow_tiles = int64_t(narrow.m_tiles) * narrow.n_tiles * p.groups;
  const bool wide_fills = 2 * wide_tiles > sms && 100 * ceil_div(wide_tiles, sms) <= 55 * ceil_div(narrow_tiles, sms);
  if (wide_tiles >= sms || wide_fills) launch<Bf16Tiles<256>>(p, a, wide, ops);
  else launch<Bf16Tiles<128>>(p, a, narrow, ops);
}

bool gemm_tensor_core(const GemmParams& p, CudaOps& ops) {
  const DeviceWeight& w = p.w;
  DSV4_CHECK(p.groups >= 1 && w.rows % p.groups == 0, "gemm_tensor_core: ", w.rows, " rows do not split into ",
             p.groups, " groups");
  DSV4_CHECK(p.ldx >= p.groups * w.cols && p.ldy >= w.rows, "gemm_tensor_core: row strides ", p.ldx, "/", p.ldy,
             " too small for [", w.rows, ", ", w.cols, "] × ", p.groups, " groups");
  DSV4_CHECK(p.n >= 0 && (p.n == 0 || (p.x && (p.y || p.y_bf16) && w.data)), "gemm_tensor_core: null operand");
  if (!tc_covers(p, ops)) return false;  // gemm_generic's
  if (p.n == 0) return true;
  tc_gemm(p, tc_round_activations(p, ops), ops);
  return true;
}

}  // namespace dsv4::cuda
