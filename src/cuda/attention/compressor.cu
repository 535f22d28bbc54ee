// attention family (CUDA): CudaOps::compressor, the streaming KV compressor (spec §7; CPU reference:
// src/cpu/attention.cpp). A chunk of n tokens at positions pos0 .. pos0+n−1:
//   1. kv / gate projections of the chunk (the gemm family's linear_pair_f32): fp32 in every numerics, as
//      DeepSeek's compressor Linears are;
//   2. compressor_pool_kernel: every window completed inside the chunk is pooled (softmax over positions, per
//      channel), reading its tokens from the chunk or, for tokens before pos0, from the state;
//   3. compressor_state_kernel: the state becomes what the CPU's token-by-token loop leaves behind;
//   4. the emitted entries are RMS-normed, RoPE'd at w·m and simulated per EntrySim (norm_rope / quant ops).
// Fast numerics (fast-numerics.md §7 step 7) keep steps 1–3 fp32 and round the pooled row to bf16 as the pool
// kernel writes it (CompressorKernelParams::fast); the ops of step 4 round their own outputs.
//
// State layout (CompressorState, width = coff·c): rows base + k hold token k of the current window
// (base = m with overlap, 0 without); with overlap, rows 0..m−1 hold the previous complete window (the CPU
// copies the current rows there when a window completes). Scores include ape.
#include "cuda/attention/attention.h"
#include "cuda/attention/kv_cache.cuh"
#include "cuda/common/fp_grid.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/check.h"
#include "cuda/cuda_ops.h"

namespace dsv4 {
namespace cuda {
namespace {

constexpr int kPoolThreads = 128;
constexpr int kStateThreads = 256;

struct CompressorKernelParams {
  const float* kv;           // [n, width] the chunk's projections
  const float* gate;         // [n, width] the chunk's gate logits, ape not added
  const float* ape;          // [m, width]
  const float* state_kv;     // [coff·m, width] state at the start of the chunk
  const float* state_score;  // [coff·m, width]
  float* new_kv;             // [coff·m, width] state after the chunk (compressor_state_kernel only): the
  float* new_score;          // state buffers themselves — the kernel rewrites only the cells the chunk changes
  float* entries;            // [*, c]: entry w at row w − entries_row0
  int64_t pos0, n, m, c, width, first_entry, entries_row0;
  bool overlap;
  bool fast;                 // fast numerics: the pooled entries are rounded to bf16
};

// Token kk (0 ≤ kk < m) of window ww, column col: its kv value and score, from the chunk when it is in it
// (in_chunk; ape_v = ape[kk, col], which the caller reads before waiting for the predecessor: a weight, an HBM
// round trip at decode), else from the state as it was at the start of the chunk (window pos0/m: current
// rows; the one before: previous rows, which also hold the initial (0, −inf) before the first window
// completes).
__device__ __forceinline__ bool in_chunk(const CompressorKernelParams& p, int64_t ww, int64_t kk) {
  return ww * p.m + kk >= p.pos0;
}
__device__ __forceinline__ float2 window_cell(const CompressorKernelParams& p, int64_t ww, int64_t kk, int64_t col,
                                              float ape_v) {
  if (in_chunk(p, ww, kk)) {
    const int64_t at = (ww * p.m + kk - p.pos0) * p.width + col;
    return make_float2(p.kv[at], __fadd_rn(p.gate[at], ape_v));
  }
  const int64_t row = ww == p.pos0 / p.m ? (p.overlap ? p.m : 0) + kk : kk;
  return make_float2(p.state_kv[row * p.width + col], p.state_score[row * p.width + col]);
}

// Candidate k of entry w, channel ch, in the CPU's order: overlap → the previous window's A-half (columns
// [0, c)) then the current window's B-half (columns [c, 2c)); else the window's m tokens.
struct Cell {
  int64_t ww, kk, col;
};
__device__ __forceinline__ Cell candidate(const CompressorKernelParams& p, int64_t w, int64_t k, int64_t ch) {
  if (!p.overlap) return {w, k, ch};
  return k < p.m ? Cell{w - 1, k, ch} : Cell{w, k - p.m, p.c + ch};
}

// Candidates whose loads are in flight together: CSA's 2·4 in one batch, HCA's 128 in 8 (one loop iteration
// per candidate waited for each load in turn).
constexpr int kCandBatch = 16;

// Candidates k0 .. k0 + kCandBatch − 1 (those below n_cand) of entry w, channel ch; ape_v[j] is candidate
// k0 + j's ape value when it is in the chunk.
__device__ __forceinline__ void load_candidates(const CompressorKernelParams& p, int64_t w, int64_t k0, int64_t ch,
                                                int64_t n_cand, const float (&ape_v)[kCandBatch],
                                                float2 (&cell)[kCandBatch]) {
#pragma unroll
  for (int j = 0; j < kCandBatch; ++j) {
    const Cell x = candidate(p, w, k0 + j, ch);
    cell[j] = k0 + j < n_cand ? window_cell(p, x.ww, x.kk, x.col, ape_v[j]) : make_float2(0.0f, -INFINITY);
  }
}

__device__ __forceinline__ void load_candidate_ape(const CompressorKernelParams& p, int64_t w, int64_t k0, int64_t ch,
                                                   int64_t n_cand, float (&ape_v)[kCandBatch]) {
#pragma unroll
  for (int j = 0; j < kCandBatch; ++j) {
    const Cell x = candidate(p, w, k0 + j, ch);
    ape_v[j] = k0 + j < n_cand && in_chunk(p, x.ww, x.kk) ? p.ape[x.kk * p.width + x.col] : 0.0f;
  }
}

// grid (ceil(c / kPoolThreads), entries completed in the chunk); thread = one channel of one entry.
// Same order and roundings as the CPU (products rounded before the adds); only expf's last bit may differ.
// The first batch's ape values are read before the wait, and kept with its cells for the second pass.
__global__ void __launch_bounds__(kPoolThreads) compressor_pool_kernel(CompressorKernelParams p) {
  const int64_t ch = int64_t(blockIdx.x) * kPoolThreads + threadIdx.x;
  const int64_t w = p.first_entry + blockIdx.y, n_cand = p.overlap ? 2 * p.m : p.m;
  float ape_v[kCandBatch];
  if (ch < p.c) load_candidate_ape(p, w, 0, ch, n_cand, ape_v);
  pdl_wait();
  if (ch >= p.c) return;
  float2 first[kCandBatch], cell[kCandBatch];
  load_candidates(p, w, 0, ch, n_cand, ape_v, first);
  float mx = -INFINITY;
  for (int64_t k0 = 0; k0 < n_cand; k0 += kCandBatch) {
    if (k0 > 0) {
      load_candidate_ape(p, w, k0, ch, n_cand, ape_v);
      load_candidates(p, w, k0, ch, n_cand, ape_v, cell);
    }
#pragma unroll
    for (int j = 0; j < kCandBatch; ++j)
      if (k0 + j < n_cand) mx = fmaxf(mx, (k0 == 0 ? first[j] : cell[j]).y);
  }
  float denom = 0.0f, num = 0.0f;
  for (int64_t k0 = 0; k0 < n_cand; k0 += kCandBatch) {
    if (k0 > 0) {
      load_candidate_ape(p, w, k0, ch, n_cand, ape_v);
      load_candidates(p, w, k0, ch, n_cand, ape_v, cell);
    }
#pragma unroll
    for (int j = 0; j < kCandBatch; ++j) {
      if (k0 + j >= n_cand) break;
      const float2 x = k0 == 0 ? first[j] : cell[j];
      const float e = expf(x.y - mx);
      denom = __fadd_rn(denom, e);
      num = __fadd_rn(num, __fmul_rn(e, x.x));
    }
  }
  p.entries[(w - p.entries_row0) * p.c + ch] = round_bf16_if(p.fast, num / denom);
}

// grid ceil(m · width / kStateThreads): thread = column col of in-window slot kk, for both the current row
// and (overlap) the previous row, so reading the old current row and rewriting it cannot race. Only the cells
// the chunk changes are read and written: at decode the slot of the step's token (and, when a window
// completes, the previous rows), whose ape value is read before the wait.
__global__ void __launch_bounds__(kStateThreads) compressor_state_kernel(CompressorKernelParams p) {
  const int64_t cell = int64_t(blockIdx.x) * kStateThreads + threadIdx.x;
  const int64_t kk = cell / p.width, col = cell % p.width;
  const int64_t end = p.pos0 + p.n, window_at_start = p.pos0 / p.m;
  // With overlap, the last window completed in the chunk (if any) becomes the previous window.
  const bool shift = cell < p.m * p.width && p.overlap && end / p.m > window_at_start;
  // The current row of slot kk takes the chunk's last token at a position ≡ kk (mod m), if there is one.
  const int64_t last = end - 1 >= kk ? end - 1 - (end - 1 - kk) % p.m : -1;
  const bool take = cell < p.m * p.width && last >= p.pos0;
  const float ape_v = take || (shift && in_chunk(p, end / p.m - 1, kk)) ? p.ape[kk * p.width + col] : 0.0f;
  pdl_wait();
  if (!shift && !take) return;
  const int64_t cur = ((p.overlap ? p.m : 0) + kk) * p.width + col;
  const float2 prev = shift ? window_cell(p, end / p.m - 1, kk, col, ape_v) : float2{};  // before any write
  const float2 current = take ? window_cell(p, last / p.m, kk, col, ape_v) : float2{};
  if (shift) {
    p.new_kv[kk * p.width + col] = prev.x;
    p.new_score[kk * p.width + col] = prev.y;
  }
  if (take) {
    p.new_kv[cur] = current.x;
    p.new_score[cur] = current.y;
  }
}

}  // namespace

CompressorChunk compressor_pool(CudaOps& ops, const CompressorWeights& w, CompressorState& state, const float* kv,
                                const float* gate, int64_t pos0, int64_t n, float* entries, int64_t entries_row0) {
  const int64_t m = w.ratio, c = w.width, width = (w.overlap ? 2 : 1) * c;
  DSV4_CHECK(m >= 1 && c >= 1, "compressor: ratio ", m, ", width ", c);
  DSV4_CHECK(int64_t(w.ape.size()) == m * width, "compressor: ape has ", w.ape.size(), " values, expected ",
             m * width);
  DSV4_CHECK(state.kv && state.score && state.entries, "compressor: state buffers are required");
  DSV4_CHECK(pos0 >= 0 && n >= 0, "compressor: pos0 ", pos0, ", n ", n);
  const CompressorChunk chunk{pos0 / m, (pos0 + n) / m - pos0 / m};
  DSV4_CHECK(chunk.first_entry + chunk.count <= state.max_entries, "compressor: entry ",
             chunk.first_entry + chunk.count - 1, " is past the state's ", state.max_entries, " entries");
  if (n == 0) return chunk;

  CompressorKernelParams p{};
  p.kv = kv;
  p.gate = gate;
  p.ape = ops.dev(w.ape);
  p.state_kv = state.kv;
  p.state_score = state.score;
  p.new_kv = state.kv;  // in place: each state cell is read and written by one thread of the state kernel
  p.new_score = state.score;
  p.entries = entries;
  p.entries_row0 = entries_row0;
  p.pos0 = pos0;
  p.n = n;
  p.m = m;
  p.c = c;
  p.width = width;
  p.first_entry = chunk.first_entry;
  p.overlap = w.overlap;
  p.fast = ops.fast();
  const bool pdl = ops.props().major >= 9;
  if (chunk.count > 0) {
    DSV4_CHECK(chunk.count <= 65535, "compressor: ", chunk.count, " entries in one chunk");
    const dim3 grid(unsigned(ceil_div(c, kPoolThreads)), unsigned(chunk.count));
    launch_pdl(compressor_pool_kernel, grid, dim3(kPoolThreads), 0, ops.stream(), pdl, p);
  }
  // Runs after the pool kernel (same stream), which reads the state as it was at the start of the chunk.
  launch_pdl(compressor_state_kernel, dim3(unsigned(ceil_div(m * width, kStateThreads))), dim3(kStateThreads), 0,
             ops.stream(), pdl, p);
  return chunk;
}

}  // namespace cuda

void CudaOps::compressor(std::span<const CompressorParams> batch) {
  for (const CompressorParams& p : batch) {
    const CompressorWeights& w = *p.weights;
    CompressorState& state = *p.state;
    const float* x = p.x;
    const int64_t pos0 = p.pos0, n = p.n;
    const EntrySim sim = p.sim;
    const int64_t m = w.ratio, c = w.width, width = (w.overlap ? 2 : 1) * c;
    DSV4_CHECK(w.wkv.rows == width && w.wgate.rows == width && w.wkv.cols == config_.dim &&
                   w.wgate.cols == config_.dim,
               "compressor: wkv [", w.wkv.rows, ", ", w.wkv.cols, "] / wgate [", w.wgate.rows, ", ", w.wgate.cols,
               "], expected [", width, ", ", config_.dim, "]");
    DSV4_CHECK(c >= config_.rope_dim, "compressor: width ", c, " is narrower than ", config_.rope_dim, " rope channels");
    if (n == 0) continue;
    auto* kv = static_cast<float*>(workspace(cuda::kWsCompressorProj, size_t(2 * n * width) * sizeof(float)));
    float* gate = kv + n * width;
    linear_pair_f32(x, config_.dim, n, w.wkv, kv, width, w.wgate, gate, width);
    // A compact cache receives the chunk's entries from an fp32 scratch once they are normed, rotated and simulated.
    const cuda::CacheLayout* compact = compact_cache(state.entries);
    const int64_t first = pos0 / m, most = (pos0 + n) / m - first;
    float* scratch = compact ? static_cast<float*>(workspace(cuda::kWsCompressorEntries,
                                                             size_t(std::max<int64_t>(most, 1) * c) * sizeof(float)))
                             : nullptr;
    const cuda::CompressorChunk chunk = compact
                                            ? cuda::compressor_pool(*this, w, state, kv, gate, pos0, n, scratch, first)
                                            : cuda::compressor_pool(*this, w, state, kv, gate, pos0, n, state.entries, 0);
    if (chunk.count == 0) continue;
    float* out = compact ? scratch : state.entries + chunk.first_entry * c;
    rms_norm(out, &w.norm, chunk.count, c, out);
    // RoPE at each window's FIRST token position, w·m.
    rope(out, chunk.count, c, c - config_.rope_dim, 1, chunk.first_entry * m, m, RopeKind::kCompressed, false);
    if (sim == EntrySim::kFp8NoPe) sim_fp8(out, chunk.count, c, c - config_.rope_dim, 64);
    if (sim == EntrySim::kHadamardFp4) hadamard_sim_fp4(out, chunk.count, c);
    if (compact) {
      DSV4_CHECK(compact->dim == c, "compressor: entries of ", c, " channels into a cache of ", compact->dim);
      cuda::cache_store(*this, *compact, state.entries, out, c, chunk.count, chunk.first_entry, compact->rows);
    }
  }
}

}  // namespace dsv4
