// gemm family, decode path for n ≤ 4 activation rows and FP8 / BF16 / F32 weights: the streaming GEMV.
//
// NOTE: why a second GEMV. At batch 1 the decode step's matrices (2–34 MB each, V4-Flash) must stream at
// HBM speed, and a kernel that stages x in shared memory first pays a memory round trip and a barrier
// before its first FMA; with 1–2 weight loads in flight per thread between barriers it stayed far below the
// copy bandwidth (docs/design/gemm.md). Here nothing waits for anything but the weights:
//  * A task is kRowsPerTask consecutive rows of one group × one K slice, owned by one warp. Its lanes
//    interleave over the slice's 16-byte chunks (each warp load reads 512 contiguous bytes of a row), and
//    every lane issues kUnroll × kRowsPerTask loads before the first use (~128 bytes in flight per lane).
//  * x is read with ordinary loads: the few KB a step multiplies stay in L1 / L2 and serve every warp; a
//    loaded x value serves the kRowsPerTask rows of the task.
//  * Two matrices of one format and width that multiply the same x (a projection pair) run as one launch:
//    their row tiles in one task space, so the pair pays one launch, one ramp-up and one tail.
//  * Fast numerics act_quant x for FP8 weights in the kernel (kQuant): the 8 lanes that hold one 128-column
//    block of x (8 chunks of 16) find its amax by 3 shuffles, and each lane rounds the values it uses. K slices
//    then start on block boundaries. Where x's producer act_quant'ed it already (GemmParams::x_codes), the lanes
//    read its codes and scales instead (kCodes): 16 bytes per chunk, not 64, and no shuffles.
//  * Rows too few to occupy the GPU split K (tasks = row tiles × splits). Split partial sums go to scratch;
//    the warp that completes a row tile last (an arrival counter per tile, fenced like the classic threadfence
//    reduction) adds them in split order and resets the counter. No float atomics: results are the same
//    every run, and the same as the staged kernel's up to the order of fp32 additions.
#include <algorithm>
#include <cstdint>

#include "cuda/common/check.h"
#include "cuda/common/fp_grid.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/gemm/gemm.h"
#include "cuda/gemm/gemv_decode.cuh"

namespace dsv4::cuda {

namespace {

using namespace gemv_detail;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsPerTask = 4;  // divides 128: a task's rows share their FP8 scale row
constexpr int kUnroll = 2;       // chunk columns per lane loaded before use
constexpr int kQuantChunks = 8;  // FP8 chunks per 128-column act_quant block
// Register budget (65536 / (256 threads · blocks)): 85 per thread at n = 1, 128 for the accumulators and
// activations of n = 2 and 4 (fewer warps, each with more loads in flight).
constexpr int blocks_per_sm(int nb) { return nb == 1 ? 3 : 2; }

struct StreamParams {
  const float* x = nullptr;  // [n, ldx]; group g reads columns g·in_g .. g·in_g + in_g
  int64_t ldx = 0;
  DeviceWeight w;            // [groups·out_g, in_g]
  int n = 0;                 // ≤ NB
  float* y = nullptr;        // [n, ldy]
  int64_t ldy = 0;
  int out_g = 0;             // rows per group, a multiple of kRowsPerTask
  // A pair: the second matrix (w's format and width, one group each) follows w's rows in the task space.
  const uint8_t* data_b = nullptr;
  const float* scale_b = nullptr;
  float* y_b = nullptr;
  int64_t ldy_b = 0;
  int rows_a = 0, rows = 0;  // rows of w; of w and the second matrix together
  int chunks = 0;            // 16-byte chunks per weight row
  int splits = 1, slice_chunks = 0;  // task (tile, s) covers chunks [s·slice_chunks, (s+1)·slice_chunks)
  int tiles = 0, tasks = 0;  // tiles = rows / kRowsPerTask, tasks = tiles · splits
  float* partials = nullptr;   // [splits, n, rows] when splits > 1
  int32_t* arrivals = nullptr;  // [tiles], zero between calls
  bool bf16_out = false;        // GemmParams::bf16_out (quant_x is the kernel's kQuant)
  const uint8_t* codes = nullptr;  // GemmParams::x_codes (the kernel's kCodes): [n, w.cols], one group
  const float* code_scale = nullptr;
  int64_t code_scale_ld = 0;
};

template <WFormat F>
__device__ __forceinline__ float tile_scale(const float* scale, int64_t scale_cols, int row0, int c) {
  if constexpr (F == WFormat::kFP8) return scale[int64_t(row0 / 128) * scale_cols + c / 8];
  else return 1.0f;
}

// The act_quant exponent of each x row's 128-column block holding chunk xc (FP8: 16 columns), over the 8 lanes
// that hold the block's chunks (the whole warp calls; `live` = this lane's chunk exists, else it adds 0).
template <int NB>
__device__ __forceinline__ void block_exponents(const float* xc, int64_t ldx, int n, bool live, int (&e)[NB]) {
#pragma unroll
  for (int i = 0; i < NB; ++i) {
    float amax = 0.0f;
    if (live && i < n)
#pragma unroll
      for (int j = 0; j < 4; ++j) amax = fmaxf(amax, abs_max4(__ldg(reinterpret_cast<const float4*>(xc + i * ldx) + j)));
#pragma unroll
    for (int offset = 1; offset < kQuantChunks; offset *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
    e[i] = e4m3_block_exponent(amax);
  }
}

// acc[r][i] += x[i] · W[row0 + r] over K group j of a chunk column: the task's rows' decoded weights times the
// group's four activations of each x row (xv), in one fixed order.
template <WFormat F, int NB>
__device__ __forceinline__ void fma_group(const uint4 (&wv)[kRowsPerTask], float scale, int j, const float4 (&xv)[NB],
                                          float (&acc)[kRowsPerTask][NB]) {
#pragma unroll
  for (int r = 0; r < kRowsPerTask; ++r) {
    float w[4];
    decode_group<F>(wv[r], scale, j, w);
#pragma unroll
    for (int i = 0; i < NB; ++i) {
      acc[r][i] = fmaf(xv[i].x, w[0], acc[r][i]);
      acc[r][i] = fmaf(xv[i].y, w[1], acc[r][i]);
      acc[r][i] = fmaf(xv[i].z, w[2], acc[r][i]);
      acc[r][i] = fmaf(xv[i].w, w[3], acc[r][i]);
    }
  }
}

// acc[r][i] += x[i, chunk c] · W[row0 + r, chunk c] for the kRowsPerTask rows of one chunk column; kQuant: x
// act_quant'ed with the exponents e.
template <WFormat F, int NB, bool kQuant>
__device__ __forceinline__ void fma_column(const uint4 (&wv)[kRowsPerTask], float scale, const float* xc,
                                           int64_t ldx, int n, const int (&e)[NB], float (&acc)[kRowsPerTask][NB]) {
#pragma unroll
  for (int j = 0; j < kGroupsPerChunk<F>; ++j) {
    float4 xv[NB];
#pragma unroll
    for (int i = 0; i < NB; ++i) {
      xv[i] = i < n ? __ldg(reinterpret_cast<const float4*>(xc + i * ldx) + j) : make_float4(0.f, 0.f, 0.f, 0.f);
      if constexpr (kQuant) xv[i] = act_quant4(xv[i], e[i]);
    }
    fma_group<F, NB>(wv, scale, j, xv, acc);
  }
}

// fma_column for x act_quant'ed already (kCodes, FP8 weights): chunk column c's 16 codes of each row (one 16-byte
// load at xc + i·ldc) times the row's block scale (sc[i]): the values act_quant4 computes, in the same order.
template <int NB>
__device__ __forceinline__ void fma_codes(const uint4 (&wv)[kRowsPerTask], float scale, const uint8_t* xc, int64_t ldc,
                                          const float* sc, int n, float (&acc)[kRowsPerTask][NB]) {
  uint4 code[NB];
  float s[NB];
#pragma unroll
  for (int i = 0; i < NB; ++i) {
    code[i] = i < n ? __ldg(reinterpret_cast<const uint4*>(xc + i * ldc)) : make_uint4(0, 0, 0, 0);
    s[i] = i < n ? __ldg(sc + i) : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kGroupsPerChunk<WFormat::kFP8>; ++j) {
    float4 xv[NB];
#pragma unroll
    for (int i = 0; i < NB; ++i) {
      const uint32_t u = word(code[i], j);
      const float2 a = e4m3x2_to_float2(u), b = e4m3x2_to_float2(u >> 16);
      xv[i] = make_float4(a.x * s[i], a.y * s[i], b.x * s[i], b.y * s[i]);
    }
    fma_group<WFormat::kFP8, NB>(wv, scale, j, xv, acc);
  }
}

// Programmatic dependent launch: the first weight loads are issued before waiting for the predecessor
// (weights are constants; x, y and the scratch are not), so they overlap its tail.
template <int NB>
__device__ __forceinline__ void wait_once(bool& waited) {
  if (!waited) {
    pdl_wait(blocks_per_sm(NB));  // the launch bounds hold that many blocks per SM
    waited = true;
  }
}

// Grid: ceil(tasks / kWarps) blocks; warp-global index = task. The chunk loop's trip count is uniform per warp
// (the block exponents' shuffles need every lane); lanes past the slice's end load and add nothing.
template <WFormat F, int NB, bool kQuant, bool kCodes = false>
__global__ void __launch_bounds__(kThreads, blocks_per_sm(NB)) gemv_stream_kernel(StreamParams p) {
  static_assert(!kQuant || F == WFormat::kFP8, "act_quant is for FP8 weights");
  static_assert(!kCodes || (F == WFormat::kFP8 && !kQuant), "codes are act_quant'ed x for FP8 weights");
  constexpr int E = elems_per_chunk(F), V = kRowsPerTask * NB, kSpread = 32 / V;
  const int lane = int(threadIdx.x % 32);
  const int warps = int(gridDim.x) * kWarps;
  const int64_t row_bytes = p.w.row_bytes();
  bool waited = false;
  for (int task = int(blockIdx.x) * kWarps + int(threadIdx.x / 32); task < p.tasks; task += warps) {
    const int tile = task / p.splits, s = task - tile * p.splits;
    const int row0 = tile * kRowsPerTask;  // in the task space: partials and arrivals
    // The tile's matrix (the pair's second past rows_a) and its rows there.
    const bool second = row0 >= p.rows_a;
    const int mrow0 = second ? row0 - p.rows_a : row0;
    const float* scale = second ? p.scale_b : p.w.scale_f32;
    const float* xg = p.x + int64_t(mrow0 / p.out_g) * p.w.cols;
    const int c_end = min(p.chunks, (s + 1) * p.slice_chunks);
    const uint8_t* rows = (second ? p.data_b : p.w.data) + int64_t(mrow0) * row_bytes;

    float acc[kRowsPerTask][NB];
#pragma unroll
    for (int r = 0; r < kRowsPerTask; ++r)
#pragma unroll
      for (int i = 0; i < NB; ++i) acc[r][i] = 0.0f;
    for (int c = s * p.slice_chunks + lane; c - lane < c_end; c += 32 * kUnroll) {
      uint4 wv[kUnroll][kRowsPerTask];
      float wscale[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int cu = c + 32 * u;
        const bool live = cu < c_end;
#pragma unroll
        for (int r = 0; r < kRowsPerTask; ++r)
          wv[u][r] = live ? load_streaming(rows + r * row_bytes + int64_t(cu) * 16) : make_uint4(0, 0, 0, 0);
        wscale[u] = live ? tile_scale<F>(scale, p.w.scale_cols, mrow0, cu) : 0.0f;
      }
      wait_once<NB>(waited);  // the weights are in flight: now wait for the kernel that wrote x
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int cu = c + 32 * u;
        if constexpr (kCodes) {
          if (cu < c_end)
            fma_codes<NB>(wv[u], wscale[u], p.codes + int64_t(cu) * E, p.w.cols,
                          p.code_scale + int64_t(cu / kQuantChunks) * p.code_scale_ld, p.n, acc);
          continue;
        }
        int e[NB] = {};
        if constexpr (kQuant) block_exponents<NB>(xg + int64_t(cu) * E, p.ldx, p.n, cu < c_end, e);
        if (cu < c_end) fma_column<F, NB, kQuant>(wv[u], wscale[u], xg + int64_t(cu) * E, p.ldx, p.n, e, acc);
      }
    }
    wait_once<NB>(waited);  // before any write (lanes without a chunk skipped the loop)

    float flat[V];
#pragma unroll
    for (int r = 0; r < kRowsPerTask; ++r)
#pragma unroll
      for (int i = 0; i < NB; ++i) flat[r * NB + i] = acc[r][i];
    const float total = warp_reduce_scatter<V>(flat, lane);
    const int v = lane / kSpread, r = v / NB, i = v % NB;
    const bool owner = lane % kSpread == 0 && i < p.n;
    const int64_t rows_total = p.rows;
    float* y = second ? p.y_b : p.y;
    const int64_t ldy = second ? p.ldy_b : p.ldy;
    if (p.splits == 1) {
      if (owner) y[i * ldy + mrow0 + r] = round_bf16_if(p.bf16_out, total);
      continue;
    }
    if (owner) p.partials[(int64_t(s) * p.n + i) * rows_total + row0 + r] = total;
    __threadfence();  // each owner's partial is visible device-wide before the arrival is counted
    __syncwarp();
    int last = 0;
    if (lane == 0) last = atomicAdd(&p.arrivals[tile], 1) == p.splits - 1;
    if (!__shfl_sync(0xFFFFFFFFu, last, 0)) continue;
    __threadfence();  // the other splits' partials are read after their arrivals
    if (owner) {
      float sum = 0.0f;
      for (int k = 0; k < p.splits; ++k) sum += __ldcg(p.partials + (int64_t(k) * p.n + i) * rows_total + row0 + r);
      y[i * ldy + mrow0 + r] = round_bf16_if(p.bf16_out, sum);
    }
    if (lane == 0) p.arrivals[tile] = 0;  // ready for the next call (stream order publishes it)
  }
}

// The launch shape of a covered call. A matrix with fewer row tiles than one wave of resident warps splits K
// into as many slices as still fit that wave (every warp then streams one task, all at once: no tail), each
// slice keeping at least one full unrolled sweep of the lanes; larger matrices run in several waves.
StreamParams plan(const GemmParams& gp, const GemmParams* second = nullptr) {
  StreamParams p;
  p.x = gp.x;
  p.ldx = gp.ldx;
  p.w = gp.w;
  p.n = int(gp.n);
  p.y = gp.y;
  p.ldy = gp.ldy;
  p.bf16_out = gp.bf16_out;
  if (gp.quant_x && gp.x_codes) {
    p.codes = gp.x_codes;
    p.code_scale = gp.x_scales;
    p.code_scale_ld = gp.x_scale_ld;
  }
  p.rows_a = p.rows = int(gp.w.rows);
  p.out_g = int(gp.w.rows / gp.groups);
  if (second) {
    p.data_b = second->w.data;
    p.scale_b = second->w.scale_f32;
    p.y_b = second->y;
    p.ldy_b = second->ldy;
    p.rows += int(second->w.rows);
    p.out_g = p.rows;  // one group each: every tile reads x from column 0
  }
  p.chunks = int(gp.w.row_bytes() / 16);
  p.tiles = p.rows / kRowsPerTask;
  const int wave = device_info().sms * blocks_per_sm(p.n) * kWarps;
  if (p.tiles < wave) p.splits = std::max(1, std::min(wave / p.tiles, p.chunks / (32 * kUnroll)));
  p.slice_chunks = int(ceil_div(p.chunks, p.splits));
  if (gp.quant_x) {  // slices of whole act_quant blocks
    p.slice_chunks = int(ceil_div(p.slice_chunks, kQuantChunks)) * kQuantChunks;
    p.splits = int(ceil_div(p.chunks, p.slice_chunks));
  }
  p.tasks = p.tiles * p.splits;
  return p;
}

template <WFormat F, bool kQuant = false, bool kCodes = false>
void launch(const StreamParams& p, bool pdl, cudaStream_t stream) {
  const dim3 blocks(unsigned(ceil_div(p.tasks, kWarps)));
  switch (p.n) {
    case 1: launch_pdl(gemv_stream_kernel<F, 1, kQuant, kCodes>, blocks, dim3(kThreads), 0, stream, pdl, p); break;
    case 2: launch_pdl(gemv_stream_kernel<F, 2, kQuant, kCodes>, blocks, dim3(kThreads), 0, stream, pdl, p); break;
    default: launch_pdl(gemv_stream_kernel<F, 4, kQuant, kCodes>, blocks, dim3(kThreads), 0, stream, pdl, p); break;
  }
}

}  // namespace

namespace gemv_detail {

bool stream_covers(const GemmParams& p) {
  const bool format = p.w.format == WFormat::kFP8 || p.w.format == WFormat::kBF16 || p.w.format == WFormat::kF32;
  const int64_t out_g = p.w.rows / p.groups;
  return format && p.n >= 1 && p.n <= kStreamMaxRows && out_g % kRowsPerTask == 0 && p.w.row_bytes() % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.w.data) % 16 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0 &&
         p.ldx % 4 == 0 && p.w.cols % 4 == 0 && p.w.rows / kRowsPerTask * 4 < (int64_t(1) << 31) &&
         (!p.x_codes || (p.quant_x && p.groups == 1 && p.w.cols % 128 == 0 &&
                         reinterpret_cast<uintptr_t>(p.x_codes) % 16 == 0));
}

bool stream_pair_covers(const GemmParams& a, const GemmParams& b) {
  return stream_covers(a) && stream_covers(b) && a.groups == 1 && b.groups == 1 && a.x == b.x && a.ldx == b.ldx &&
         a.x_codes == b.x_codes &&
         a.n == b.n && a.w.format == b.w.format && a.w.cols == b.w.cols && a.quant_x == b.quant_x &&
         a.bf16_out == b.bf16_out &&
         (a.w.rows + b.w.rows) / kRowsPerTask * 4 < (int64_t(1) << 31);
}

GemvScratchSize stream_scratch_size(const GemmParams& p, const GemmParams* second) {
  const StreamParams s = plan(p, second);
  if (s.splits == 1) return {};
  return {size_t(s.splits) * size_t(p.n) * size_t(s.rows), size_t(s.tiles)};
}

void stream(const GemmParams& gp, const GemvScratch& scratch, cudaStream_t stream, const GemmParams* second) {
  StreamParams p = plan(gp, second);
  if (p.splits > 1) {
    DSV4_CHECK(scratch.partials && scratch.arrivals &&
                   scratch.partial_floats >= size_t(p.splits) * size_t(p.n) * size_t(p.rows) &&
                   scratch.arrival_count >= size_t(p.tiles),
               "gemv: split-K scratch too small for [", p.rows, ", ", gp.w.cols, "] in ", p.splits, " splits");
    p.partials = scratch.partials;
    p.arrivals = scratch.arrivals;
  }
  const bool pdl = device_info().cc_major >= 9;
  switch (gp.w.format) {
    case WFormat::kFP8:
      if (p.codes) launch<WFormat::kFP8, false, true>(p, pdl, stream);
      else if (gp.quant_x) launch<WFormat::kFP8, true>(p, pdl, stream);
      else launch<WFormat::kFP8>(p, pdl, stream);
      break;
    case WFormat::kBF16: launch<WFormat::kBF16>(p, pdl, stream); break;
    default: launch<WFormat::kF32>(p, pdl, stream); break;
  }
}

}  // namespace gemv_detail

}  // namespace dsv4::cuda
