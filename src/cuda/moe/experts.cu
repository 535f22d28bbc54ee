// moe family (CUDA): the expert kernels. Both walk the plan's chunks (≤ kChunk pairs of one expert) ×
// output row blocks as work items, taken from a device counter by persistent blocks (the shared expert's
// chunks first: largest items first). A block stages its chunk's activation rows in shared memory once per
// chunk change; each warp then streams its rows of the expert's matrices with 16-byte loads, decoding in
// registers (weight_dot.cuh), so every selected expert's weights are read once per chunk.
//   expert_up:   h[pair] = silu(min(w1·x, L)) · clamp(w3·x, −L, L) · weight     (rows of w1 and w3 together)
//   expert_down: y[pair] = w2 · h[pair]; the block that completes an output row block last (a per-block
//                arrival counter) sums that block's rows into out in the CPU's order: the token's experts
//                ascending, then the shared expert. No float atomics: the result is the same every run.
#include "cuda/moe/moe_kernels.h"

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

// Work loop shared by both kernels: items c·row_blocks + b, taken from counters[counter] one at a time (the
// next index is fetched while the current item runs). stage(chunk) fills xs; run(chunk, b) does the item;
// after(b) runs once all warps have finished it and must contain a block barrier.
template <class Stage, class Run, class After>
__device__ void work_loop(const ExpertParams& p, int counter, Stage stage, Run run, After after) {
  __shared__ int next_item;
  const int64_t total = int64_t(p.plan.counters[0]) * p.row_blocks;
  if (threadIdx.x == 0) next_item = atomicAdd(&p.plan.counters[counter], 1);
  __syncthreads();
  int64_t item = next_item;
  int staged = -1;
  while (item < total) {
    const int c = int(item / p.row_blocks);
    const int64_t b = item % p.row_blocks;
    const Chunk chunk = chunk_at(p.plan, c);
    if (c != staged) {  // the previous item's trailing barrier: nobody reads xs any more
      stage(chunk);
      staged = c;
      __syncthreads();
    }
    int prefetched = 0;
    if (threadIdx.x == 0) prefetched = atomicAdd(&p.plan.counters[counter], 1);
    run(chunk, b);
    __syncthreads();
    // Everyone reads next_item past after()'s barrier; thread 0 rewrites it only past the next item's first.
    if (threadIdx.x == 0) next_item = prefetched;
    after(b);
    item = next_item;
  }
}

// ---- expert_up

template <WFormat F, int MC>
__device__ void up_item(const ExpertParams& p, const MatView (&mats)[2], bool aligned, const Chunk& chunk,
                        int64_t block, const float* xs) {
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const int64_t row0 = block * kUpRowsPerItem + warp * kUpRowsPerWarp;
  if (row0 >= p.I) return;
  const int rows_valid = int(std::min<int64_t>(kUpRowsPerWarp, p.I - row0));
  float acc[2][kUpRowsPerWarp][MC];
  warp_dot<F, 2, kUpRowsPerWarp, MC>(mats, row0, rows_valid, 0, chunks_per_row<F>(p.D), aligned, xs,
                                     staged_stride(p.D), acc);
  warp_sum(acc);
  const float limit = p.swiglu_limit;
#pragma unroll
  for (int r = 0; r < kUpRowsPerWarp; ++r)
#pragma unroll
    for (int m = 0; m < MC; ++m)
      if (lane == r * MC + m && m < chunk.count && r < rows_valid) {
        float g = acc[0][r][m], u = acc[1][r][m];
        if (limit > 0.0f) {  // the CPU's std::min / std::clamp, NaN handling included
          g = limit < g ? limit : g;
          u = u < -limit ? -limit : (limit < u ? limit : u);
        }
        const int pair = chunk.pair0 + m;
        p.plan.h[int64_t(pair) * p.I + row0 + r] = g / (1.0f + expf(-g)) * u * p.plan.pair_weight[pair];
      }
}

template <WFormat F>
__device__ void up_item_any_rows(const ExpertParams& p, const MatView (&mats)[2], bool aligned, const Chunk& chunk,
                                 int64_t block, const float* xs) {
  switch (rows_for(chunk.count)) {
    case 1: up_item<F, 1>(p, mats, aligned, chunk, block, xs); break;
    case 2: up_item<F, 2>(p, mats, aligned, chunk, block, xs); break;
    default: up_item<F, kChunk>(p, mats, aligned, chunk, block, xs); break;
  }
}

// Persistent grid; dynamic smem: staged_rows × staged_stride(D) floats.
__global__ void __launch_bounds__(kExpertThreads, 2) expert_up_kernel(ExpertParams p) {
  extern __shared__ float4 smem_up[];
  float* xs = reinterpret_cast<float*>(smem_up);
  wait_for_predecessor();
  const auto stage = [&](const Chunk& chunk) {
    stage_rows(p.x, p.D, chunk.count, rows_for(chunk.count), [&](int m) { return p.plan.pair_token[chunk.pair0 + m]; },
               xs);
  };
  const auto run = [&](const Chunk& chunk, int64_t block) {
    MatView mats[2];
    MatFormat format;
    if (chunk.expert < 0) {
      mats[0] = p.shared_w1;
      mats[1] = p.shared_w3;
      format = p.shared_up;
    } else {
      const ExpertPtrs e = p.experts[chunk.expert];
      mats[0] = {e.w1, e.s1, p.routed_up.row_bytes, p.routed_up.scale_cols};
      mats[1] = {e.w3, e.s3, p.routed_up.row_bytes, p.routed_up.scale_cols};
      format = p.routed_up;
    }
    switch (format.format) {
      case WFormat::kFP4: up_item_any_rows<WFormat::kFP4>(p, mats, format.aligned, chunk, block, xs); break;
      case WFormat::kFP8: up_item_any_rows<WFormat::kFP8>(p, mats, format.aligned, chunk, block, xs); break;
      case WFormat::kBF16: up_item_any_rows<WFormat::kBF16>(p, mats, format.aligned, chunk, block, xs); break;
      default: up_item_any_rows<WFormat::kF32>(p, mats, format.aligned, chunk, block, xs); break;
    }
  };
  const auto after = [](int64_t) { __syncthreads(); };
  work_loop(p, 1, stage, run, after);
}

// ---- expert_down

template <WFormat F, int MC>
__device__ void down_item(const ExpertParams& p, const MatView (&mats)[1], bool aligned, const Chunk& chunk,
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
__device__ void down_item_any_rows(const ExpertParams& p, const MatView (&mats)[1], bool aligned,
                                   const Chunk& chunk, int64_t block, const float* xs) {
  switch (rows_for(chunk.count)) {
    case 1: down_item<F, 1>(p, mats, aligned, chunk, block, xs); break;
    case 2: down_item<F, 2>(p, mats, aligned, chunk, block, xs); break;
    default: down_item<F, kChunk>(p, mats, aligned, chunk, block, xs); break;
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

// Persistent grid; dynamic smem: staged_rows × staged_stride(I) floats.
__global__ void __launch_bounds__(kExpertThreads, 2) expert_down_kernel(ExpertParams p) {
  extern __shared__ float4 smem_down[];
  float* xs = reinterpret_cast<float*>(smem_down);
  __shared__ bool last_arrival;
  wait_for_predecessor();
  const auto stage = [&](const Chunk& chunk) {
    stage_rows(p.plan.h, p.I, chunk.count, rows_for(chunk.count), [&](int m) { return chunk.pair0 + m; }, xs);
  };
  const auto run = [&](const Chunk& chunk, int64_t block) {
    MatView mats[1];
    MatFormat format;
    if (chunk.expert < 0) {
      mats[0] = p.shared_w2;
      format = p.shared_down;
    } else {
      const ExpertPtrs e = p.experts[chunk.expert];
      mats[0] = {e.w2, e.s2, p.routed_down.row_bytes, p.routed_down.scale_cols};
      format = p.routed_down;
    }
    switch (format.format) {
      case WFormat::kFP4: down_item_any_rows<WFormat::kFP4>(p, mats, format.aligned, chunk, block, xs); break;
      case WFormat::kFP8: down_item_any_rows<WFormat::kFP8>(p, mats, format.aligned, chunk, block, xs); break;
      case WFormat::kBF16: down_item_any_rows<WFormat::kBF16>(p, mats, format.aligned, chunk, block, xs); break;
      default: down_item_any_rows<WFormat::kF32>(p, mats, format.aligned, chunk, block, xs); break;
    }
  };
  // Called after a block barrier: the fence of thread 0 (cumulative) publishes every thread's y rows before
  // the arrival is counted, and orders the last arrival's reads after everyone else's writes.
  const auto after = [&](int64_t block) {
    if (threadIdx.x == 0) {
      __threadfence();
      const int done = atomicAdd(&p.plan.counters[3 + block], 1) + 1;
      last_arrival = done == p.plan.counters[0];
      __threadfence();
    }
    __syncthreads();
    if (last_arrival) combine_rows(p, block);
  };
  work_loop(p, 2, stage, run, after);
}

int resident_blocks(const void* kernel, size_t smem, int sm_count) {
  return prepare_kernel(kernel, kExpertThreads, smem) * sm_count;
}

void check_expert_params(const ExpertParams& p) {
  DSV4_CHECK(p.n > 0 && p.D > 0 && p.I > 0 && p.k > 0, "moe experts: empty shape n=", p.n, " D=", p.D, " I=", p.I);
  DSV4_CHECK(p.staged_rows >= 1 && p.staged_rows <= kChunk, "moe experts: staged rows ", p.staged_rows);
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
    if (smem > 48 * 1024)
      DSV4_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    DSV4_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&it->second, kernel, threads, smem));
    DSV4_CHECK(it->second > 0, "moe: a kernel does not fit on an SM with ", smem, " bytes of shared memory");
  }
  return it->second;
}

void launch_expert_up(const ExpertParams& p, int sm_count, bool pdl, cudaStream_t stream) {
  check_expert_params(p);
  const size_t smem = size_t(p.staged_rows) * size_t(staged_stride(p.D)) * sizeof(float);
  const int grid = resident_blocks(reinterpret_cast<const void*>(expert_up_kernel), smem, sm_count);
  launch_kernel(expert_up_kernel, dim3(unsigned(grid)), dim3(kExpertThreads), smem, pdl, stream, p);
}

void launch_expert_down(const ExpertParams& p, int sm_count, bool pdl, cudaStream_t stream) {
  check_expert_params(p);
  DSV4_CHECK(p.out != nullptr, "moe experts: no output");
  const size_t smem = size_t(p.staged_rows) * size_t(staged_stride(p.I)) * sizeof(float);
  const int grid = resident_blocks(reinterpret_cast<const void*>(expert_down_kernel), smem, sm_count);
  launch_kernel(expert_down_kernel, dim3(unsigned(grid)), dim3(kExpertThreads), smem, pdl, stream, p);
}

}  // namespace dsv4::cuda::moe
