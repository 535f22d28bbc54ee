// moe family (CUDA): the expert kernels. Both walk the plan's chunks (≤ kChunk pairs of one expert) ×
// output row blocks as work items on a persistent grid (shared_items, routed_items). A block stages its
// chunk's activation rows in shared memory once per chunk change; its warps then stream the expert's rows with 16-byte loads and decode in registers, so every
// selected expert's weights are read once per chunk. FP4 and FP8 matrices go through the tensor cores
// (weight_mma.cuh: the 8 warps split K, partial tiles summed in a fixed order; matrices of whole 16-row tiles
// stored in its MMA tile order, where a warp load reads 512 contiguous bytes); BF16 and F32 ones, and FP4
// blocks with scales outside the fp16 window, through fp32 FMAs (weight_dot.cuh: a warp owns whole rows).
//   expert_up:   h[pair] = silu(min(w1·x, L)) · clamp(w3·x, −L, L) · weight     (rows of w1 and w3 together)
//   expert_down: y[pair] = w2 · h[pair]; the block that completes an output row block last (a per-block
//                arrival counter) sums that block's rows into out in the CPU's order: the token's experts
//                ascending, then the shared expert. No float atomics: the result is the same every run.
#include "cuda/moe/moe_kernels.h"
#include "cuda/moe/weight_mma.cuh"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

namespace dsv4::cuda::moe {

namespace {

constexpr int kExpertThreads = kExpertWarps * 32;

struct Chunk {
  int pair0, count, expert;  // expert −1 = shared
};

__device__ Chunk chunk_at(const Plan& plan, int c) {
  return {plan.chunk_pair[c], plan.chunk_count[c], plan.chunk_expert[c]};
}

// The shared expert's chunk c (of ceil(n / kChunk)): known without the plan (pairs P + t, t = token).
__device__ Chunk shared_chunk(const ExpertParams& p, int c) {
  return {int(p.n * p.k) + c * kChunk, int(std::min<int64_t>(kChunk, p.n - int64_t(c) * kChunk)), -1};
}

// Runs item (chunk c, row block b): stage(chunk) when the block's staged chunk changes, run(chunk, b), a
// barrier. `staged` is the block's currently staged chunk.
template <class Stage, class Run>
__device__ void run_item(int c, int64_t b, const Chunk& chunk, int& staged, Stage& stage, Run& run) {
  if (c != staged) {  // the previous item ended with a barrier: nobody reads the staged rows any more
    stage(chunk);
    staged = c;
    __syncthreads();
  }
  run(chunk, b);
  __syncthreads();
}

// Items c·row_blocks + b. The shared expert's chunks (the plan's first ceil(n / kChunk), known without it) go
// round-robin over the blocks; the routed chunks' items are split into equal contiguous ranges, so a block
// keeps its staged rows over consecutive items and its schedule needs no counter. after(b) follows every
// item and must contain a barrier if it uses shared memory.
template <class Stage, class Run, class After>
__device__ void shared_items(const ExpertParams& p, int& staged, Stage& stage, Run& run, After& after) {
  const int row_blocks = int(p.row_blocks);  // item counts fit in 32 bits (launch_expert_* check)
  const int items = int((p.n + kChunk - 1) / kChunk) * row_blocks;
  for (int item = int(blockIdx.x); item < items; item += int(gridDim.x)) {
    const int c = item / row_blocks, b = item - c * row_blocks;
    run_item(c, b, shared_chunk(p, c), staged, stage, run);
    after(b);
  }
}

template <class Stage, class Run, class After>
__device__ void routed_items(const ExpertParams& p, int& staged, Stage& stage, Run& run, After& after) {
  const int row_blocks = int(p.row_blocks);
  const int first = int((p.n + kChunk - 1) / kChunk);
  const int items = (p.plan.counters[0] - first) * row_blocks;
  const int begin = int(int64_t(items) * blockIdx.x / gridDim.x), end = int(int64_t(items) * (blockIdx.x + 1) / gridDim.x);
  int loaded = -1;
  Chunk chunk{};
  for (int item = begin; item < end; ++item) {
    const int c = first + item / row_blocks, b = item % row_blocks;
    if (c != loaded) {
      chunk = chunk_at(p.plan, c);
      loaded = c;
    }
    run_item(c, b, chunk, staged, stage, run);
    after(b);
  }
}

// Shared memory of the expert kernels besides the staged rows.
struct Scratch {
  int shift[kChunk];                                  // tensor-core staging: x·2^shift per staged row
  float block_max[kChunk * kExpertWarps];             // its block reduction
  float tiles[kExpertWarps][2][kMmaRows][kMmaCols];   // tensor-core partial tiles: [warp][tile][row][token, half]
};

__device__ float swiglu(float g, float u, float limit, float weight) {
  if (limit > 0.0f) {  // the CPU's std::min / std::clamp, NaN handling included
    g = limit < g ? limit : g;
    u = u < -limit ? -limit : (limit < u ? limit : u);
  }
  return g / (1.0f + expf(-g)) * u * weight;
}

// Stages the chunk's rows (row m of the chunk is src row row_index(m)) in the layout `format` reads.
template <bool kTensorCoresOnly, class RowIndex>
__device__ void stage_chunk(const MatFormat& format, const float* src, int64_t cols, const Chunk& chunk,
                            RowIndex row_index, float4* smem, Scratch& scratch) {
  const int rows = rows_for(chunk.count);
  if (format.tensor_cores) {
    uint4* xs = reinterpret_cast<uint4*>(smem);
    if (format.format == WFormat::kFP4)
      stage_rows_mma<WFormat::kFP4>(src, cols, chunk.count, rows, row_index, xs, scratch.shift, scratch.block_max);
    else
      stage_rows_mma<WFormat::kFP8>(src, cols, chunk.count, rows, row_index, xs, scratch.shift, scratch.block_max);
  } else if constexpr (!kTensorCoresOnly) {
    stage_rows(src, cols, chunk.count, rows, row_index, reinterpret_cast<float*>(smem));
  }
}

// The item's NT tiles of 16 rows through the tensor cores, the block's warps splitting K into equal group
// ranges; leaves each warp's partial tiles in scratch.tiles (then a barrier).
template <WFormat F, int NT>
__device__ void tiles_mma(const MatView (&mats)[NT], const int64_t (&row0)[NT], const int (&rows_valid)[NT],
                          int64_t cols, const Chunk& chunk, const float4* smem, Scratch& scratch) {
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const int64_t groups = (cols + kGroupCols<F> - 1) / kGroupCols<F>;
  float acc[NT][4];
  warp_mma<F, NT>(mats, row0, rows_valid, cols, groups * warp / kExpertWarps, groups * (warp + 1) / kExpertWarps,
                  reinterpret_cast<const uint4*>(smem), mma_stride16<F>(cols), chunk.count, acc);
  const int g = lane / 4, c = lane % 4;
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    scratch.tiles[warp][i][g][2 * c] = acc[i][0];
    scratch.tiles[warp][i][g][2 * c + 1] = acc[i][1];
    scratch.tiles[warp][i][g + 8][2 * c] = acc[i][2];
    scratch.tiles[warp][i][g + 8][2 * c + 1] = acc[i][3];
  }
  __syncthreads();
}

// Tile i's (row r, token m) in x's units: the warps' hi and lo partial sums in a fixed order, the staging shift
// (and the FP4 offset) divided out.
template <WFormat F>
__device__ float tile_sum(const Scratch& scratch, int i, int r, int m) {
  float hi = 0.0f, lo = 0.0f;
  for (int w = 0; w < kExpertWarps; ++w) {
    hi += scratch.tiles[w][i][r][2 * m];
    lo += scratch.tiles[w][i][r][2 * m + 1];
  }
  return ldexpf(hi + lo, -(scratch.shift[m] + (F == WFormat::kFP4 ? kFp4Offset : 0)));
}

// ---- expert_up: items of kUpRowsPerItem rows of w1 and w3

template <WFormat F>
__device__ void up_item_mma(const ExpertParams& p, const MatView (&mats)[2], const Chunk& chunk, int64_t block,
                            const float4* smem, Scratch& scratch) {
  static_assert(kUpRowsPerItem == kMmaRows, "an item is one tile of w1 and one of w3");
  const int64_t row0 = block * kUpRowsPerItem;
  const int rows_valid = int(std::min<int64_t>(kUpRowsPerItem, p.I - row0));
  tiles_mma<F, 2>(mats, {row0, row0}, {rows_valid, rows_valid}, p.D, chunk, smem, scratch);
  const int r = int(threadIdx.x) / kChunk, m = int(threadIdx.x) % kChunk;
  if (r < rows_valid && m < chunk.count) {
    const int pair = chunk.pair0 + m;
    const float weight = chunk.expert < 0 ? 1.0f : p.plan.pair_weight[pair];  // shared: may run before route ends
    p.plan.h[int64_t(pair) * p.I + row0 + r] =
        swiglu(tile_sum<F>(scratch, 0, r, m), tile_sum<F>(scratch, 1, r, m), p.swiglu_limit, weight);
  }
}

template <WFormat F, int MC>
__device__ void up_item_fma(const ExpertParams& p, const MatView (&mats)[2], bool aligned, const Chunk& chunk,
                            int64_t block, const float* xs) {
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const int64_t row0 = block * kUpRowsPerItem + warp * kUpRowsPerWarp;
  if (row0 >= p.I) return;
  const int rows_valid = int(std::min<int64_t>(kUpRowsPerWarp, p.I - row0));
  float acc[2][kUpRowsPerWarp][MC];
  warp_dot<F, 2, kUpRowsPerWarp, MC>(mats, row0, rows_valid, 0, chunks_per_row<F>(p.D), aligned, xs,
                                     staged_stride(p.D), acc);
  warp_sum(acc);
#pragma unroll
  for (int r = 0; r < kUpRowsPerWarp; ++r)
#pragma unroll
    for (int m = 0; m < MC; ++m)
      if (lane == r * MC + m && m < chunk.count && r < rows_valid) {
        const int pair = chunk.pair0 + m;
        const float weight = chunk.expert < 0 ? 1.0f : p.plan.pair_weight[pair];  // as up_item_mma
        p.plan.h[int64_t(pair) * p.I + row0 + r] = swiglu(acc[0][r][m], acc[1][r][m], p.swiglu_limit, weight);
      }
}

template <WFormat F>
__device__ void up_item_fma_any_rows(const ExpertParams& p, const MatView (&mats)[2], bool aligned,
                                     const Chunk& chunk, int64_t block, const float* xs) {
  switch (rows_for(chunk.count)) {
    case 1: up_item_fma<F, 1>(p, mats, aligned, chunk, block, xs); break;
    case 2: up_item_fma<F, 2>(p, mats, aligned, chunk, block, xs); break;
    default: up_item_fma<F, kChunk>(p, mats, aligned, chunk, block, xs); break;
  }
}

// Persistent grid; dynamic smem: staged_rows rows of the larger of the two staging layouts.
template <bool kTensorCoresOnly>
__global__ void __launch_bounds__(kExpertThreads, 2) expert_up_kernel(ExpertParams p) {
  extern __shared__ float4 smem_up[];
  __shared__ Scratch scratch;
  const auto format_of = [&](const Chunk& chunk) -> const MatFormat& {
    return chunk.expert < 0 ? p.shared_up : p.routed_up;
  };
  const int shared_pair0 = int(p.n * p.k);  // the shared expert's pairs: token t at P + t
  const auto stage = [&](const Chunk& chunk) {
    stage_chunk<kTensorCoresOnly>(
        format_of(chunk), p.x, p.D, chunk,
        [&](int m) { return chunk.expert < 0 ? chunk.pair0 + m - shared_pair0 : p.plan.pair_token[chunk.pair0 + m]; },
        smem_up, scratch);
  };
  const auto run = [&](const Chunk& chunk, int64_t block) {
    MatView mats[2];
    if (chunk.expert < 0) {
      mats[0] = p.shared_w1;
      mats[1] = p.shared_w3;
    } else {
      const ExpertPtrs e = p.experts[chunk.expert];
      mats[0] = {e.w1, e.s1, p.routed_up.row_bytes, p.routed_up.scale_cols, p.routed_up.tiled};
      mats[1] = {e.w3, e.s3, p.routed_up.row_bytes, p.routed_up.scale_cols, p.routed_up.tiled};
    }
    const MatFormat& format = format_of(chunk);
    if (format.tensor_cores) {
      if (format.format == WFormat::kFP4) up_item_mma<WFormat::kFP4>(p, mats, chunk, block, smem_up, scratch);
      else up_item_mma<WFormat::kFP8>(p, mats, chunk, block, smem_up, scratch);
    } else if constexpr (!kTensorCoresOnly) {
      const float* xs = reinterpret_cast<const float*>(smem_up);
      switch (format.format) {
        case WFormat::kFP4: up_item_fma_any_rows<WFormat::kFP4>(p, mats, format.aligned, chunk, block, xs); break;
        case WFormat::kFP8: up_item_fma_any_rows<WFormat::kFP8>(p, mats, format.aligned, chunk, block, xs); break;
        case WFormat::kBF16: up_item_fma_any_rows<WFormat::kBF16>(p, mats, format.aligned, chunk, block, xs); break;
        default: up_item_fma_any_rows<WFormat::kF32>(p, mats, format.aligned, chunk, block, xs); break;
      }
    }
  };
  const auto after = [](int64_t) {};
  int staged = -1;
  // The shared expert's items need nothing from route: they run while the router finishes. The routed ones
  // wait for its plan.
  shared_items(p, staged, stage, run, after);
  wait_for_predecessor();
  routed_items(p, staged, stage, run, after);
}

// ---- expert_down: items of kDownRowsPerItem rows of w2

template <WFormat F>
__device__ void down_item_mma(const ExpertParams& p, const MatView& w2, const Chunk& chunk, int64_t block,
                              const float4* smem, Scratch& scratch) {
  static_assert(kDownRowsPerItem == 2 * kMmaRows, "an item is two tiles of w2");
  const int64_t row0 = block * kDownRowsPerItem;
  const int valid0 = int(std::min<int64_t>(kMmaRows, p.D - row0));
  const int valid1 = int(std::max<int64_t>(0, std::min<int64_t>(kMmaRows, p.D - row0 - kMmaRows)));
  const MatView mats[2] = {w2, w2};
  tiles_mma<F, 2>(mats, {row0, row0 + kMmaRows}, {valid0, valid1}, p.I, chunk, smem, scratch);
  const int t = int(threadIdx.x);
  const int i = t / (kMmaRows * kChunk), r = t / kChunk % kMmaRows, m = t % kChunk;
  if (i < 2 && r < (i == 0 ? valid0 : valid1) && m < chunk.count)
    p.plan.y[int64_t(p.plan.pair_out[chunk.pair0 + m]) * p.D + row0 + i * kMmaRows + r] = tile_sum<F>(scratch, i, r, m);
}

template <WFormat F, int MC>
__device__ void down_item_fma(const ExpertParams& p, const MatView (&mats)[1], bool aligned, const Chunk& chunk,
                              int64_t block, const float* xs) {
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const int64_t row0 = block * kDownRowsPerItem + warp * kDownRowsPerWarp;
  if (row0 >= p.D) return;
  const int rows_valid = int(std::min<int64_t>(kDownRowsPerWarp, p.D - row0));
  float acc[1][kDownRowsPerWarp][MC];
  warp_dot<F, 1, kDownRowsPerWarp, MC>(mats, row0, rows_valid, 0, chunks_per_row<F>(p.I), aligned, xs,
                                       staged_stride(p.I), acc);
  warp_sum(acc);
#pragma unroll
  for (int r = 0; r < kDownRowsPerWarp; ++r)
#pragma unroll
    for (int m = 0; m < MC; ++m)
      if (lane == r * MC + m && m < chunk.count && r < rows_valid)
        p.plan.y[int64_t(p.plan.pair_out[chunk.pair0 + m]) * p.D + row0 + r] = acc[0][r][m];
}

template <WFormat F>
__device__ void down_item_fma_any_rows(const ExpertParams& p, const MatView (&mats)[1], bool aligned,
                                       const Chunk& chunk, int64_t block, const float* xs) {
  switch (rows_for(chunk.count)) {
    case 1: down_item_fma<F, 1>(p, mats, aligned, chunk, block, xs); break;
    case 2: down_item_fma<F, 2>(p, mats, aligned, chunk, block, xs); break;
    default: down_item_fma<F, kChunk>(p, mats, aligned, chunk, block, xs); break;
  }
}

// out[t, rows of block b] = Σ over t's choices in (expert, j) order of y[t·(k+1) + j] + y[t·(k+1) + k], the
// CPU's accumulation order (0 + first + second …, shared expert last). y comes from other blocks: read at L2.
__device__ void combine_rows(const ExpertParams& p, int64_t block) {
  const int64_t d0 = block * kDownRowsPerItem;
  const int64_t rows = std::min<int64_t>(kDownRowsPerItem, p.D - d0);
  for (int64_t i = threadIdx.x; i < p.n * rows; i += kExpertThreads) {
    const int64_t t = i / rows, d = d0 + i % rows;
    const float* yt = p.plan.y + t * (p.k + 1) * p.D + d;
    float sum = 0.0f;
    for (int64_t j = 0; j < p.k; ++j) sum += __ldcg(yt + int64_t(p.plan.combine_order[t * p.k + j]) * p.D);
    sum += __ldcg(yt + p.k * p.D);
    p.out[t * p.D + d] = sum;
  }
}

// Persistent grid; dynamic smem: staged_rows rows of the larger of the two staging layouts.
template <bool kTensorCoresOnly>
__global__ void __launch_bounds__(kExpertThreads, 2) expert_down_kernel(ExpertParams p) {
  extern __shared__ float4 smem_down[];
  __shared__ Scratch scratch;
  __shared__ bool last_arrival;
  wait_for_predecessor();
  const auto format_of = [&](const Chunk& chunk) -> const MatFormat& {
    return chunk.expert < 0 ? p.shared_down : p.routed_down;
  };
  const auto stage = [&](const Chunk& chunk) {
    stage_chunk<kTensorCoresOnly>(format_of(chunk), p.plan.h, p.I, chunk, [&](int m) { return chunk.pair0 + m; },
                                  smem_down, scratch);
  };
  const auto run = [&](const Chunk& chunk, int64_t block) {
    MatView w2;
    if (chunk.expert < 0) {
      w2 = p.shared_w2;
    } else {
      const ExpertPtrs e = p.experts[chunk.expert];
      w2 = {e.w2, e.s2, p.routed_down.row_bytes, p.routed_down.scale_cols, p.routed_down.tiled};
    }
    const MatFormat& format = format_of(chunk);
    if (format.tensor_cores) {
      if (format.format == WFormat::kFP4) down_item_mma<WFormat::kFP4>(p, w2, chunk, block, smem_down, scratch);
      else down_item_mma<WFormat::kFP8>(p, w2, chunk, block, smem_down, scratch);
    } else if constexpr (!kTensorCoresOnly) {
      const float* xs = reinterpret_cast<const float*>(smem_down);
      const MatView mats[1] = {w2};
      switch (format.format) {
        case WFormat::kFP4: down_item_fma_any_rows<WFormat::kFP4>(p, mats, format.aligned, chunk, block, xs); break;
        case WFormat::kFP8: down_item_fma_any_rows<WFormat::kFP8>(p, mats, format.aligned, chunk, block, xs); break;
        case WFormat::kBF16: down_item_fma_any_rows<WFormat::kBF16>(p, mats, format.aligned, chunk, block, xs); break;
        default: down_item_fma_any_rows<WFormat::kF32>(p, mats, format.aligned, chunk, block, xs); break;
      }
    }
  };
  // Called after a block barrier: the fence of thread 0 (cumulative) publishes every thread's y rows before
  // the arrival is counted, and orders the last arrival's reads after everyone else's writes.
  const auto after = [&](int64_t block) {
    if (threadIdx.x == 0) {
      __threadfence();
      const int done = atomicAdd(&p.plan.counters[1 + block], 1) + 1;
      last_arrival = done == p.plan.counters[0];
      __threadfence();
    }
    __syncthreads();
    if (last_arrival) combine_rows(p, block);
  };
  int staged = -1;
  shared_items(p, staged, stage, run, after);
  routed_items(p, staged, stage, run, after);
}

// ---- expert_down at decode (one token, tensor-core formats): row tiles × every chunk of the step
//
// NOTE: the item kernel above splits each 32-row item's K over the block's 8 warps, so at n = 1 a warp loads
// one round of weights per item and the item ends in a chain of barrier, fence, arrival atomic, barrier (ncu,
// bench_moe n = 1: barrier 20% of the stall samples, long scoreboard 20%, instruction fetch 19%). Here a block
// owns 16 output rows of every chunk: its warps take (chunk, K slice) tasks — all of K for a routed chunk, the
// shared expert's rows (FP8: twice the bytes of an FP4 row) in shared_slices() slices — each warp staging its
// chunk's rows in its own shared memory and loading kDecodeUnroll K groups per round; the block then sums each
// token's experts in the CPU's order from shared memory. Every (expert, row tile) is still read once, each
// block reads one tile of every chosen expert, and nothing crosses blocks: no y rows in global memory, no
// arrival counters, no fences. Measured with expert_up's kernel below (H200): bench_moe n = 1 89 → 75 µs; in the
// step expert_down 29 → 20 µs per layer. An L2 bulk prefetch of every task's bytes at the start made both
// kernels slower (bench_moe n = 1 75 → 88 µs) and was dropped.
constexpr int kDecodeUnroll = 4;     // K groups per round of loads (one tile: 8 chunks per lane, 4 KiB a warp)
constexpr int kMaxSharedSlices = 4;

// K slices of a shared-expert task: its rows' bytes over a routed row's (V4: FP8 over FP4, 2), so that every
// task of a decode kernel streams about the same bytes.
__device__ int shared_slices(const MatFormat& shared, const MatFormat& routed) {
  const int64_t ratio = shared.row_bytes / (routed.row_bytes > 0 ? routed.row_bytes : 1);
  return int(ratio < 1 ? 1 : ratio > kMaxSharedSlices ? kMaxSharedSlices : ratio);
}

// Staged rows of one warp (uint4 each), and the shared-memory layout of the decode kernel.
__host__ __device__ inline int64_t decode_stride(int64_t cols) {
  const int64_t fp4 = mma_stride16<WFormat::kFP4>(cols), fp8 = mma_stride16<WFormat::kFP8>(cols);
  return fp4 > fp8 ? fp4 : fp8;
}
// y_s[pair_out][slice][row]: each pair's tile rows, per K slice (routed pairs: slice 0 only).
__host__ __device__ inline size_t decode_smem_bytes(const ExpertParams& p) {
  return size_t(kExpertWarps) * size_t(p.staged_rows) * size_t(decode_stride(p.I)) * 16 +
         size_t(p.n * (p.k + 1)) * kMaxSharedSlices * kMmaRows * sizeof(float);
}

// Task `slice` of `slices` of a one-pair chunk: K groups [groups·slice/slices, groups·(slice+1)/slices) of the
// 16-row tile at row0, into y_s row `out` (the pair's pair_out) in x's units.
template <WFormat F>
__device__ void down_task_mma(const ExpertParams& p, const MatView& w2, const Chunk& chunk, int out, int64_t row0,
                              int rows_valid, int slice, int slices, const uint4* xs, const int* shift, float* y_s) {
  const int64_t groups = (p.I + kGroupCols<F> - 1) / kGroupCols<F>;
  float acc[1][4];
  const MatView mats[1] = {w2};
  warp_mma<F, 1, kDecodeUnroll>(mats, {row0}, {rows_valid}, p.I, groups * slice / slices,
                                groups * (slice + 1) / slices, xs, mma_stride16<F>(p.I), chunk.count, acc);
  const int lane = int(threadIdx.x % 32), g = lane / 4;  // d0/d1: row g, d2/d3: row g + 8; column pair 0: the token
  if (lane % 4 != 0) return;
  const int e = -(shift[0] + (F == WFormat::kFP4 ? kFp4Offset : 0));
  float* y = y_s + (int64_t(out) * kMaxSharedSlices + slice) * kMmaRows;
  if (g < rows_valid) y[g] = ldexpf(acc[0][0] + acc[0][1], e);
  if (g + 8 < rows_valid) y[g + 8] = ldexpf(acc[0][2] + acc[0][3], e);
}

// The plan's chunk c, read through L2 (before the kernel's wait, when this SM's L1 may hold an earlier layer's).
__device__ Chunk chunk_at_l2(const Plan& plan, int c) {
  return {__ldcg(plan.chunk_pair + c), __ldcg(plan.chunk_count + c), __ldcg(plan.chunk_expert + c)};
}

// Routed expert e's w2 in the family's format, its pointers read through L2.
__device__ MatView routed_w2_l2(const ExpertParams& p, int e) {
  const ExpertPtrs* ptrs = p.experts + e;
  const auto* w2 = reinterpret_cast<const uint8_t*>(__ldcg(reinterpret_cast<const unsigned long long*>(&ptrs->w2)));
  const auto* s2 = reinterpret_cast<const void*>(__ldcg(reinterpret_cast<const unsigned long long*>(&ptrs->s2)));
  return {w2, s2, p.routed_down.row_bytes, p.routed_down.scale_cols, p.routed_down.tiled};
}

// A decode task of expert_down: K slice `slice` of `slices` of chunk c's 16-row tiles (c = 0: the shared expert).
struct DownTask {
  Chunk chunk;
  MatView w2;
  int out = 0;  // the chunk's pair's row of y_s (pair_out)
  int c = 0, slice = 0, slices = 1;
  bool fp4 = false;
};

__device__ DownTask down_task_at(const ExpertParams& p, int task, int sh_slices) {
  DownTask d;
  const bool shared = task < sh_slices;
  d.c = shared ? 0 : task - sh_slices + 1;
  d.chunk = shared ? shared_chunk(p, 0) : chunk_at_l2(p.plan, d.c);
  d.w2 = shared ? p.shared_w2 : routed_w2_l2(p, d.chunk.expert);
  d.out = __ldcg(p.plan.pair_out + d.chunk.pair0);
  d.slice = shared ? task : 0;
  d.slices = shared ? sh_slices : 1;
  d.fp4 = (shared ? p.shared_down : p.routed_down).format == WFormat::kFP4;
  return d;
}

// Grid: ≤ one block per 16-row tile of D (looping over tiles); dynamic smem decode_smem_bytes(p). One token
// (the launcher's condition).
__global__ void __launch_bounds__(kExpertThreads, 2) expert_down_decode_kernel(ExpertParams p) {
  extern __shared__ float4 smem_decode[];
  __shared__ int shift_s[kExpertWarps][kChunk];
  __shared__ int order_s[kMaxTopK];  // the token's combine_order
  const int warp = int(threadIdx.x / 32);
  const int64_t stride = decode_stride(p.I);
  uint4* xs = reinterpret_cast<uint4*>(smem_decode) + int64_t(warp) * p.staged_rows * stride;  // this warp's rows
  float* y_s = reinterpret_cast<float*>(reinterpret_cast<uint4*>(smem_decode) + kExpertWarps * p.staged_rows * stride);
  const int sh_slices = shared_slices(p.shared_down, p.routed_down);
  // Route's plan before the wait, through L2: route ended before expert_up's wait returned, and expert_up lets
  // this grid launch only after its wait. (h is expert_up's own output: after the wait.)
  const int tasks = sh_slices + __ldcg(p.plan.counters) - 1;  // one shared chunk (n ≤ kChunk), first
  if (int(threadIdx.x) < p.k) order_s[threadIdx.x] = __ldcg(p.plan.combine_order + threadIdx.x);
  DownTask first;
  if (warp < tasks) first = down_task_at(p, warp, sh_slices);
  wait_for_predecessor();
  const int64_t tiles = (p.D + kMmaRows - 1) / kMmaRows;
  int staged = -1;  // the chunk in this warp's rows
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t row0 = tile * kMmaRows;
    const int rows_valid = int(std::min<int64_t>(kMmaRows, p.D - row0));
    for (int task = warp; task < tasks; task += kExpertWarps) {
      const DownTask d = task == warp ? first : down_task_at(p, task, sh_slices);
      const Chunk& chunk = d.chunk;
      const auto row_index = [&](int m) { return chunk.pair0 + m; };
      if (d.fp4) {
        if (d.c != staged) stage_rows_mma_warp<WFormat::kFP4>(p.plan.h, p.I, chunk.count, rows_for(chunk.count), row_index, xs, shift_s[warp]);
        down_task_mma<WFormat::kFP4>(p, d.w2, chunk, d.out, row0, rows_valid, d.slice, d.slices, xs, shift_s[warp], y_s);
      } else {
        if (d.c != staged) stage_rows_mma_warp<WFormat::kFP8>(p.plan.h, p.I, chunk.count, rows_for(chunk.count), row_index, xs, shift_s[warp]);
        down_task_mma<WFormat::kFP8>(p, d.w2, chunk, d.out, row0, rows_valid, d.slice, d.slices, xs, shift_s[warp], y_s);
      }
      staged = d.c;
    }
    __syncthreads();  // every task's rows are in y_s (and order_s, from the first tile on)
    // out[row] = 0 + Σ over the token's choices in (expert, j) order + the shared expert: combine_rows' order.
    for (int r = int(threadIdx.x); r < rows_valid; r += kExpertThreads) {
      const float* yt = y_s + r;
      float sum = 0.0f;
      for (int64_t j = 0; j < p.k; ++j) sum += yt[int64_t(order_s[j]) * kMaxSharedSlices * kMmaRows];
      const float* ys = yt + p.k * kMaxSharedSlices * kMmaRows;
      float shared_sum = ys[0];
      for (int s = 1; s < sh_slices; ++s) shared_sum += ys[s * kMmaRows];
      p.out[row0 + r] = sum + shared_sum;
    }
    __syncthreads();  // y_s is rewritten for the next tile
  }
}

// ---- expert_up at decode (one token, tensor-core formats): the same shape as expert_down's decode kernel
//
// A block owns 16 rows of every chunk's w1 and w3 (the item kernel: items of 16 rows whose K is split over 8
// warps, two rounds of loads each at n = 1). Its 32 warps take (chunk, matrix, K slice) tasks — half of K of a
// routed w1 or w3 tile, the shared expert's in twice shared_slices() slices: 32 tasks of 16 KiB at V4 — over the
// token's row, staged once per block in each format in use; the block then applies the SwiGLU per chunk from
// shared memory. The shared expert's tasks need nothing from route and run before the wait for it, as in the
// item kernel. Only 128 tiles (I = 2048) for 132 SMs, so a block is an SM's only one: 32 warps of 64 registers
// issue more than 16 of 112 (the kernel is issue-bound: bench_moe n = 1 75.6 → 72.2 µs, H200).
constexpr int kUpDecodeWarps = 32;
constexpr int kUpDecodeThreads = kUpDecodeWarps * 32;
constexpr int kUpDecodeUnroll = 2;     // 64 registers at 1024 threads
constexpr int kRoutedUpSlices = 2;     // K slices of a routed w1 / w3 tile: 32 tasks for 32 warps at V4

// Dynamic smem: the token's row staged for the routed and for the shared format.
__host__ __device__ inline size_t up_decode_smem_bytes(const ExpertParams& p) {
  return 2 * size_t(decode_stride(p.D)) * 16;
}

template <WFormat F>
__device__ void up_task_mma(const ExpertParams& p, const MatView& w, int64_t row0, int rows_valid, int slice,
                            int slices, const uint4* xs, int shift, float* y) {
  const int64_t groups = (p.D + kGroupCols<F> - 1) / kGroupCols<F>;
  float acc[1][4];
  const MatView mats[1] = {w};
  warp_mma<F, 1, kUpDecodeUnroll>(mats, {row0}, {rows_valid}, p.D, groups * slice / slices,
                                  groups * (slice + 1) / slices, xs, mma_stride16<F>(p.D), 1, acc);
  const int lane = int(threadIdx.x % 32), g = lane / 4;
  if (lane % 4 != 0) return;  // column pair 0: the token's hi and lo
  const int e = -(shift + (F == WFormat::kFP4 ? kFp4Offset : 0));
  if (g < rows_valid) y[g] = ldexpf(acc[0][0] + acc[0][1], e);
  if (g + 8 < rows_valid) y[g + 8] = ldexpf(acc[0][2] + acc[0][3], e);
}

// Grid: ≤ one block per 16-row tile of I (looping over tiles); dynamic smem up_decode_smem_bytes(p).
__global__ void __launch_bounds__(kUpDecodeThreads, 1) expert_up_decode_kernel(ExpertParams p) {
  static_assert(kRoutedUpSlices <= kMaxSharedSlices, "y_s holds kMaxSharedSlices slices per matrix");
  extern __shared__ float4 smem_up_decode[];
  __shared__ int shift_s[2];            // [routed, shared]
  __shared__ float block_max[kUpDecodeWarps];
  __shared__ float y_s[kMaxTopK + 1][2][kMaxSharedSlices][kMmaRows];  // [chunk][w1, w3][slice][row]
  __shared__ int pair_s[kMaxTopK + 1];    // [chunk] its pair (one token: one pair per chunk)
  __shared__ float weight_s[kMaxTopK + 1];  // [chunk] the pair's routing weight
  const int warp = int(threadIdx.x / 32);
  uint4* xs_routed = reinterpret_cast<uint4*>(smem_up_decode);
  uint4* xs_shared = xs_routed + decode_stride(p.D);
  const int sh_wanted = kRoutedUpSlices * shared_slices(p.shared_up, p.routed_up);
  const int sh_slices = sh_wanted < kMaxSharedSlices ? sh_wanted : kMaxSharedSlices;
  const int shared_tasks = 2 * sh_slices;
  const int64_t tiles = (p.I + kMmaRows - 1) / kMmaRows;
  const bool shared_fp4 = p.shared_up.format == WFormat::kFP4, routed_fp4 = p.routed_up.format == WFormat::kFP4;
  const auto token = [](int) { return 0; };
  // The token's row (x was written before route ran: it is read before the wait, as the item kernel does).
  if (routed_fp4) stage_rows_mma<WFormat::kFP4>(p.x, p.D, 1, 1, token, xs_routed, &shift_s[0], block_max);
  else stage_rows_mma<WFormat::kFP8>(p.x, p.D, 1, 1, token, xs_routed, &shift_s[0], block_max);
  if (shared_fp4) stage_rows_mma<WFormat::kFP4>(p.x, p.D, 1, 1, token, xs_shared, &shift_s[1], block_max);
  else stage_rows_mma<WFormat::kFP8>(p.x, p.D, 1, 1, token, xs_shared, &shift_s[1], block_max);
  bool waited = false;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t row0 = tile * kMmaRows;
    const int rows_valid = int(std::min<int64_t>(kMmaRows, p.I - row0));
    for (int task = warp; task < shared_tasks; task += kUpDecodeWarps) {
      const int matrix = task / sh_slices, slice = task % sh_slices;
      const MatView& w = matrix == 0 ? p.shared_w1 : p.shared_w3;
      float* y = y_s[0][matrix][slice];
      if (shared_fp4) up_task_mma<WFormat::kFP4>(p, w, row0, rows_valid, slice, sh_slices, xs_shared, shift_s[1], y);
      else up_task_mma<WFormat::kFP8>(p, w, row0, rows_valid, slice, sh_slices, xs_shared, shift_s[1], y);
    }
    if (!waited) {  // the routed tasks read route's plan
      wait_for_predecessor();
      waited = true;
      // The SwiGLU's pairs and weights, asked for now by warp 0 (shared tasks only, done): the epilogue after
      // the barrier would otherwise wait two more L2 round trips.
      const int lane = int(threadIdx.x % 32);
      if (warp == 0 && lane < p.plan.counters[0]) {
        const int pair0 = lane == 0 ? shared_chunk(p, 0).pair0 : p.plan.chunk_pair[lane];
        pair_s[lane] = pair0;
        weight_s[lane] = lane == 0 ? 1.0f : p.plan.pair_weight[pair0];
      }
    }
    const int chunks = p.plan.counters[0];  // the shared chunk, then one per chosen expert
    // Routed task j is task shared_tasks + j of the tile: warps continue round-robin after the shared ones.
    const int first = ((warp - shared_tasks) % kUpDecodeWarps + kUpDecodeWarps) % kUpDecodeWarps;
    const MatFormat& f = p.routed_up;
    for (int task = first; task < 2 * kRoutedUpSlices * (chunks - 1); task += kUpDecodeWarps) {
      const int c = 1 + task / (2 * kRoutedUpSlices), matrix = task / kRoutedUpSlices % 2, slice = task % kRoutedUpSlices;
      const ExpertPtrs e = p.experts[chunk_at(p.plan, c).expert];
      const MatView w = matrix == 0 ? MatView{e.w1, e.s1, f.row_bytes, f.scale_cols, f.tiled}
                                    : MatView{e.w3, e.s3, f.row_bytes, f.scale_cols, f.tiled};
      float* y = y_s[c][matrix][slice];
      if (routed_fp4) up_task_mma<WFormat::kFP4>(p, w, row0, rows_valid, slice, kRoutedUpSlices, xs_routed, shift_s[0], y);
      else up_task_mma<WFormat::kFP8>(p, w, row0, rows_valid, slice, kRoutedUpSlices, xs_routed, shift_s[0], y);
    }
    __syncthreads();  // every task's rows are in y_s
    for (int i = int(threadIdx.x); i < chunks * kMmaRows; i += kUpDecodeThreads) {
      const int c = i / kMmaRows, r = i % kMmaRows;
      if (r >= rows_valid) continue;
      const int slices = c == 0 ? sh_slices : kRoutedUpSlices;
      float g = y_s[c][0][0][r], u = y_s[c][1][0][r];
      for (int s = 1; s < slices; ++s) {
        g += y_s[c][0][s][r];
        u += y_s[c][1][s][r];
      }
      p.plan.h[int64_t(pair_s[c]) * p.I + row0 + r] = swiglu(g, u, p.swiglu_limit, weight_s[c]);
    }
    __syncthreads();  // y_s is rewritten for the next tile
  }
  if (!waited) wait_for_predecessor();  // a block without tiles still lets the successor launch
}

// Bytes of one staged row of `cols` columns: the larger of the fp32 and the tensor-core layouts in use.
size_t staged_row_bytes(int64_t cols, const MatFormat& a, const MatFormat& b) {
  size_t bytes = 0;
  for (const MatFormat* f : {&a, &b}) {
    if (!f->tensor_cores) bytes = std::max(bytes, size_t(staged_stride(cols)) * sizeof(float));
    else if (f->format == WFormat::kFP4) bytes = std::max(bytes, size_t(mma_stride16<WFormat::kFP4>(cols)) * 16);
    else bytes = std::max(bytes, size_t(mma_stride16<WFormat::kFP8>(cols)) * 16);
  }
  return bytes;
}

int resident_blocks(const void* kernel, size_t smem, int sm_count) {
  return prepare_kernel(kernel, kExpertThreads, smem) * sm_count;
}

void check_expert_params(const ExpertParams& p) {
  DSV4_CHECK(p.n > 0 && p.D > 0 && p.I > 0 && p.k > 0, "moe experts: empty shape n=", p.n, " D=", p.D, " I=", p.I);
  const int64_t max_chunks = (p.n + kChunk - 1) / kChunk + (p.n * p.k + kChunk - 1) / kChunk + p.n * p.k;
  DSV4_CHECK(max_chunks * p.row_blocks < (int64_t(1) << 31), "moe experts: ", p.n, " tokens make too many work items");
  DSV4_CHECK(p.staged_rows >= 1 && p.staged_rows <= kChunk, "moe experts: staged rows ", p.staged_rows);
  DSV4_CHECK(p.D * p.I < (int64_t(1) << 32), "moe experts: [", p.I, ", ", p.D, "] expert matrices are too large for the "
             "tensor-core path's 32-bit offsets");
  DSV4_CHECK(p.experts && p.plan.counters && p.plan.h && p.plan.y, "moe experts: missing plan buffers");
}

}  // namespace

int prepare_kernel(const void* kernel, int threads, size_t smem) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, size_t>, int> per_sm;
  int device = 0;
  DSV4_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, inserted] = per_sm.try_emplace({kernel, device, smem}, 0);
  if (inserted) {
    // The attribute is per kernel, not per size: always the device's limit (the same value for every size), so
    // that a later, smaller size does not lower it below an earlier, larger one that is still launched.
    int optin = 0;
    DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    cudaFuncAttributes attributes;
    DSV4_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    const int max_dynamic = optin - int(attributes.sharedSizeBytes);  // the limit covers static + dynamic
    DSV4_CHECK(smem <= size_t(max_dynamic), "moe: a kernel needs ", smem, " bytes of dynamic shared memory, the device allows ",
               max_dynamic);
    DSV4_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_dynamic));
    DSV4_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&it->second, kernel, threads, smem));
    DSV4_CHECK(it->second > 0, "moe: a kernel does not fit on an SM with ", smem, " bytes of shared memory");
  }
  return it->second;
}

void launch_expert_up(const ExpertParams& p, int sm_count, bool pdl, cudaStream_t stream) {
  check_expert_params(p);
  if (p.n == 1 && p.k <= kMaxTopK && p.routed_up.tensor_cores && p.shared_up.tensor_cores) {  // decode: row tiles
    const size_t smem = up_decode_smem_bytes(p);
    const auto kernel = expert_up_decode_kernel;
    const int per_sm = prepare_kernel(reinterpret_cast<const void*>(kernel), kUpDecodeThreads, smem);
    const int64_t tiles = (p.I + kMmaRows - 1) / kMmaRows;
    const int grid = int(std::min<int64_t>(tiles, int64_t(per_sm) * sm_count));
    launch_pdl(kernel, dim3(unsigned(grid)), dim3(kUpDecodeThreads), smem, stream, pdl, p);
    return;
  }
  const size_t smem = size_t(p.staged_rows) * staged_row_bytes(p.D, p.routed_up, p.shared_up);
  const auto kernel = p.routed_up.tensor_cores && p.shared_up.tensor_cores ? expert_up_kernel<true>
                                                                          : expert_up_kernel<false>;
  const int grid = resident_blocks(reinterpret_cast<const void*>(kernel), smem, sm_count);
  launch_pdl(kernel, dim3(unsigned(grid)), dim3(kExpertThreads), smem, stream, pdl, p);
}

void launch_expert_down(const ExpertParams& p, int sm_count, bool pdl, cudaStream_t stream) {
  check_expert_params(p);
  DSV4_CHECK(p.out != nullptr, "moe experts: no output");
  // One token: each warp stages one activation row (8 KiB at V4 sizes), 66 KiB a block, two blocks per SM. At two
  // tokens the rows double and one block fits an SM: measured slower than the item kernel (bench_moe n = 2).
  if (p.n == 1 && p.routed_down.tensor_cores && p.shared_down.tensor_cores) {
    const size_t smem = decode_smem_bytes(p);
    const auto kernel = expert_down_decode_kernel;
    const int64_t tiles = (p.D + kMmaRows - 1) / kMmaRows;
    const int grid = int(std::min<int64_t>(tiles, resident_blocks(reinterpret_cast<const void*>(kernel), smem, sm_count)));
    launch_pdl(kernel, dim3(unsigned(grid)), dim3(kExpertThreads), smem, stream, pdl, p);
    return;
  }
  const size_t smem = size_t(p.staged_rows) * staged_row_bytes(p.I, p.routed_down, p.shared_down);
  const auto kernel = p.routed_down.tensor_cores && p.shared_down.tensor_cores ? expert_down_kernel<true>
                                                                              : expert_down_kernel<false>;
  const int grid = resident_blocks(reinterpret_cast<const void*>(kernel), smem, sm_count);
  launch_pdl(kernel, dim3(unsigned(grid)), dim3(kExpertThreads), smem, stream, pdl, p);
}

}  // namespace dsv4::cuda::moe
