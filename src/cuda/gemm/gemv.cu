// gemm family, decode path: y = x · Wᵀ for n ≤ kGemvMaxRows activation rows. Memory-bound: every weight
// byte is read once, in 16-byte loads, decoded in registers; activations and accumulation are fp32.
// gemv() hands fast numerics' FP8 and BF16 products at 5 ≤ n ≤ 16 to the tensor-core kernels (gemv_mma.cu), the
// calls the streaming kernel covers (gemv_stream.cu: n ≤ 4, FP8 / BF16 / F32) to it; this file's staged kernel
// takes the rest (FP4, reference and exact numerics at 5 ≤ n ≤ 16, rows not a multiple of 4).
//
// NOTE: how the work is laid out.
//  * A unit is `rows_per_unit` consecutive output rows of one group, computed by one block over its K range.
//    The 8 warps form 8/WK row groups of WK warps; a thread owns R rows and walks K in 16-byte chunks, the
//    32·WK lanes of a row group interleaved (local chunk lc → lane lc mod 32·WK), so each warp load
//    instruction reads 512 contiguous bytes of a row. Loads are software-pipelined: the next chunk of R rows
//    (of this unit, else of the next) is in flight while the current one is used, and a stage's first
//    loads are issued before x is staged.
//  * x is staged in shared memory one K stage at a time, laid out [NB][Q][stage_chunks] in float4s
//    (Q = float4s per chunk) so the lanes' float4 reads are consecutive (conflict-free); a staged value
//    serves the R rows of a thread and every unit of the block.
//  * Each block walks a contiguous range of units (balanced to ±1 unit). When a matrix has too few rows to
//    fill the GPU, blocks of an sm_90 cluster split K further and reduce through distributed shared memory.
//  * Fast numerics (GemmParams::quant_x) act_quant the staged x in shared memory, one warp per (row, 128-column
//    block), before any unit reads it; stages and cluster slices then start on block boundaries.
//  * Reductions are deterministic and atomic-free: a warp butterfly reduce-scatter, then a fixed-order sum
//    over the WK warps (and cluster ranks) in shared memory. K stages after the first add into y; the same
//    thread writes the same output element every stage, so program order makes this safe.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>

#include "cuda/common/smem.h"
#include "cuda/common/check.h"
#include "cuda/common/cluster.cuh"
#include "cuda/common/dequant.cuh"
#include "cuda/common/fp_grid.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/gemm/gemm.h"
#include "cuda/gemm/gemv_decode.cuh"

namespace dsv4::cuda {

namespace {

using namespace gemv_detail;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxCluster = 8;      // portable cluster size
// Dynamic shared memory ceiling per block (x stage + partial sums). One stage holds x for K up to
// 24k columns at n = 1; larger n·K runs in several stages.
constexpr int kMaxSmemBytes = 96 * 1024;

// NB: activation rows per launch, 1, 2, 4 or 8; n = 9..16 runs as two launches (at n > 8 the kernel is
// FMA-bound, and 16 rows' accumulators do not fit the register budget).
constexpr int kMaxNb = 8;
// R: rows per thread; R·NB ≤ 32 (one value per lane after the reduce-scatter). With the software pipeline a
// thread holds 2·R chunks (8 registers each with the scale) besides R·NB accumulators; R = 4 keeps ~4–8
// loads in flight per thread and reuses each staged x value 4 times.
constexpr int rows_per_thread(WFormat f, int nb) {
  if (f == WFormat::kFP8) return nb <= 4 ? 4 : 2;
  if (f == WFormat::kFP4) return nb <= 2 ? 4 : 2;
  return 4;
}
// Register budget (65536 per SM / (256 threads · blocks)), chosen for no spills: 64 registers (32 warps per
// SM) for n = 1 with the light decodes, 80 (24 warps) with FP8, 128 (16 warps) for FP4 and larger n. Before
// sm_89 there is no e4m3 conversion instruction; the software decode gets 128 (sm_80 is the portable path,
// not the tuned one).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
constexpr int min_blocks_per_sm(WFormat, int) { return 2; }
#else
constexpr int min_blocks_per_sm(WFormat f, int nb) {
  return nb > 1 || f == WFormat::kFP4 ? 2 : f == WFormat::kFP8 ? 3 : 4;
}
#endif

struct GemvParams {
  const float* x = nullptr;  // [n, ldx]; group g reads columns g·in_g .. g·in_g + in_g
  int64_t ldx = 0;
  int x_aligned = 0;         // x and ldx allow 16-byte copies of 4 consecutive activations
  DeviceWeight w;            // [groups·out_g, in_g], rows a multiple of 16 bytes
  int n = 0;                 // ≤ NB
  float* y = nullptr;        // [n, ldy]
  int64_t ldy = 0;
  // Row and chunk counts fit in int (checked by the launcher); byte offsets are formed in 64 bits. 32-bit
  // bookkeeping keeps the kernels within their register budget.
  int out_g = 0;           // output rows per group
  int chunks = 0;          // 16-byte chunks per weight row
  int warps_per_row = 1;   // WK ∈ {1, 2, 4, 8}
  int units_per_group = 0;
  int units = 0;           // groups · units_per_group
  int slice_chunks = 0;    // K chunks per cluster rank
  int stage_chunks = 0;    // K chunks per shared-memory stage
  int stages = 0;          // ceil(slice_chunks / stage_chunks): the same for every rank
  bool quant_x = false, bf16_out = false;  // GemmParams' fast numerics
};

__device__ __forceinline__ void copy_async(float* dst, const float* src, int bytes16) {
  const uint32_t d = uint32_t(__cvta_generic_to_shared(dst));
  if (bytes16) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
  else
    for (int e = 0; e < 4; ++e)
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d + 4 * e), "l"(src + e) : "memory");
}

// Stages x[0..NB) for chunks [c0, c0 + len) of group g (rows ≥ n as zeros): float4 (i, q, lc) at
// xs[(i·Q + q)·stage_chunks + lc]. Asynchronous copies put every element in flight at once (one memory
// round trip per stage). FP4 kernels stage x · 2^14 (exact for |x| < 2^113), see fma_chunk; each thread
// scales the elements it copied. The caller's barrier publishes the stage.
template <WFormat F, int NB>
__device__ void stage_x(const GemvParams& p, float* xs, int g, int c0, int len) {
  constexpr int Q = elems_per_chunk(F) / 4;
  const int per_row = len * Q;  // float4s per activation row
  const float* src = p.x + int64_t(g) * p.w.cols + int64_t(c0) * Q * 4;
  for (int e = threadIdx.x; e < NB * per_row; e += kThreads) {
    const int i = e / per_row, f = e - i * per_row, lc = f / Q, q = f % Q;
    float* dst = xs + ((i * Q + q) * p.stage_chunks + lc) * 4;
    if (i < p.n) copy_async(dst, src + i * p.ldx + f * 4, p.x_aligned);
    else *reinterpret_cast<float4*>(dst) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  if constexpr (F == WFormat::kFP4) {
    if (p.quant_x) return;  // act_quant_stage scales its results
    for (int e = threadIdx.x; e < p.n * per_row; e += kThreads) {
      const int i = e / per_row, f = e - i * per_row;
      float4& v = reinterpret_cast<float4*>(xs)[(i * Q + f % Q) * p.stage_chunks + f / Q];
      v.x *= kE2m1Unscale;
      v.y *= kE2m1Unscale;
      v.z *= kE2m1Unscale;
      v.w *= kE2m1Unscale;
    }
  }
}


// act_quant of the staged x (after the barrier that publishes the stage; the caller's next barrier publishes
// the result): one warp per (row i < n, 128-column block of the stage), a float4 per lane. FP4 kernels' values
// are then scaled by 2^14 as stage_x would have.
template <WFormat F, int NB>
__device__ void act_quant_stage(const GemvParams& p, float* xs, int len) {
  constexpr int Q = elems_per_chunk(F) / 4, CB = 128 / elems_per_chunk(F);  // CB chunks per block: CB·Q = 32
  float4* xs4 = reinterpret_cast<float4*>(xs);
  const int blocks = (len + CB - 1) / CB, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q = lane % Q;
  for (int task = warp; task < p.n * blocks; task += kWarps) {
    const int i = task / blocks, lc = (task % blocks) * CB + lane / Q;
    float4* v = xs4 + (i * Q + q) * p.stage_chunks + lc;
    const float4 x = lc < len ? *v : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const int e = e4m3_block_exponent(warp_max_f32(abs_max4(x)));
    if (lc >= len) continue;
    float4 r = act_quant4(x, e);
    if constexpr (F == WFormat::kFP4) r = make_float4(r.x * kE2m1Unscale, r.y * kE2m1Unscale, r.z * kE2m1Unscale, r.w * kE2m1Unscale);
    *v = r;
  }
}

// acc[r][i] += Σ over one chunk of x[i, ·] · W[row r, ·]. wv: the chunk of each row, sc: its scale.
// x4 points at float4 (i = 0, q = 0) of the chunk; float4 (i, q) is x4[(i·Q + q)·q_stride].
// For NB ≤ 2 a group's x values are loaded once and each row is decoded and used in turn; for larger NB
// all R rows are decoded first and the NB activation rows stream past them (fewer live registers each way).
template <WFormat F, int NB, int R>
__device__ __forceinline__ void fma_chunk(const uint4 (&wv)[R], const float (&sc)[R], const float4* x4,
                                          int q_stride, float (&acc)[R][NB]) {
  constexpr int Q = elems_per_chunk(F) / 4, G = kGroup<F>, X = G / 4;  // X: x float4s per group
  // FP4: one chunk is exactly one 32-element scale block. x was staged × 2^14, so x' · (e2m1 · 2^−14) is
  // the product x · e2m1 exactly; for small NB the block sum is scaled once by s (a power of two: exact),
  // for larger NB (registers scarcer than multiplies) each weight is (e2m1 · 2^−14) · s.
  constexpr bool kBlockSum = F == WFormat::kFP4 && NB <= 2;
  float sum[R][NB];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < NB; ++i) sum[r][i] = kBlockSum ? 0.0f : acc[r][i];
#pragma unroll
  for (int j = 0; j < kGroupsPerChunk<F>; ++j) {
    if constexpr (NB <= 2) {
      float4 xv[NB][X];
#pragma unroll
      for (int i = 0; i < NB; ++i)
#pragma unroll
        for (int h = 0; h < X; ++h) xv[i][h] = x4[(i * Q + X * j + h) * q_stride];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float w[G];
        decode_group<F>(wv[r], (F == WFormat::kFP8 || F == WFormat::kFP4) && !kBlockSum ? sc[r] : 1.0f, j, w);
#pragma unroll
        for (int i = 0; i < NB; ++i)
#pragma unroll
          for (int h = 0; h < X; ++h) {
            sum[r][i] = fmaf(xv[i][h].x, w[4 * h], sum[r][i]);
            sum[r][i] = fmaf(xv[i][h].y, w[4 * h + 1], sum[r][i]);
            sum[r][i] = fmaf(xv[i][h].z, w[4 * h + 2], sum[r][i]);
            sum[r][i] = fmaf(xv[i][h].w, w[4 * h + 3], sum[r][i]);
          }
      }
    } else {
      float w[R][G];
#pragma unroll
      for (int r = 0; r < R; ++r) decode_group<F>(wv[r], F == WFormat::kFP8 || F == WFormat::kFP4 ? sc[r] : 1.0f, j, w[r]);
#pragma unroll
      for (int i = 0; i < NB; ++i)
#pragma unroll
        for (int h = 0; h < X; ++h) {
          const float4 xv = x4[(i * Q + X * j + h) * q_stride];
#pragma unroll
          for (int r = 0; r < R; ++r) {
            sum[r][i] = fmaf(xv.x, w[r][4 * h], sum[r][i]);
            sum[r][i] = fmaf(xv.y, w[r][4 * h + 1], sum[r][i]);
            sum[r][i] = fmaf(xv.z, w[r][4 * h + 2], sum[r][i]);
            sum[r][i] = fmaf(xv.w, w[r][4 * h + 3], sum[r][i]);
          }
        }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < NB; ++i) acc[r][i] = kBlockSum ? fmaf(sum[r][i], sc[r], acc[r][i]) : sum[r][i];
}

// Scale of (row, chunk c) for the block-scaled formats (1 otherwise).
template <WFormat F>
__device__ __forceinline__ float chunk_scale(const DeviceWeight& w, int row, int c) {
  if constexpr (F == WFormat::kFP8) return w.scale_f32[int64_t(row / 128) * w.scale_cols + c / 8];
  else if constexpr (F == WFormat::kFP4) return e8m0_bits_to_f32(w.scale_e8m0[int64_t(row) * w.scale_cols + c]);
  else return 1.0f;
}

// One 16-byte chunk of each of a thread's R rows, with its scale: the unit of loads in flight.
template <int R>
struct Batch {
  uint4 w[R];
  float s[R];
};

// Issues the loads of local chunk lc (< len) of rows row0 .. row0 + R (those below row_end).
template <WFormat F, int R>
__device__ __forceinline__ void load_batch(const GemvParams& p, int row0, int row_end, int c0, int lc, Batch<R>& b) {
  const int64_t row_bytes = p.w.row_bytes();
  const uint8_t* chunk = p.w.data + int64_t(row0) * row_bytes + int64_t(c0 + lc) * 16;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const bool live = row0 + r < row_end;
    b.w[r] = live ? load_streaming(chunk + r * row_bytes) : make_uint4(0, 0, 0, 0);
    b.s[r] = live ? chunk_scale<F>(p.w, row0 + r, c0 + lc) : 0.0f;
  }
}

// K stages add into y; the last one rounds the total in fast numerics.
__device__ __forceinline__ void write_output(const GemvParams& p, int row, int row_end, int i, float v,
                                             bool first_stage, bool last_stage) {
  if (i >= p.n || row >= row_end) return;
  float* dst = p.y + int64_t(i) * p.ldy + row;
  const float total = first_stage ? v : *dst + v;
  *dst = last_stage ? round_bf16_if(p.bf16_out, total) : total;
}

// Grid: (cluster ranks S, unit ranges). Dynamic shared memory: [2][kWarps][V] partial sums, then the x stage.
template <WFormat F, int NB>
__global__ void __launch_bounds__(kThreads, min_blocks_per_sm(F, NB)) gemv_kernel(GemvParams p) {
  constexpr int R = rows_per_thread(F, NB), V = R * NB, kSpread = 32 / V;
  extern __shared__ float4 smem4[];
  float* partials = reinterpret_cast<float*>(smem4);  // [2][kWarps][V]
  float* xs = partials + 2 * kWarps * V;              // V ≥ 4: stays 16-byte aligned
  const float4* xs4 = reinterpret_cast<const float4*>(xs);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int WK = p.warps_per_row, S = gridDim.x, rank = blockIdx.x;
  const int row_group = warp / WK, k_lane = (warp % WK) * 32 + lane, k_step = 32 * WK;
  const int rows_per_unit = (kWarps / WK) * R;
  const int u_begin = int(int64_t(blockIdx.y) * p.units / gridDim.y);
  const int u_end = int(int64_t(blockIdx.y + 1) * p.units / gridDim.y);
  const int slice0 = min(p.chunks, rank * p.slice_chunks), slice1 = min(p.chunks, slice0 + p.slice_chunks);
  const bool direct = WK == 1 && S == 1;  // each warp's reduce-scatter already yields final values
  int buf = 0;

  for (int u = u_begin; u < u_end;) {
    const int g = u / p.units_per_group, seg_end = min(u_end, (g + 1) * p.units_per_group);
    const int row_end = (g + 1) * p.out_g;
    for (int st = 0; st < p.stages; ++st) {
      const int c0 = min(slice1, slice0 + st * p.stage_chunks);
      const int len = min(slice1, c0 + p.stage_chunks) - c0;  // 0 for ranks past the end of K
      // Software pipeline: one batch is in flight while the previous one is used, across units, and the
      // first batch of a stage is issued before x is staged (weights do not depend on x).
      const int seg_row0 = g * p.out_g + (u - g * p.units_per_group) * rows_per_unit + row_group * R;
      Batch<R> cur;
      if (k_lane < len) load_batch<F, R>(p, seg_row0, row_end, c0, k_lane, cur);
      __syncthreads();  // every thread is done with the previous stage
      stage_x<F, NB>(p, xs, g, c0, len);
      __syncthreads();
      if (p.quant_x) {
        act_quant_stage<F, NB>(p, xs, len);
        __syncthreads();
      }
      for (int uu = u; uu < seg_end; ++uu) {
        const int unit_row0 = g * p.out_g + (uu - g * p.units_per_group) * rows_per_unit;
        const int row0 = unit_row0 + row_group * R;
        float acc[R][NB];
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int i = 0; i < NB; ++i) acc[r][i] = 0.0f;
        for (int lc = k_lane; lc < len; lc += k_step) {
          Batch<R> next;
          const bool more_here = lc + k_step < len, more_next = !more_here && uu + 1 < seg_end;
          if (more_here) load_batch<F, R>(p, row0, row_end, c0, lc + k_step, next);
          else if (more_next) load_batch<F, R>(p, row0 + rows_per_unit, row_end, c0, k_lane, next);
          fma_chunk<F, NB, R>(cur.w, cur.s, xs4 + lc, p.stage_chunks, acc);
          if (more_here || more_next) cur = next;
        }

        float flat[V];
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int i = 0; i < NB; ++i) flat[r * NB + i] = acc[r][i];
        const float total = warp_reduce_scatter<V>(flat, lane);
        const int v_index = lane / kSpread;
        const bool owner = lane % kSpread == 0;
        if (direct) {
          if (owner) write_output(p, row0 + v_index / NB, row_end, v_index % NB, total, st == 0, st == p.stages - 1);
          continue;
        }
        // Partials double-buffered: the barrier of unit u+1 orders unit u's reads before unit u+2's writes.
        float* part = partials + buf * kWarps * V;
        if (owner) part[warp * V + v_index] = total;
        cluster_barrier(S);
        const int outputs = (kWarps / WK) * V;  // ≤ kThreads
        const int o = threadIdx.x * S + rank;
        if (o < outputs) {
          const int rg = o / V, vi = o % V;
          float sum = 0.0f;
          for (int s = 0; s < S; ++s) {
            const float* src = cluster_shared(part, s, S);
            for (int wk = 0; wk < WK; ++wk) sum += src[(rg * WK + wk) * V + vi];
          }
          write_output(p, unit_row0 + rg * R + vi / NB, row_end, vi % NB, sum, st == 0, st == p.stages - 1);
        }
        buf ^= 1;
      }
    }
    u = seg_end;
  }
  if (S > 1) cluster_barrier(S);  // peers may still read this block's partials
}

int register_limited_blocks(const void* kernel) {
  int blocks = 0;
  DSV4_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, 0));
  return std::max(blocks, 1);
}

template <WFormat F, int NB>
void launch(const GemmParams& gp, cudaStream_t stream) {
  constexpr int E = elems_per_chunk(F), R = rows_per_thread(F, NB), V = R * NB;
  auto* kernel = gemv_kernel<F, NB>;
  static const int reg_blocks = register_limited_blocks(reinterpret_cast<const void*>(kernel));  // once per instantiation
  const DeviceInfo& dev = device_info();

  GemvParams p;
  p.x = gp.x;
  p.ldx = gp.ldx;
  p.x_aligned = reinterpret_cast<uintptr_t>(gp.x) % 16 == 0 && gp.ldx % 4 == 0;
  p.w = gp.w;
  p.n = int(gp.n);
  p.y = gp.y;
  p.ldy = gp.ldy;
  p.out_g = int(gp.w.rows / gp.groups);
  p.chunks = int(gp.w.cols / E);
  p.quant_x = gp.quant_x;
  p.bf16_out = gp.bf16_out;

  // Wider K sharing (WK, then clusters) only while there are too few units to give every block ≥ 2, and
  // every lane still gets a chunk of each row.
  constexpr int kPartialBytes = 2 * kWarps * V * int(sizeof(float));
  constexpr int kMaxStageChunks = (kMaxSmemBytes - kPartialBytes) / (NB * E * 4);
  const auto units_for = [&](int wk) { return int(gp.groups) * int(ceil_div(p.out_g, (kWarps / wk) * R)); };
  const auto smem_for = [&](int stage_chunks) { return kPartialBytes + NB * E * 4 * stage_chunks; };
  const int blocks_per_sm =
      std::max(1, std::min(reg_blocks, dev.smem_per_sm / (smem_for(std::min(p.chunks, kMaxStageChunks)) + 1024)));
  const int target = dev.sms * blocks_per_sm;
  int wk = 1;
  while (wk < kWarps && units_for(wk) < 2 * target && p.chunks >= 32 * 2 * wk) wk *= 2;
  int cluster = 1;
  if (dev.cc_major >= 9)
    while (cluster < kMaxCluster && units_for(wk) * cluster < target && p.chunks >= 32 * wk * 2 * cluster)
      cluster *= 2;
  p.warps_per_row = wk;
  p.units_per_group = int(ceil_div(p.out_g, (kWarps / wk) * R));
  p.units = int(gp.groups) * p.units_per_group;
  // act_quant needs whole 128-column blocks in every slice and stage (CB chunks each).
  constexpr int CB = 128 / E, kQuantStageChunks = kMaxStageChunks / CB * CB;
  const int align = gp.quant_x ? CB : 1, max_stage = gp.quant_x ? kQuantStageChunks : kMaxStageChunks;
  p.slice_chunks = int(ceil_div(ceil_div(p.chunks, cluster), align)) * align;
  p.stages = int(ceil_div(p.slice_chunks, max_stage));
  p.stage_chunks = int(ceil_div(ceil_div(p.slice_chunks, p.stages), align)) * align;
  const int smem = smem_for(p.stage_chunks);
  if (smem > 48 * 1024) allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);  // above the default limit

  // Units per block: as even as possible over at most one wave of blocks (≤ 65535 since target is).
  const int per_block = int(ceil_div(p.units, std::max(1, target / cluster)));
  const int blocks = int(ceil_div(p.units, per_block));
  const dim3 grid{unsigned(cluster), unsigned(blocks)};
  launch_pdl(kernel, grid, dim3(kThreads), size_t(smem), stream, /*pdl=*/false, p, cluster);
}

template <WFormat F>
void launch_format(const GemmParams& p, cudaStream_t stream) {
  for (int64_t first = 0; first < p.n; first += kMaxNb) {
    GemmParams part = p;
    part.x = p.x + first * p.ldx;
    part.y = p.y + first * p.ldy;
    part.n = std::min<int64_t>(kMaxNb, p.n - first);
    if (part.n == 1) launch<F, 1>(part, stream);
    else if (part.n == 2) launch<F, 2>(part, stream);
    else if (part.n <= 4) launch<F, 4>(part, stream);
    else launch<F, 8>(part, stream);
  }
}

}  // namespace

namespace gemv_detail {

const DeviceInfo& device_info() {
  static std::mutex mutex;
  static std::map<int, DeviceInfo> by_device;
  int dev = 0;
  DSV4_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, inserted] = by_device.try_emplace(dev);
  if (inserted) {
    DeviceInfo& d = it->second;
    DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev));
    DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&d.cc_major, cudaDevAttrComputeCapabilityMajor, dev));
    DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&d.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  }
  return it->second;
}

}  // namespace gemv_detail

GemvScratchSize gemv_scratch_size(const GemmParams& p) {
  return !mma_shape(p) && stream_covers(p) ? stream_scratch_size(p) : GemvScratchSize{};
}

bool gemv_pair_covers(const GemmParams& a, const GemmParams& b) {
  return mma_pair_covers(a, b) || stream_pair_covers(a, b);
}

GemvScratchSize gemv_pair_scratch_size(const GemmParams& a, const GemmParams& b) {
  return mma_pair_covers(a, b) ? GemvScratchSize{} : stream_scratch_size(a, &b);
}

void gemv_pair(const GemmParams& a, const GemmParams& b, const GemvScratch& scratch, cudaStream_t stream) {
  if (mma_pair_covers(a, b)) return gemv_detail::mma(a, stream, &b);
  DSV4_CHECK(stream_pair_covers(a, b), "gemv: the pair [", a.w.rows, ", ", a.w.cols, "] + [", b.w.rows, ", ",
             b.w.cols, "] does not take the streaming kernel");
  gemv_detail::stream(a, scratch, stream, &b);
}

void gemv(const GemmParams& p, const GemvScratch& scratch, cudaStream_t stream) {
  DSV4_CHECK(p.n >= 0 && p.n <= kGemvMaxRows, "gemv: ", p.n, " activation rows (1..", kGemvMaxRows, " supported)");
  DSV4_CHECK(p.groups >= 1 && p.w.rows % p.groups == 0, "gemv: ", p.w.rows, " rows do not split into ", p.groups,
             " groups");
  DSV4_CHECK(p.ldx >= p.groups * p.w.cols && p.ldy >= p.w.rows, "gemv: row strides ", p.ldx, "/", p.ldy,
             " too small for [", p.w.rows, ", ", p.w.cols, "] in ", p.groups, " groups");
  if (p.n == 0 || p.w.rows == 0) return;
  DSV4_CHECK(p.x && p.y && p.w.data && p.w.cols > 0, "gemv: missing operand for [", p.w.rows, ", ", p.w.cols, "]");
  DSV4_CHECK(p.w.rows < (int64_t(1) << 30) && p.w.cols < (int64_t(1) << 30), "gemv: weight [", p.w.rows, ", ",
             p.w.cols, "] too large for 32-bit row and chunk indices");
  if (mma_shape(p)) return gemv_detail::mma(p, stream);
  if (stream_covers(p)) {
    gemv_detail::stream(p, scratch, stream);
    return;
  }
  // 16-byte loads need 16-byte rows; the rare other shapes take the generic kernel.
  if (p.w.row_bytes() % 16 != 0 || reinterpret_cast<uintptr_t>(p.w.data) % 16 != 0) {
    gemm_generic(p, stream);
    return;
  }
  switch (p.w.format) {
    case WFormat::kF32: launch_format<WFormat::kF32>(p, stream); break;
    case WFormat::kBF16: launch_format<WFormat::kBF16>(p, stream); break;
    case WFormat::kFP8: launch_format<WFormat::kFP8>(p, stream); break;
    case WFormat::kFP4: launch_format<WFormat::kFP4>(p, stream); break;
  }
}

}  // namespace dsv4::cuda
