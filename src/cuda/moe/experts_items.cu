// moe family (CUDA): the item kernels, the expert kernels for any step, and the launchers that pick between them
// and the decode kernels (experts_decode.cu). Both item kernels walk the plan's chunks (≤ kChunk pairs of one
// expert) × output row blocks as work items on a persistent grid (shared_items, routed_items). A block stages
// its chunk's activation rows in shared memory once per chunk change; its warps then stream the expert's rows
// with 16-byte loads and decode in registers, so every selected expert's weights are read once per chunk. FP4
// and FP8 matrices go through the tensor cores (weight_mma.cuh: the 8 warps split K, partial tiles summed in a
// fixed order; matrices of whole 16-row tiles stored in its MMA tile order, where a warp load reads 512
// contiguous bytes); BF16 and F32 ones, and FP4 blocks with scales outside the fp16 window, through fp32 FMAs
// (weight_dot.cuh: a warp owns whole rows).
//   expert_up:   h[pair] = silu(min(w1·x, L)) · clamp(w3·x, −L, L) · weight     (rows of w1 and w3 together)
//   expert_down: y[pair] = w2 · h[pair]
//   combine:     out[t] = the sum of t's y rows in the CPU's order: the token's experts ascending, then the
//                shared expert. No float atomics: the result is the same every run. Its own launch: an arrival
//                counter per row block (the last block to finish one combined it) cost every down item a
//                fence, an atomic and a barrier (docs/design/moe.md).
// Fast numerics (ExpertParams::fast): the staging rounds each GEMM's activations (stage_rounding), w1 / w3 / w2
// outputs and h are written as bf16 values (bf16_output, hidden), and the combine rounds its fp32 sum once (a
// rank's share, ExpertParams::round_sum off: not at all; hc_post rounds the ranks' sum).
#include "cuda/moe/experts.cuh"
#include "cuda/moe/weight_mma.cuh"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

namespace dsv4::cuda::moe {

namespace {

// Runs item (chunk c, row block b): stage(chunk) when the block's staged chunk changes, run(chunk, b), a
// barrier. `staged` is the block's currently staged chunk. The item walkers are inlined by force: with fast
// numerics' staging nvcc no longer inlined routed_items into expert_up_kernel<false>, and the call cost that
// kernel a 592-byte stack frame (ptxas -v).
template <class Stage, class Run>
__device__ __forceinline__ void run_item(int c, int64_t b, const Chunk& chunk, int& staged, Stage& stage, Run& run) {
  if (c != staged) {  // the previous item ended with a barrier: nobody reads the staged rows any more
    stage(chunk);
    staged = c;
    __syncthreads();
  }
  run(chunk, b);
  __syncthreads();
}

// Items c·row_blocks + b. The shared expert's chunks (the plan's first shared_chunks(), known without it) go
// round-robin over the blocks; the routed chunks' items are split into equal contiguous ranges, so a block
// keeps its staged rows over consecutive items and its schedule needs no counter.
template <class Stage, class Run>
__device__ __forceinline__ void shared_items(const ExpertParams& p, int& staged, Stage& stage, Run& run) {
  const int row_blocks = int(p.row_blocks);  // item counts fit in 32 bits (launch_expert_* check)
  const int items = shared_chunks(p.n, p.shared_items) * row_blocks;
  for (int item = int(blockIdx.x); item < items; item += int(gridDim.x)) {
    const int c = item / row_blocks, b = item - c * row_blocks;
    run_item(c, b, shared_chunk(p, c), staged, stage, run);
  }
}

template <class Stage, class Run>
__device__ __forceinline__ void routed_items(const ExpertParams& p, int& staged, Stage& stage, Run& run) {
  const int row_blocks = int(p.row_blocks);
  const int first = shared_chunks(p.n, p.shared_items);
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
  }
}

// Shared memory of the expert kernels besides the staged rows; NT = tiles per item (up 2, down kDownTiles).
template <int NT>
struct Scratch {
  int shift[kChunk];                                   // tensor-core staging: x·2^shift per staged row
  float block_max[kChunk * kExpertWarps];              // its block reduction
  float tiles[kExpertWarps][NT][kMmaRows][kMmaCols];   // tensor-core partial tiles: [warp][tile][row][token, half]
};

// Stages the chunk's rows (row m of the chunk is src row row_index(m)) in the layout `format` reads, rounded as
// the numerics round that format's activations (stage_rounding; the tensor-core formats are FP4 and FP8).
template <bool kTensorCoresOnly, int NT, class RowIndex>
__device__ void stage_chunk(const MatFormat& format, bool fast, const float* src, int64_t cols, const Chunk& chunk,
                            RowIndex row_index, float4* smem, Scratch<NT>& scratch) {
  const int rows = rows_for(chunk.count);
  if (format.tensor_cores) {
    uint4* xs = reinterpret_cast<uint4*>(smem);
    if (format.format == WFormat::kFP4)
      stage_rows_mma<WFormat::kFP4>(src, cols, chunk.count, rows, row_index, fast, xs, scratch.shift,
                                    scratch.block_max);
    else
      stage_rows_mma<WFormat::kFP8>(src, cols, chunk.count, rows, row_index, fast, xs, scratch.shift,
                                    scratch.block_max);
  } else if constexpr (!kTensorCoresOnly) {
    stage_rows(src, cols, chunk.count, rows, row_index, stage_rounding(fast, format.format),
               reinterpret_cast<float*>(smem));
  }
}

// The item's NT tiles of 16 rows through the tensor cores, the block's warps splitting K into equal group
// ranges; leaves each warp's partial tiles in scratch.tiles (then a barrier).
template <WFormat F, int NT>
__device__ void tiles_mma(const MatView (&mats)[NT], const int64_t (&row0)[NT], const int (&rows_valid)[NT],
                          int64_t cols, const Chunk& chunk, const float4* smem, Scratch<NT>& scratch) {
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const int64_t groups = (cols + kGroupCols<F> - 1) / kGroupCols<F>;
  float acc[NT][4];
  // Two K groups of loads in flight for two tiles; one for four (two spilled at 128 registers, ptxas -v).
  constexpr int kUnroll = NT <= 2 ? 2 : 1;
  warp_mma<F, NT, kUnroll>(mats, row0, rows_valid, cols, groups * warp / kExpertWarps,
                           groups * (warp + 1) / kExpertWarps, reinterpret_cast<const uint4*>(smem),
                           mma_stride16<F>(cols), chunk.count, acc);
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
template <WFormat F, int NT>
__device__ float tile_sum(const Scratch<NT>& scratch, int i, int r, int m) {
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
                            const float4* smem, Scratch<2>& scratch) {
  const int64_t row0 = block * kUpRowsPerItem;
  const int rows_valid = int(std::min<int64_t>(kUpRowsPerItem, p.I - row0));
  tiles_mma<F, 2>(mats, {row0, row0}, {rows_valid, rows_valid}, p.D, chunk, smem, scratch);
  const int r = int(threadIdx.x) / kChunk, m = int(threadIdx.x) % kChunk;
  if (r < rows_valid && m < chunk.count) {
    const int pair = chunk.pair0 + m;
    const float weight = chunk.expert < 0 ? 1.0f : p.plan.pair_weight[pair];  // shared: may run before route ends
    p.plan.h[int64_t(pair) * p.I + row0 + r] =
        hidden(p, F, tile_sum<F>(scratch, 0, r, m), tile_sum<F>(scratch, 1, r, m), weight);
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
        p.plan.h[int64_t(pair) * p.I + row0 + r] = hidden(p, F, acc[0][r][m], acc[1][r][m], weight);
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
  __shared__ Scratch<2> scratch;
  const auto format_of = [&](const Chunk& chunk) -> const MatFormat& {
    return chunk.expert < 0 ? p.shared_up : p.routed_up;
  };
  const int shared_pair0 = int(p.n * p.k);  // the shared expert's pairs: token t at P + t
  const auto stage = [&](const Chunk& chunk) {
    stage_chunk<kTensorCoresOnly>(
        format_of(chunk), p.fast, p.x, p.D, chunk,
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
  int staged = -1;
  // The shared expert's items need nothing from route: they run while the router finishes. The routed ones
  // wait for its plan.
  shared_items(p, staged, stage, run);
  pdl_wait_predecessor();
  pdl_trigger();
  routed_items(p, staged, stage, run);
}

// ---- expert_down: items of kDownRowsPerItem rows of w2

template <WFormat F>
__device__ void down_item_mma(const ExpertParams& p, const MatView& w2, const Chunk& chunk, int64_t block,
                              const float4* smem, Scratch<kDownTiles>& scratch) {
  const int64_t row0 = block * kDownRowsPerItem;
  MatView mats[kDownTiles];
  int64_t tile_row0[kDownTiles];
  int valid[kDownTiles];
#pragma unroll
  for (int i = 0; i < kDownTiles; ++i) {
    mats[i] = w2;
    tile_row0[i] = row0 + i * kMmaRows;
    valid[i] = int(std::clamp<int64_t>(p.D - tile_row0[i], 0, kMmaRows));
  }
  tiles_mma<F, kDownTiles>(mats, tile_row0, valid, p.I, chunk, smem, scratch);
  for (int t = int(threadIdx.x); t < kDownRowsPerItem * kChunk; t += kExpertThreads) {
    const int i = t / (kMmaRows * kChunk), r = t / kChunk % kMmaRows, m = t % kChunk;
    const int64_t row = row0 + i * kMmaRows + r;
    if (row < p.D && m < chunk.count)
      p.plan.y[int64_t(p.plan.pair_out[chunk.pair0 + m]) * p.D + row] =
          round_bf16_if(bf16_output(p.fast, F), tile_sum<F>(scratch, i, r, m));
  }
}

template <WFormat F, int MC>
__device__ void down_item_fma(const ExpertParams& p, const MatView (&mats)[1], bool aligned, const Chunk& chunk,
                              int64_t block, const float* xs) {
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  constexpr int kPassRows = kDownRowsPerWarp * kExpertWarps;
  for (int pass = 0; pass < kDownRowsPerItem / kPassRows; ++pass) {
    const int64_t row0 = block * kDownRowsPerItem + pass * kPassRows + warp * kDownRowsPerWarp;
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
          p.plan.y[int64_t(p.plan.pair_out[chunk.pair0 + m]) * p.D + row0 + r] =
              round_bf16_if(bf16_output(p.fast, F), acc[0][r][m]);
  }
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

// Persistent grid; dynamic smem: staged_rows rows of the larger of the two staging layouts.
template <bool kTensorCoresOnly>
__global__ void __launch_bounds__(kExpertThreads, 2) expert_down_kernel(ExpertParams p) {
  extern __shared__ float4 smem_down[];
  __shared__ Scratch<kDownTiles> scratch;
  pdl_wait_predecessor();
  pdl_trigger();
  const auto format_of = [&](const Chunk& chunk) -> const MatFormat& {
    return chunk.expert < 0 ? p.shared_down : p.routed_down;
  };
  const auto stage = [&](const Chunk& chunk) {
    stage_chunk<kTensorCoresOnly>(format_of(chunk), p.fast, p.plan.h, p.I, chunk,
                                  [&](int m) { return chunk.pair0 + m; }, smem_down, scratch);
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
  int staged = -1;
  shared_items(p, staged, stage, run);
  routed_items(p, staged, stage, run);
}

// One thread per output element: the sum's loads are independent, so the launch is one round of L2 reads.
__global__ void __launch_bounds__(256) combine_kernel(ExpertParams p) {
  pdl_wait_predecessor();
  pdl_trigger();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.n * p.D) return;
  const int64_t t = i / p.D, d = i % p.D;
  const float* yt = p.plan.y + t * (p.k + 1) * p.D + d;
  float sum = 0.0f;
  for (int64_t j = 0; j < p.k; ++j) {
    const int slot = p.plan.combine_order[t * p.k + j];
    if (slot >= 0) sum += yt[int64_t(slot) * p.D];
  }
  if (p.has_shared) sum += yt[p.k * p.D];
  p.out[i] = round_bf16_if(p.fast && p.round_sum, sum);
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

int resident_blocks(const void* kernel, size_t smem, int sm_count) {
  return prepare_kernel(kernel, kExpertThreads, smem) * sm_count;
}

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
  if (expert_up_decode_fits(p)) {
    launch_expert_up_decode(p, sm_count, pdl, stream);
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
  if (expert_down_decode_fits(p)) {
    launch_expert_down_decode(p, sm_count, pdl, stream);
    return;
  }
  const size_t smem = size_t(p.staged_rows) * staged_row_bytes(p.I, p.routed_down, p.shared_down);
  const auto kernel = p.routed_down.tensor_cores && p.shared_down.tensor_cores ? expert_down_kernel<true>
                                                                              : expert_down_kernel<false>;
  const int grid = resident_blocks(reinterpret_cast<const void*>(kernel), smem, sm_count);
  launch_pdl(kernel, dim3(unsigned(grid)), dim3(kExpertThreads), smem, stream, pdl, p);
  launch_combine(p, pdl, stream);
}

void launch_combine(const ExpertParams& p, bool pdl, cudaStream_t stream) {
  DSV4_CHECK(ceil_div(p.n * p.D, 256) < (int64_t(1) << 31), "moe combine: ", p.n, " × ", p.D, " outputs are too many");
  launch_pdl(combine_kernel, dim3(unsigned(ceil_div(p.n * p.D, 256))), dim3(256), 0, stream, pdl, p);
}

}  // namespace dsv4::cuda::moe
