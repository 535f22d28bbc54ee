// moe family (CUDA): the expert kernels of a one-token step whose matrices all go through the tensor cores;
// launch_expert_up / launch_expert_down (experts_items.cu) pick them. A block owns a 16-row tile of every chunk of
// the step and its warps take (chunk, K slice) tasks of it (the notes below say why).
#include "cuda/common/cluster.cuh"
#include "cuda/moe/experts.cuh"
#include "cuda/moe/weight_mma.cuh"

#include <algorithm>

namespace dsv4::cuda::moe {

namespace {

// ---- expert_down at decode (one token, tensor-core formats): row tiles × every chunk of the step
//
// NOTE: the item kernel (experts_items.cu) splits each 32-row item's K over the block's 8 warps, so at n = 1 a
// warp loads one round of weights per item and the item ends in a chain of barrier, fence, arrival atomic,
// barrier (ncu, bench_moe n = 1: its stalls split about evenly between the barriers, the loads and instruction
// fetch). Here a block owns 16 output rows of every chunk: its warps take (chunk, K slice) tasks — all of K for a
// routed chunk, the shared expert's rows (FP8: twice the bytes of an FP4 row) in shared_slices() slices — each
// warp staging its chunk's rows in its own shared memory and loading kDecodeUnroll K groups per round; the block
// then sums each token's experts in the CPU's order from shared memory. Every (expert, row tile) is still read
// once, each block reads one tile of every chosen expert, and nothing crosses blocks: no y rows in global memory,
// no arrival counters, no fences. With expert_up's decode kernel below this is faster than the item kernels at
// one token (bench_moe n = 1, and expert_down in the step's timeline). An L2 bulk prefetch of every task's bytes
// at the start made both kernels slower (bench_moe n = 1) and was dropped.
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

// A decode task of expert_down: K slice `slice` of `slices` of chunk c's 16-row tiles (c = 0: the shared expert,
// where the rank holds it; then sh_slices = 0).
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
  d.c = shared ? 0 : task - sh_slices + shared_chunks(p.n, p.shared_items);
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
  const int sh_slices = p.has_shared ? shared_slices(p.shared_down, p.routed_down) : 0;
  // Route's plan before the wait, through L2: route ended before expert_up's wait returned, and expert_up lets
  // this grid launch only after its wait. (h is expert_up's own output: after the wait.) No task at all on a
  // rank without a pair (moe_kernels.h): the tiles below then write zeros.
  const int tasks = sh_slices + __ldcg(p.plan.counters) - shared_chunks(p.n, p.shared_items);  // the shared chunk first
  if (int(threadIdx.x) < p.k) order_s[threadIdx.x] = __ldcg(p.plan.combine_order + threadIdx.x);
  DownTask first;
  if (warp < tasks) first = down_task_at(p, warp, sh_slices);
  pdl_wait_predecessor();
  pdl_trigger();
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
        if (d.c != staged)
          stage_rows_mma_warp<WFormat::kFP4>(p.plan.h, p.I, chunk.count, rows_for(chunk.count), row_index, p.fast, xs,
                                             shift_s[warp]);
        down_task_mma<WFormat::kFP4>(p, d.w2, chunk, d.out, row0, rows_valid, d.slice, d.slices, xs, shift_s[warp], y_s);
      } else {
        if (d.c != staged)
          stage_rows_mma_warp<WFormat::kFP8>(p.plan.h, p.I, chunk.count, rows_for(chunk.count), row_index, p.fast, xs,
                                             shift_s[warp]);
        down_task_mma<WFormat::kFP8>(p, d.w2, chunk, d.out, row0, rows_valid, d.slice, d.slices, xs, shift_s[warp], y_s);
      }
      staged = d.c;
    }
    __syncthreads();  // every task's rows are in y_s (and order_s, from the first tile on)
    // out[row] = 0 + Σ over the token's choices in (expert, j) order + the shared expert: combine_rows' order.
    // Fast numerics: each expert's output (the shared one's after its slices) is a bf16 value, the sum is
    // rounded once (combine_rows), or not for a rank's share (round_sum: hc_post rounds the ranks' sum); FP8
    // and FP4, the only formats here, give bf16 outputs. Another rank's
    // experts (order −1) and an absent shared expert add nothing.
    for (int r = int(threadIdx.x); r < rows_valid; r += kExpertThreads) {
      const float* yt = y_s + r;
      float sum = 0.0f;
      for (int64_t j = 0; j < p.k; ++j)
        if (order_s[j] >= 0) sum += round_bf16_if(p.fast, yt[int64_t(order_s[j]) * kMaxSharedSlices * kMmaRows]);
      if (p.has_shared) {
        const float* ys = yt + p.k * kMaxSharedSlices * kMmaRows;
        float shared_sum = ys[0];
        for (int s = 1; s < sh_slices; ++s) shared_sum += ys[s * kMmaRows];
        sum += round_bf16_if(p.fast, shared_sum);
      }
      p.out[row0 + r] = round_bf16_if(p.fast && p.round_sum, sum);
    }
    __syncthreads();  // y_s is rewritten for the next tile
  }
}

// ---- expert_up at decode (one token, tensor-core formats): the same shape as expert_down's decode kernel
//
// A block owns 16 rows of every chunk's w1 and w3 (the item kernel: items of 16 rows whose K is split over 8
// warps, two rounds of loads each at n = 1). Its 32 warps take (chunk, matrix, K slice) tasks — half of K of a
// routed w1 or w3 tile, the shared expert's in twice shared_slices() slices: 32 tasks of 16 KiB at V4 — over the
// token's row, staged once per block in each format in use (act_quant'ed there in fast numerics); the block then
// applies the SwiGLU per chunk from shared memory. The shared expert's tasks need nothing from route and run
// before the wait for it, as in the item kernel. Only 128 tiles (I = 2048) for 132 SMs, so a block is an SM's
// only one: 32 warps of 64 registers issue more than 16 of 112, and the kernel is issue-bound (bench_moe n = 1
// is faster with 32).
// A tensor-parallel rank's slice of I has fewer tiles (`--tp 2`: 64 for 132 SMs), and a tile's chain took as long
// as at full width (20 µs exposed against 22): the blocks of an sm_90 cluster then share a tile, each taking
// its share of every task's K, and the SwiGLU reads the cluster's partial sums through distributed shared memory
// (up_decode_cluster picks the size).
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

// Grid: clusters of S blocks (S = 1: no cluster), ≤ one cluster per 16-row tile of I (looping over tiles);
// dynamic smem up_decode_smem_bytes(p). Block rank r of a cluster takes K slices [r·slices, (r+1)·slices) of
// every task's S·slices.
__global__ void __launch_bounds__(kUpDecodeThreads, 1) expert_up_decode_kernel(ExpertParams p) {
  static_assert(kRoutedUpSlices <= kMaxSharedSlices, "y_s holds kMaxSharedSlices slices per matrix");
  extern __shared__ float4 smem_up_decode[];
  __shared__ int shift_s[2];            // [routed, shared]
  __shared__ float block_max[kUpDecodeWarps];
  __shared__ float y_s[kMaxTopK + 1][2][kMaxSharedSlices][kMmaRows];  // [chunk][w1, w3][slice][row]
  __shared__ int pair_s[kMaxTopK + 1];    // [chunk] its pair (one token: one pair per chunk)
  __shared__ float weight_s[kMaxTopK + 1];  // [chunk] the pair's routing weight
  const int warp = int(threadIdx.x / 32);
  const int S = cluster_blocks(), rank = cluster_rank();
  uint4* xs_routed = reinterpret_cast<uint4*>(smem_up_decode);
  uint4* xs_shared = xs_routed + decode_stride(p.D);
  const int sh_wanted = kRoutedUpSlices * shared_slices(p.shared_up, p.routed_up);
  const int sh_slices = sh_wanted < kMaxSharedSlices ? sh_wanted : kMaxSharedSlices;  // a block's
  const int shared_tasks = p.has_shared ? 2 * sh_slices : 0;
  const int first_routed = shared_chunks(p.n, p.shared_items);  // chunk 0 is the shared expert's where the plan has it
  const int64_t tiles = (p.I + kMmaRows - 1) / kMmaRows;
  const bool shared_fp4 = p.shared_up.format == WFormat::kFP4, routed_fp4 = p.routed_up.format == WFormat::kFP4;
  const auto token = [](int) { return 0; };
  // The token's row (x was written before route ran: it is read before the wait, as the item kernel does).
  if (routed_fp4) stage_rows_mma<WFormat::kFP4>(p.x, p.D, 1, 1, token, p.fast, xs_routed, &shift_s[0], block_max);
  else stage_rows_mma<WFormat::kFP8>(p.x, p.D, 1, 1, token, p.fast, xs_routed, &shift_s[0], block_max);
  if (p.has_shared) {
    if (shared_fp4) stage_rows_mma<WFormat::kFP4>(p.x, p.D, 1, 1, token, p.fast, xs_shared, &shift_s[1], block_max);
    else stage_rows_mma<WFormat::kFP8>(p.x, p.D, 1, 1, token, p.fast, xs_shared, &shift_s[1], block_max);
  }
  bool waited = false;
  for (int64_t tile = blockIdx.x / S; tile < tiles; tile += gridDim.x / S) {
    const int64_t row0 = tile * kMmaRows;
    const int rows_valid = int(std::min<int64_t>(kMmaRows, p.I - row0));
    for (int task = warp; task < shared_tasks; task += kUpDecodeWarps) {
      const int matrix = task / sh_slices, slice = task % sh_slices;
      const MatView& w = matrix == 0 ? p.shared_w1 : p.shared_w3;
      float* y = y_s[0][matrix][slice];
      const int k_slice = rank * sh_slices + slice, k_slices = S * sh_slices;
      if (shared_fp4) up_task_mma<WFormat::kFP4>(p, w, row0, rows_valid, k_slice, k_slices, xs_shared, shift_s[1], y);
      else up_task_mma<WFormat::kFP8>(p, w, row0, rows_valid, k_slice, k_slices, xs_shared, shift_s[1], y);
    }
    if (!waited) {  // the routed tasks read route's plan
      pdl_wait_predecessor();
      pdl_trigger();
      waited = true;
      // The SwiGLU's pairs and weights, asked for now by warp 0 (shared tasks only, done): the epilogue after
      // the barrier would otherwise wait two more L2 round trips.
      const int lane = int(threadIdx.x % 32);
      if (warp == 0 && lane < p.plan.counters[0]) {
        const bool shared = lane < first_routed;
        const int pair0 = shared ? shared_chunk(p, 0).pair0 : p.plan.chunk_pair[lane];
        pair_s[lane] = pair0;
        weight_s[lane] = shared ? 1.0f : p.plan.pair_weight[pair0];
      }
    }
    const int chunks = p.plan.counters[0];  // the shared chunk (where held), then one per chosen local expert
    // Routed task j is task shared_tasks + j of the tile: warps continue round-robin after the shared ones.
    const int first = ((warp - shared_tasks) % kUpDecodeWarps + kUpDecodeWarps) % kUpDecodeWarps;
    const MatFormat& f = p.routed_up;
    for (int task = first; task < 2 * kRoutedUpSlices * (chunks - first_routed); task += kUpDecodeWarps) {
      const int c = first_routed + task / (2 * kRoutedUpSlices);
      const int matrix = task / kRoutedUpSlices % 2, slice = task % kRoutedUpSlices;
      const ExpertPtrs e = p.experts[chunk_at(p.plan, c).expert];
      const MatView w = matrix == 0 ? MatView{e.w1, e.s1, f.row_bytes, f.scale_cols, f.tiled}
                                    : MatView{e.w3, e.s3, f.row_bytes, f.scale_cols, f.tiled};
      float* y = y_s[c][matrix][slice];
      const int k_slice = rank * kRoutedUpSlices + slice, k_slices = S * kRoutedUpSlices;
      if (routed_fp4) up_task_mma<WFormat::kFP4>(p, w, row0, rows_valid, k_slice, k_slices, xs_routed, shift_s[0], y);
      else up_task_mma<WFormat::kFP8>(p, w, row0, rows_valid, k_slice, k_slices, xs_routed, shift_s[0], y);
    }
    cluster_barrier(S);  // every task's rows, the cluster's, are in y_s
    // The cluster's blocks share the rows: block r the (chunk, row) items i ≡ r (mod S), summing the slices in
    // K order (rank, then slice) whatever S is.
    for (int i = rank + S * int(threadIdx.x); i < chunks * kMmaRows; i += S * kUpDecodeThreads) {
      const int c = i / kMmaRows, r = i % kMmaRows;
      if (r >= rows_valid) continue;
      const bool shared = c < first_routed;
      const int slices = shared ? sh_slices : kRoutedUpSlices;
      float g = 0.0f, u = 0.0f;
      for (int q = 0; q < S; ++q) {
        const float(*yq)[2][kMaxSharedSlices][kMmaRows] = cluster_shared(y_s, q, S);
        for (int s = 0; s < slices; ++s) {
          g = q == 0 && s == 0 ? yq[c][0][0][r] : g + yq[c][0][s][r];
          u = q == 0 && s == 0 ? yq[c][1][0][r] : u + yq[c][1][s][r];
        }
      }
      const WFormat f = shared ? p.shared_up.format : p.routed_up.format;
      p.plan.h[int64_t(pair_s[c]) * p.I + row0 + r] = hidden(p, f, g, u, weight_s[c]);
    }
    cluster_barrier(S);  // y_s is rewritten for the next tile; a peer may still read it until here
  }
  if (!waited) {  // a block without tiles still lets the successor launch
    pdl_wait_predecessor();
    pdl_trigger();
  }
}

}  // namespace

// One token whose w1 and w3 all go through the tensor cores, with its chunks (k routed + the shared) in y_s.
bool expert_up_decode_fits(const ExpertParams& p) {
  return p.n == 1 && p.shared_items == p.has_shared && p.k <= kMaxTopK && p.routed_up.tensor_cores &&
         p.shared_up.tensor_cores;
}

// One token: each warp stages one activation row (8 KiB at V4 sizes), 66 KiB a block, two blocks per SM. At two
// tokens the rows double and one block fits an SM: measured slower than the item kernel (bench_moe n = 2).
bool expert_down_decode_fits(const ExpertParams& p) {
  return p.n == 1 && p.shared_items == p.has_shared && p.routed_down.tensor_cores && p.shared_down.tensor_cores;
}

// Blocks a cluster of expert_up's decode kernel: the most (≤ kMaxUpCluster) whose tiles × blocks still fit the
// SMs, 1 where the tiles fill them alone or clusters are not there (no PDL: before sm_90).
constexpr int kMaxUpCluster = 4;
int up_decode_cluster(int64_t tiles, int sm_count, bool sm90) {
  int S = 1;
  while (sm90 && S < kMaxUpCluster && tiles * S * 2 <= sm_count) S *= 2;
  return S;
}

void launch_expert_up_decode(const ExpertParams& p, int sm_count, bool pdl, cudaStream_t stream) {
  const size_t smem = up_decode_smem_bytes(p);
  const auto kernel = expert_up_decode_kernel;
  const int per_sm = prepare_kernel(reinterpret_cast<const void*>(kernel), kUpDecodeThreads, smem);
  const int64_t tiles = (p.I + kMmaRows - 1) / kMmaRows;
  const int S = up_decode_cluster(tiles, sm_count, pdl);
  const int clusters = int(std::min<int64_t>(tiles, int64_t(per_sm) * sm_count / S));
  launch_pdl(kernel, dim3(unsigned(clusters * S)), dim3(kUpDecodeThreads), smem, stream, pdl, p, S);
}

void launch_expert_down_decode(const ExpertParams& p, int sm_count, bool pdl, cudaStream_t stream) {
  const size_t smem = decode_smem_bytes(p);
  const auto kernel = expert_down_decode_kernel;
  const int64_t tiles = (p.D + kMmaRows - 1) / kMmaRows;
  const int grid = int(std::min<int64_t>(tiles, resident_blocks(reinterpret_cast<const void*>(kernel), smem, sm_count)));
  launch_pdl(kernel, dim3(unsigned(grid)), dim3(kExpertThreads), smem, stream, pdl, p);
}

}  // namespace dsv4::cuda::moe
