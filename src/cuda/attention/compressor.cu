// attention family (CUDA): CudaOps::compressor, the streaming KV compressor (spec §7; CPU reference:
// src/cpu/attention.cpp). Each sequence of the batch feeds a chunk of n tokens at positions pos0 .. pos0+n−1:
//   1. kv / gate projections of the chunks (the gemm family's linear_pair_f32): fp32 in every numerics, as
//      DeepSeek's compressor Linears are; one call over all the batch's rows when they are consecutive rows of
//      one activation buffer (the forward pass's), else one per sequence;
//   2. compressor_pool_kernel: every window completed inside a chunk is pooled (softmax over positions, per
//      channel), reading its tokens from the chunk or, for tokens before pos0, from the state;
//   3. compressor_state_kernel: each state becomes what the CPU's token-by-token loop leaves behind;
//   4. compressor_finish_kernel: each emitted entry is RMS-normed and RoPE'd at w·m (norm_rope_row.cuh, the
//      CPU's rms_norm bit for bit), simulated per EntrySim (sim_row.cuh, the quant ops' arithmetic) and stored
//      into its sequence's entries cache (compact caches through kv_cache.cuh's row store).
// Steps 2–4 cover the batch in one launch each (up to kMaxSequences sequences: a table of them in the kernel
// parameters, as the attention's); a block finds its sequence by its index (state) or a binary search (the
// others, by emitted entry).
// Fast numerics (fast-numerics.md §7 step 7) keep steps 1–3 fp32 and round the pooled row to bf16 as the pool
// kernel writes it (CompressorKernelParams::fast); step 4 rounds where the norm, RoPE and simulation ops do.
//
// State layout (CompressorState, width = coff·c): rows base + k hold token k of the current window
// (base = m with overlap, 0 without); with overlap, rows 0..m−1 hold the previous complete window (the CPU
// copies the current rows there when a window completes). Scores include ape.
#include <algorithm>
#include <cmath>

#include "cuda/attention/attention.h"
#include "cuda/attention/kv_cache.cuh"
#include "cuda/common/fp_grid.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/sequence_table.cuh"
#include "cuda/common/check.h"
#include "cuda/cuda_ops.h"
#include "cuda/norm_rope/norm_rope_row.cuh"
#include "cuda/quant/sim_row.cuh"

namespace dsv4 {
namespace cuda {
namespace {

constexpr int kPoolThreads = 128;
constexpr int kStateThreads = 256;
constexpr int kMaxSequences = 64;  // per launch: the table stays within the 4 KB of classic kernel parameters
constexpr int kMaxHadamardDim = 1024;  // hadamard_sim_fp4's

// One sequence of a launch: its chunk of n tokens at positions pos0 .. pos0 + n − 1.
struct CompressorSequence {
  float* state_kv;     // [coff·m, width] its state at the start of the chunk; compressor_state_kernel rewrites
  float* state_score;  // [coff·m, width] in place the cells the chunk changes
  uint8_t* entries;    // its entries cache, entry w at row w: fp32 rows of c, or compact rows (the launch's layout)
  int64_t pos0;
  int32_t row0, n;     // its projections: rows [row0, row0 + n) of the launch's kv / gate
  int32_t entry0;      // its emitted entries pos0/m, pos0/m + 1, ... are the launch's pooled rows entry0, ...
};

struct CompressorKernelParams {
  const float* kv;    // [rows, width] the launch's chunks' projections
  const float* gate;  // [rows, width] their gate logits, ape not added
  const float* ape;   // [m, width]
  float* pooled;      // [entries, c] the launch's emitted entries, raw (before norm, RoPE and simulation)
  int64_t m, c, width;
  bool overlap;
  bool fast;          // fast numerics: the pooled entries are rounded to bf16
  // compressor_finish_kernel only
  NormRopeRow norm;      // gain w.norm, RoPE on channels [c − rope_dim, c) (compressed θ)
  EntrySim sim;
  float hadamard_norm;   // kHadamardFp4: 1 / sqrt(c) rounded to fp32, as hadamard_sim_fp4 computes it
  CacheLayout layout;    // the entries caches': compact rows, or kF32 (fp32 rows of c)
  int sequences;
  CompressorSequence seq[kMaxSequences];
};
static_assert(sizeof(CompressorKernelParams) <= 4096, "compressor: the kernel parameters exceed 4 KB");

// The sequence of the launch's emitted entry e: the last one whose entry0 ≤ e (a sequence that emits nothing
// shares its entry0 with the next one, which comes after it). Uniform across the block.
__device__ __forceinline__ const CompressorSequence& sequence_of_entry(const CompressorKernelParams& p, int64_t e) {
  return sequence_at(p.seq, p.sequences, e, &CompressorSequence::entry0);
}

// Token kk (0 ≤ kk < m) of window ww of sequence s, column col: its kv value and score, from the chunk when it
// is in it (in_chunk; ape_v = ape[kk, col], which the caller reads before waiting for the predecessor: a
// weight, an HBM round trip at decode), else from the state as it was at the start of the chunk (window
// pos0/m: current rows; the one before: previous rows, which also hold the initial (0, −inf) before the first
// window completes).
__device__ __forceinline__ bool in_chunk(const CompressorKernelParams& p, const CompressorSequence& s, int64_t ww,
                                         int64_t kk) {
  return ww * p.m + kk >= s.pos0;
}
__device__ __forceinline__ float2 window_cell(const CompressorKernelParams& p, const CompressorSequence& s, int64_t ww,
                                              int64_t kk, int64_t col, float ape_v) {
  if (in_chunk(p, s, ww, kk)) {
    const int64_t at = (s.row0 + ww * p.m + kk - s.pos0) * p.width + col;
    return make_float2(p.kv[at], __fadd_rn(p.gate[at], ape_v));
  }
  const int64_t row = ww == s.pos0 / p.m ? (p.overlap ? p.m : 0) + kk : kk;
  return make_float2(s.state_kv[row * p.width + col], s.state_score[row * p.width + col]);
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
__device__ __forceinline__ void load_candidates(const CompressorKernelParams& p, const CompressorSequence& s, int64_t w,
                                                int64_t k0, int64_t ch, int64_t n_cand,
                                                const float (&ape_v)[kCandBatch], float2 (&cell)[kCandBatch]) {
#pragma unroll
  for (int j = 0; j < kCandBatch; ++j) {
    const Cell x = candidate(p, w, k0 + j, ch);
    cell[j] = k0 + j < n_cand ? window_cell(p, s, x.ww, x.kk, x.col, ape_v[j]) : make_float2(0.0f, -INFINITY);
  }
}

__device__ __forceinline__ void load_candidate_ape(const CompressorKernelParams& p, const CompressorSequence& s,
                                                   int64_t w, int64_t k0, int64_t ch, int64_t n_cand,
                                                   float (&ape_v)[kCandBatch]) {
#pragma unroll
  for (int j = 0; j < kCandBatch; ++j) {
    const Cell x = candidate(p, w, k0 + j, ch);
    ape_v[j] = k0 + j < n_cand && in_chunk(p, s, x.ww, x.kk) ? p.ape[x.kk * p.width + x.col] : 0.0f;
  }
}

// grid (entries emitted by the launch's chunks, ceil(c / kPoolThreads)); thread = one channel of one entry.
// Same order and roundings as the CPU (products rounded before the adds); only expf's last bit may differ.
// The first batch's ape values are read before the wait, and kept with its cells for the second pass.
__global__ void __launch_bounds__(kPoolThreads)
compressor_pool_kernel(const __grid_constant__ CompressorKernelParams p) {
  const int64_t e = blockIdx.x, ch = int64_t(blockIdx.y) * kPoolThreads + threadIdx.x;
  const CompressorSequence& s = sequence_of_entry(p, e);
  const int64_t w = s.pos0 / p.m + (e - s.entry0), n_cand = p.overlap ? 2 * p.m : p.m;
  float ape_v[kCandBatch];
  if (ch < p.c) load_candidate_ape(p, s, w, 0, ch, n_cand, ape_v);
  pdl_wait();
  if (ch >= p.c) return;
  float2 first[kCandBatch], cell[kCandBatch];
  load_candidates(p, s, w, 0, ch, n_cand, ape_v, first);
  float mx = -INFINITY;
  for (int64_t k0 = 0; k0 < n_cand; k0 += kCandBatch) {
    if (k0 > 0) {
      load_candidate_ape(p, s, w, k0, ch, n_cand, ape_v);
      load_candidates(p, s, w, k0, ch, n_cand, ape_v, cell);
    }
#pragma unroll
    for (int j = 0; j < kCandBatch; ++j)
      if (k0 + j < n_cand) mx = fmaxf(mx, (k0 == 0 ? first[j] : cell[j]).y);
  }
  float denom = 0.0f, num = 0.0f;
  for (int64_t k0 = 0; k0 < n_cand; k0 += kCandBatch) {
    if (k0 > 0) {
      load_candidate_ape(p, s, w, k0, ch, n_cand, ape_v);
      load_candidates(p, s, w, k0, ch, n_cand, ape_v, cell);
    }
#pragma unroll
    for (int j = 0; j < kCandBatch; ++j) {
      if (k0 + j >= n_cand) break;
      const float2 x = k0 == 0 ? first[j] : cell[j];
      const float ex = expf(x.y - mx);
      denom = __fadd_rn(denom, ex);
      num = __fadd_rn(num, __fmul_rn(ex, x.x));
    }
  }
  p.pooled[e * p.c + ch] = round_bf16_if(p.fast, num / denom);
}

// grid (ceil(m · width / kStateThreads), sequences): thread = column col of in-window slot kk of one sequence,
// for both the current row and (overlap) the previous row, so reading the old current row and rewriting it
// cannot race. Only the cells the chunk changes are read and written: at decode the slot of the step's token
// (and, when a window completes, the previous rows), whose ape value is read before the wait.
__global__ void __launch_bounds__(kStateThreads)
compressor_state_kernel(const __grid_constant__ CompressorKernelParams p) {
  const CompressorSequence& s = p.seq[blockIdx.y];
  const int64_t cell = int64_t(blockIdx.x) * kStateThreads + threadIdx.x;
  const int64_t kk = cell / p.width, col = cell % p.width;
  const int64_t end = s.pos0 + s.n, window_at_start = s.pos0 / p.m;
  // With overlap, the last window completed in the chunk (if any) becomes the previous window.
  const bool shift = cell < p.m * p.width && p.overlap && end / p.m > window_at_start;
  // The current row of slot kk takes the chunk's last token at a position ≡ kk (mod m), if there is one.
  const int64_t last = end - 1 >= kk ? end - 1 - (end - 1 - kk) % p.m : -1;
  const bool take = cell < p.m * p.width && last >= s.pos0;
  const float ape_v = take || (shift && in_chunk(p, s, end / p.m - 1, kk)) ? p.ape[kk * p.width + col] : 0.0f;
  pdl_wait();
  if (!shift && !take) return;
  const int64_t cur = ((p.overlap ? p.m : 0) + kk) * p.width + col;
  const float2 prev = shift ? window_cell(p, s, end / p.m - 1, kk, col, ape_v) : float2{};  // before any write
  const float2 current = take ? window_cell(p, s, last / p.m, kk, col, ape_v) : float2{};
  if (shift) {
    s.state_kv[kk * p.width + col] = prev.x;
    s.state_score[kk * p.width + col] = prev.y;
  }
  if (take) {
    s.state_kv[cur] = current.x;
    s.state_score[cur] = current.y;
  }
}

// grid (entries emitted by the launch's chunks), kNormRopeThreads threads, dynamic smem c floats: one block per
// entry, which it norms and rotates in shared memory (norm_rope_row, its constants gathered before the wait),
// simulates there (a warp per scale block; the Hadamard butterflies over the block) and stores: what rms_norm,
// rope, sim_fp8 / hadamard_sim_fp4 and (compact caches) cache_store compute one after the other.
__global__ void __launch_bounds__(kNormRopeThreads)
compressor_finish_kernel(const __grid_constant__ CompressorKernelParams p) {
  extern __shared__ float row_s[];  // [c]
  const int64_t e = blockIdx.x;
  const CompressorSequence& s = sequence_of_entry(p, e);
  const int64_t w = s.pos0 / p.m + (e - s.entry0), pos = w * p.m;  // RoPE at the window's FIRST token position
  const NormRopeRowConsts consts = norm_rope_row_consts(p.norm, pos);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, warps = kNormRopeThreads / 32;
  pdl_wait();
  norm_rope_row(p.norm, consts, p.pooled + e * p.c, pos, row_s, nullptr);
  __syncthreads();
  if (p.sim == EntrySim::kFp8NoPe) {
    for (int64_t b0 = 64 * warp; b0 < p.norm.offset; b0 += 64 * warps)
      sim_fp8_block(row_s, b0, min(p.norm.offset, b0 + 64), lane, p.fast);
  } else if (p.sim == EntrySim::kHadamardFp4) {
    const int dim = int(p.c);
    for (int i = tid; i < dim; i += kNormRopeThreads) row_s[i] = round_bf16_if(p.fast, row_s[i]);
    __syncthreads();
    for (int h = 1; h < dim; h *= 2) {
      hadamard_stage(row_s, dim, h, tid, kNormRopeThreads);
      __syncthreads();
    }
    for (int b0 = 32 * warp; b0 < dim; b0 += 32 * warps)
      fp4_block_round_trip(row_s, row_s, b0, lane, p.hadamard_norm, p.fast);
  }
  __syncthreads();
  if (p.layout.format == CacheFormat::kF32) {
    float* out = reinterpret_cast<float*>(s.entries) + w * p.c;
    for (int64_t ch = tid; ch < p.c; ch += kNormRopeThreads) out[ch] = row_s[ch];
  } else {
    uint8_t* row = s.entries + w * p.layout.row_bytes;
    for (int item = warp; item < cache_row_items(p.layout); item += warps)
      cache_store_item(p.layout, row_s, row, item, lane);
  }
}

// The batch's rows and emitted entries, every sequence checked (alone, and against the first: one set of weights
// and one simulation); `finish`: also the entries caches, which step 4 writes (one layout for the batch).
struct BatchSize {
  int64_t rows = 0, entries = 0;
};
BatchSize check_batch(const CudaOps& ops, std::span<const CompressorParams> batch, bool finish) {
  BatchSize size;
  if (batch.empty()) return size;
  const ModelConfig& config = ops.config();
  const CompressorWeights& w = *batch[0].weights;
  const int64_t m = w.ratio, c = w.width, width = (w.overlap ? 2 : 1) * c;
  DSV4_CHECK(m >= 1 && c >= 1, "compressor: ratio ", m, ", width ", c);
  DSV4_CHECK(w.wkv.rows == width && w.wgate.rows == width && w.wkv.cols == config.dim && w.wgate.cols == config.dim,
             "compressor: wkv [", w.wkv.rows, ", ", w.wkv.cols, "] / wgate [", w.wgate.rows, ", ", w.wgate.cols,
             "], expected [", width, ", ", config.dim, "]");
  DSV4_CHECK(c >= config.rope_dim, "compressor: width ", c, " is narrower than ", config.rope_dim, " rope channels");
  DSV4_CHECK(int64_t(w.ape.size()) == m * width, "compressor: ape has ", w.ape.size(), " values, expected ",
             m * width);
  if (finish) {
    DSV4_CHECK(int64_t(w.norm.size()) == c, "compressor: the norm's gain has ", w.norm.size(), " values, entries ", c);
    DSV4_CHECK(c <= kNormRopeMaxDim && (c - config.rope_dim) % 2 == 0, "compressor: entries of ", c,
               " channels with ", config.rope_dim, " rope channels (at most ", kNormRopeMaxDim,
               ", an even number without RoPE)");
    DSV4_CHECK(batch[0].sim != EntrySim::kHadamardFp4 || (c >= 32 && c <= kMaxHadamardDim && (c & (c - 1)) == 0),
               "compressor: Hadamard FP4 entries of ", c, " channels (a power of two in [32, ", kMaxHadamardDim,
               "])");
  }
  const CacheLayout* layout = ops.compact_cache(batch[0].state->entries);
  for (const CompressorParams& p : batch) {
    DSV4_CHECK(p.weights == &w && p.sim == batch[0].sim,
               "compressor: the sequences of one batch differ in more than their chunks and states");
    const CompressorState& state = *p.state;
    DSV4_CHECK(state.kv && state.score && state.entries, "compressor: state buffers are required");
    DSV4_CHECK(p.pos0 >= 0 && p.n >= 0, "compressor: pos0 ", p.pos0, ", n ", p.n);
    const int64_t first = p.pos0 / m, count = (p.pos0 + p.n) / m - first;
    DSV4_CHECK(first + count <= state.max_entries, "compressor: entry ", first + count - 1, " is past the state's ",
               state.max_entries, " entries");
    if (finish) {
      const CacheLayout* l = ops.compact_cache(state.entries);
      DSV4_CHECK(!l == !layout && (!l || (l->format == layout->format && l->row_bytes == layout->row_bytes)),
                 "compressor: the entries caches of one batch must share a format");
      DSV4_CHECK(!l || l->dim == c, "compressor: entries of ", c, " channels into a cache of ", l->dim);
      DSV4_CHECK(!l || first + count <= l->rows, "compressor: entry ", first + count - 1, " is past the cache's ",
                 l->rows, " rows");
    }
    size.rows += p.n;
    size.entries += count;
  }
  DSV4_CHECK(size.rows <= INT32_MAX && size.entries <= INT32_MAX, "compressor: ", size.rows, " tokens, ",
             size.entries, " entries in one batch");
  return size;
}

// Steps 2–3 (and 4 when `finish`) of the checked batch on its projections kv, gate [rows, width] (the batch's
// chunks in order); the emitted entries pooled into `pooled` [entries, c], in the batch's order. Launches of up
// to kMaxSequences sequences (those with tokens), each pool, state, finish: the pool kernel reads the states as
// they were at the start of the chunks, before the state kernel (same stream) rewrites them.
void launch_batch(CudaOps& ops, std::span<const CompressorParams> batch, const float* kv, const float* gate,
                  float* pooled, bool finish) {
  const CompressorWeights& w = *batch[0].weights;
  CompressorKernelParams k{};
  k.ape = ops.dev(w.ape);
  k.m = w.ratio;
  k.c = w.width;
  k.width = (w.overlap ? 2 : 1) * w.width;
  k.overlap = w.overlap;
  k.fast = ops.fast();
  if (finish) {
    const ModelConfig& config = ops.config();
    k.norm = {ops.dev(w.norm), ops.inv_freq(RopeKind::kCompressed), k.c, k.c - config.rope_dim,
              float(config.norm_eps), ops.fast()};
    k.sim = batch[0].sim;
    k.hadamard_norm = float(1.0 / std::sqrt(double(k.c)));
    if (const CacheLayout* l = ops.compact_cache(batch[0].state->entries)) k.layout = *l;
  }
  const bool pdl = ops.props().major >= 9;
  int64_t row = 0, entry = 0, launch_row = 0, launch_entry = 0;  // the batch's rows and entries so far
  const auto launch = [&] {
    if (k.sequences == 0) return;
    k.kv = kv + launch_row * k.width;
    k.gate = gate + launch_row * k.width;
    k.pooled = pooled + launch_entry * k.c;
    const int64_t entries = entry - launch_entry;
    if (entries > 0) {
      const dim3 grid(unsigned(entries), unsigned(ceil_div(k.c, kPoolThreads)));
      launch_pdl(compressor_pool_kernel, grid, dim3(kPoolThreads), 0, ops.stream(), pdl, k);
    }
    const dim3 grid(unsigned(ceil_div(k.m * k.width, kStateThreads)), unsigned(k.sequences));
    launch_pdl(compressor_state_kernel, grid, dim3(kStateThreads), 0, ops.stream(), pdl, k);
    if (finish && entries > 0)
      launch_pdl(compressor_finish_kernel, dim3(unsigned(entries)), dim3(kNormRopeThreads),
                 size_t(k.c) * sizeof(float), ops.stream(), pdl, k);
    k.sequences = 0;
    launch_row = row;
    launch_entry = entry;
  };
  for (const CompressorParams& p : batch) {
    if (p.n == 0) continue;
    if (k.sequences == kMaxSequences) launch();
    k.seq[k.sequences++] = {p.state->kv, p.state->score, reinterpret_cast<uint8_t*>(p.state->entries), p.pos0,
                            int32_t(row - launch_row), int32_t(p.n), int32_t(entry - launch_entry)};
    row += p.n;
    entry += (p.pos0 + p.n) / k.m - p.pos0 / k.m;
  }
  launch();
}

}  // namespace

int64_t compressor_pool(CudaOps& ops, std::span<const CompressorParams> batch, const float* kv, const float* gate,
                        float* pooled) {
  const BatchSize size = check_batch(ops, batch, /*finish=*/false);
  if (size.rows > 0) launch_batch(ops, batch, kv, gate, pooled, /*finish=*/false);
  return size.entries;
}

}  // namespace cuda

void CudaOps::compressor(std::span<const CompressorParams> batch) {
  const cuda::BatchSize size = cuda::check_batch(*this, batch, /*finish=*/true);
  if (size.rows == 0) return;
  const CompressorWeights& w = *batch[0].weights;
  const int64_t D = config_.dim, width = (w.overlap ? 2 : 1) * w.width;
  auto* kv = static_cast<float*>(workspace(cuda::kWsCompressorProj, size_t(2 * size.rows * width) * sizeof(float)));
  float* gate = kv + size.rows * width;
  // The forward pass hands the chunks as consecutive rows of one buffer (x_i = x_0 + row0_i · D): one projection
  // over all of them, one weight pass instead of one per sequence.
  bool consecutive = true;
  int64_t row = 0;
  for (const CompressorParams& p : batch) {
    consecutive = consecutive && (p.n == 0 || p.x == batch[0].x + row * D);
    row += p.n;
  }
  if (consecutive) {
    linear_pair_f32(batch[0].x, D, size.rows, w.wkv, kv, width, w.wgate, gate, width);
  } else {
    row = 0;
    for (const CompressorParams& p : batch) {
      if (p.n > 0) linear_pair_f32(p.x, D, p.n, w.wkv, kv + row * width, width, w.wgate, gate + row * width, width);
      row += p.n;
    }
  }
  auto* pooled = static_cast<float*>(workspace(cuda::kWsCompressorEntries,
                                               size_t(std::max<int64_t>(size.entries, 1) * w.width) * sizeof(float)));
  cuda::launch_batch(*this, batch, kv, gate, pooled, /*finish=*/true);
}

}  // namespace dsv4
