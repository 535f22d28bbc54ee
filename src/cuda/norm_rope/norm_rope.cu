// norm_rope family (CUDA): RMSNorm (weighted or not) and interleaved partial RoPE, the same functions as
// src/cpu/norm_rope.cpp.
//
// rms_norm: one block per row, each thread sums the squares of its packs in fp32, warp shuffles then one
// shared-memory step finish the sum; then y = γ·(x·inv) with inv = 1 / sqrt(Σx²/dim + eps), the CPU's order
// (only the summation order differs). x and y may alias: a thread rewrites exactly the elements it read.
//
// norm_rope: one block per row, RMSNorm then RoPE on the row's rope channels, bit for bit the CPU's rms_norm
// followed by rope_kernel's rotation (norm_rope_row.cuh, which kv_finish's fused kernel shares).
//
// Fast numerics (the `bf16` flags): outputs rounded to bf16; the gain-less norm in bf16 arithmetic (the query
// re-norm, CpuOps::rms_norm_bf16).
//
// rope: a block covers consecutive rows; the cos/sin of each (position, pair) it needs are computed once into
// shared memory (fp64 sin/cos of the fp32 angle, rounded to fp32, as the CPU does), then each thread rotates
// one pair of one row with unfused fp32 multiplies and adds, so the result matches the CPU bit for bit up to
// the (rare) last-bit differences between CUDA's and the host's fp64 sin/cos. rope_spans runs rope's blocks
// for several sequences (each its own rows and first position) in one launch: a block finds its span by a
// binary search over the spans' first blocks.
#include <algorithm>

#include "cuda/common/check.h"
#include "cuda/common/fp_grid.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/elementwise/pack.cuh"
#include "cuda/norm_rope/norm_rope_row.cuh"
#include "cuda/norm_rope/rotate.cuh"

namespace dsv4 {

namespace {

using cuda::Pack;

// ---- rms_norm

constexpr int kNormMaxThreads = 256;

struct RmsNormParams {
  const float* x;      // [rows, dim]
  const float* gamma;  // [dim] or nullptr (unweighted)
  float* y;            // [rows, dim], may alias x
  int64_t dim;
  float eps;
  bool bf16;  // fast numerics
  // Where asked (N = 4, dim a multiple of 128): y's rows act_quant'ed too, E4m3Rows' codes and scales.
  uint8_t* codes = nullptr;
  float* scales = nullptr;
  int64_t scale_ld = 0;
};

// Sum over the block of one value per thread; every thread gets the total. blockDim.x is a multiple of 32.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float warp_sums[kNormMaxThreads / 32];
  __shared__ float total;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < warps ? warp_sums[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}

// A thread's first kHeldPacks packs stay in registers between the two passes, and their gains are read before
// the wait for the predecessor (a weight read after it is an HBM round trip on the decode step's path).
constexpr int kHeldPacks = 4;  // rows of up to 4·256·N channels are read once

template <int N>
__global__ void __launch_bounds__(kNormMaxThreads) rms_norm_kernel(RmsNormParams p) {
  const float* x = p.x + int64_t(blockIdx.x) * p.dim;
  float* y = p.y + int64_t(blockIdx.x) * p.dim;
  const int64_t first = int64_t(threadIdx.x) * N, step = int64_t(blockDim.x) * N;
  Pack<N> gain[kHeldPacks], held[kHeldPacks];
  const bool bf16_math = p.bf16 && !p.gamma;  // the gain-less norm of fast numerics
  const auto square = [&](float v) {
    if (!bf16_math) return v * v;
    v = cuda::round_bf16(v);
    return cuda::round_bf16(v * v);
  };
#pragma unroll
  for (int i = 0; i < kHeldPacks; ++i)
    if (p.gamma && first + i * step < p.dim) gain[i] = cuda::load_pack<N>(p.gamma + first + i * step);
  cuda::pdl_wait();
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kHeldPacks; ++i) {
    if (first + i * step >= p.dim) break;
    held[i] = cuda::load_pack<N>(x + first + i * step);
#pragma unroll
    for (int k = 0; k < N; ++k) sum += square(held[i].v[k]);
  }
  for (int64_t c = first + kHeldPacks * step; c < p.dim; c += step) {
    const Pack<N> v = cuda::load_pack<N>(x + c);
#pragma unroll
    for (int k = 0; k < N; ++k) sum += square(v.v[k]);
  }
  const float mean = block_sum(sum) / float(p.dim);
  const float inv = bf16_math ? cuda::round_bf16(1.0f / sqrtf(cuda::round_bf16(cuda::round_bf16(mean) + p.eps)))
                              : 1.0f / sqrtf(mean + p.eps);
  const auto normalize = [&](Pack<N> v, const Pack<N>& g) {
    if (p.gamma) {
#pragma unroll
      for (int k = 0; k < N; ++k) v.v[k] = cuda::round_bf16_if(p.bf16, g.v[k] * (v.v[k] * inv));
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k) v.v[k] = cuda::round_bf16_if(p.bf16, cuda::round_bf16_if(p.bf16, v.v[k]) * inv);
    }
    return v;
  };
  // A warp's pack of 4 covers 128 aligned columns (step is a multiple of 128): one act_quant block.
  const auto store = [&](int64_t c, const Pack<N>& v) {
    cuda::store_pack<N>(y + c, v);
    if constexpr (N == 4)
      if (p.codes)
        cuda::act_quant_store_warp(v.v, p.codes + int64_t(blockIdx.x) * p.dim + c,
                                   p.scales + c / 128 * p.scale_ld + blockIdx.x);
  };
#pragma unroll
  for (int i = 0; i < kHeldPacks; ++i) {
    if (first + i * step >= p.dim) break;
    store(first + i * step, normalize(held[i], gain[i]));
  }
  for (int64_t c = first + kHeldPacks * step; c < p.dim; c += step) {
    Pack<N> g{};
    if (p.gamma) g = cuda::load_pack<N>(p.gamma + c);
    store(c, normalize(cuda::load_pack<N>(x + c), g));
  }
}

// ---- norm_rope (the row routine: norm_rope_row.cuh)

struct NormRopeParams {
  float* x;  // [rows, dim], in place
  cuda::NormRopeRow row;
  int64_t rows_per_pos, pos0;  // row r at position pos0 + r / rows_per_pos
};

__global__ void __launch_bounds__(cuda::kNormRopeThreads) norm_rope_kernel(NormRopeParams p) {
  extern __shared__ float row_s[];  // [dim]
  float* x = p.x + int64_t(blockIdx.x) * p.row.dim;
  const int64_t pos = p.pos0 + int64_t(blockIdx.x) / p.rows_per_pos;
  const cuda::NormRopeRowConsts consts = cuda::norm_rope_row_consts(p.row, pos);
  cuda::pdl_wait();
  cuda::norm_rope_row(p.row, consts, x, pos, row_s, x);
}

// ---- rope

constexpr int kRopeThreads = 256;

struct RopeParams {
  float* x;                // [rows, row_stride], channels [offset, offset + 2·pairs) rotated in place
  const float* inv_freq;   // [pairs]
  int64_t rows, row_stride, offset;
  int64_t rows_per_pos;    // rows r .. share the position pos0 + (r / rows_per_pos) · pos_stride
  int64_t pos0, pos_stride;
  int pairs;
  int rows_per_block;      // kRopeThreads / pairs
  bool inverse;
  bool bf16;               // fast numerics: the rotated pair rounded to bf16
};

// Rows [block·rows_per_block, ..) of p. Every thread of the block calls it (the tables need the barrier).
__device__ __forceinline__ void rope_block(const RopeParams& p, int64_t block) {
  // cos/sin per (position slot, pair): a block's rows span at most rows_per_block distinct positions. They
  // depend on nothing the predecessor writes: computed (inv_freq read, the fp64 sin/cos) before the wait.
  __shared__ float cos_table[kRopeThreads], sin_table[kRopeThreads];
  const int64_t row0 = block * p.rows_per_block;
  const int64_t group0 = row0 / p.rows_per_pos;
  const int64_t last_row = min(row0 + p.rows_per_block, p.rows) - 1;
  const int slots = int(last_row / p.rows_per_pos - group0) + 1;
  const int local = threadIdx.x / p.pairs, pair = threadIdx.x % p.pairs;
  if (local < slots) {
    const int64_t pos = p.pos0 + (group0 + local) * p.pos_stride;
    const float angle = __fmul_rn(float(pos), p.inv_freq[pair]);  // fp32 angle, as the reference computes it
    double s, c;
    sincos(double(angle), &s, &c);
    cos_table[threadIdx.x] = float(c);
    sin_table[threadIdx.x] = p.inverse ? -float(s) : float(s);
  }
  cuda::pdl_wait();
  __syncthreads();
  const int64_t r = row0 + local;
  if (local >= p.rows_per_block || r >= p.rows) return;
  const int slot = int(r / p.rows_per_pos - group0);
  const float c = cos_table[slot * p.pairs + pair], s = sin_table[slot * p.pairs + pair];
  float* v = p.x + r * p.row_stride + p.offset + 2 * pair;
  const float a = v[0], b = v[1];
  // Unfused, like the CPU: an FMA would round a·c − b·s once instead of three times.
  v[0] = cuda::round_bf16_if(p.bf16, __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
  v[1] = cuda::round_bf16_if(p.bf16, __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c)));
}

__global__ void __launch_bounds__(kRopeThreads) rope_kernel(RopeParams p) { rope_block(p, blockIdx.x); }

// ---- rope_spans: the rows of several sequences (each its own x, rows and pos0) in one launch

constexpr int kMaxRopeSpans = 96;  // one launch's spans: the parameters stay under 4 KB

struct RopeSpansParams {
  RopeParams common;  // everything but x, rows and pos0
  struct Span {
    float* x;
    int64_t pos0;
    int32_t rows, block0;  // the span's first block of the launch
  } span[kMaxRopeSpans];
  int spans;
};
static_assert(sizeof(RopeSpansParams) <= 4096, "rope_spans: the kernel parameters exceed 4 KB");

// grid: the spans' blocks, span after span (span i from span[i].block0).
__global__ void __launch_bounds__(kRopeThreads) rope_spans_kernel(const __grid_constant__ RopeSpansParams p) {
  int lo = 0, hi = p.spans - 1;  // the last span whose block0 ≤ blockIdx.x
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.span[mid].block0 <= int(blockIdx.x)) lo = mid;
    else hi = mid - 1;
  }
  RopeParams q = p.common;
  q.x = p.span[lo].x;
  q.rows = p.span[lo].rows;
  q.pos0 = p.span[lo].pos0;
  rope_block(q, int64_t(blockIdx.x) - p.span[lo].block0);
}

}  // namespace

void CudaOps::rms_norm(const float* x, const std::vector<float>* gamma, int64_t rows, int64_t dim, float* y,
                       E4m3Rows* yq) {
  DSV4_CHECK(rows >= 0 && dim >= 1, "rms_norm: bad shape rows=", rows, " dim=", dim);
  DSV4_CHECK(!gamma || int64_t(gamma->size()) == dim, "rms_norm: gain has ", gamma ? gamma->size() : 0,
             " elements, the rows have ", dim);
  if (rows == 0) return;
  const float* g = gamma ? dev(*gamma) : nullptr;
  RmsNormParams p{x, g, y, dim, float(config_.norm_eps), fast()};
  const bool vec = dim % 4 == 0 && cuda::aligned16(x) && cuda::aligned16(y) && (!g || cuda::aligned16(g));
  if (yq) {
    DSV4_CHECK(vec && dim % 128 == 0 && yq->cols == dim && yq->rows >= rows && cuda::aligned16(yq->codes),
               "rms_norm: act_quant'ed rows [", yq->rows, ", ", yq->cols, "] for ", rows, " aligned rows of ", dim);
    p.codes = yq->codes;
    p.scales = yq->scales;
    p.scale_ld = yq->scale_ld;
  }
  const int64_t packs = vec ? dim / 4 : dim;
  const int threads = int(std::clamp<int64_t>(cuda::ceil_div(packs, 32) * 32, 32, kNormMaxThreads));
  if (vec) cuda::launch_pdl(rms_norm_kernel<4>, dim3(unsigned(rows)), dim3(threads), 0, stream_, pdl(), p);
  else cuda::launch_pdl(rms_norm_kernel<1>, dim3(unsigned(rows)), dim3(threads), 0, stream_, pdl(), p);
}

void CudaOps::norm_rope(float* x, const std::vector<float>* gamma, int64_t rows, int64_t dim, int64_t offset,
                        int64_t rows_per_pos, int64_t pos0, RopeKind kind) {
  DSV4_CHECK(rows >= 0 && dim >= 1 && rows_per_pos >= 1, "norm_rope: bad shape rows=", rows, " dim=", dim,
             " rows_per_pos=", rows_per_pos);
  DSV4_CHECK(!gamma || int64_t(gamma->size()) == dim, "norm_rope: gain has ", gamma ? gamma->size() : 0,
             " elements, the rows have ", dim);
  DSV4_CHECK(offset >= 0 && offset % 2 == 0 && dim - offset == config_.rope_dim, "norm_rope: channels [", offset,
             ", ", dim, ") are not the ", config_.rope_dim, " rope channels");
  DSV4_CHECK(dim <= cuda::kNormRopeMaxDim, "norm_rope: rows of ", dim, " channels (at most ", cuda::kNormRopeMaxDim, ")");
  if (rows == 0) return;
  const NormRopeParams p{x, {gamma ? dev(*gamma) : nullptr, inv_freq(kind), dim, offset, float(config_.norm_eps), fast()},
                         rows_per_pos, pos0};
  cuda::launch_pdl(norm_rope_kernel, dim3(unsigned(rows)), dim3(cuda::kNormRopeThreads), size_t(dim) * sizeof(float),
                   stream_, pdl(), p);
}

namespace {

// rope's checks and its parameters but x, rows and pos0.
RopeParams rope_params(const CudaOps& ops, const float* inv_freq, int64_t rows, int64_t row_stride, int64_t offset,
                       int64_t rows_per_pos, int64_t pos_stride, bool inverse) {
  const int64_t pairs = ops.config().rope_dim / 2;
  DSV4_CHECK(pairs >= 1 && pairs <= kRopeThreads, "rope: rope_dim ", ops.config().rope_dim, " outside [2, ",
             2 * kRopeThreads, "]");
  DSV4_CHECK(rows >= 0 && rows_per_pos >= 1 && offset >= 0 && offset + 2 * pairs <= row_stride,
             "rope: bad arguments rows=", rows, " rows_per_pos=", rows_per_pos, " channels [", offset, ", ",
             offset + 2 * pairs, ") in rows of ", row_stride);
  return {nullptr, inv_freq, rows, row_stride, offset, rows_per_pos, 0, pos_stride, int(pairs),
          int(kRopeThreads / pairs), inverse, ops.fast()};
}

}  // namespace

void CudaOps::rope(float* x, int64_t rows, int64_t row_stride, int64_t offset, int64_t rows_per_pos, int64_t pos0,
                   int64_t pos_stride, RopeKind kind, bool inverse) {
  RopeParams p = rope_params(*this, inv_freq(kind), rows, row_stride, offset, rows_per_pos, pos_stride, inverse);
  if (rows == 0) return;
  p.x = x;
  p.pos0 = pos0;
  cuda::launch_pdl(rope_kernel, dim3(unsigned(cuda::ceil_div(rows, p.rows_per_block))), dim3(kRopeThreads), 0, stream_, pdl(), p);
}

void CudaOps::rope_spans(std::span<const RopeSpan> spans, int64_t row_stride, int64_t offset, int64_t rows_per_pos,
                         RopeKind kind) {
  RopeSpansParams k{};
  k.common = rope_params(*this, inv_freq(kind), 0, row_stride, offset, rows_per_pos, 1, false);
  int64_t blocks = 0;
  const auto launch = [&] {
    if (blocks > 0)
      cuda::launch_pdl(rope_spans_kernel, dim3(unsigned(blocks)), dim3(kRopeThreads), 0, stream_, pdl(), k);
    blocks = 0;
    k.spans = 0;
  };
  for (const RopeSpan& s : spans) {
    DSV4_CHECK(s.rows >= 0, "rope_spans: a span of ", s.rows, " rows");
    const int64_t span_blocks = cuda::ceil_div(s.rows, k.common.rows_per_block);
    if (span_blocks == 0) continue;
    DSV4_CHECK(span_blocks <= int64_t(INT32_MAX) / 2, "rope_spans: ", s.rows, " rows in one span");
    if (k.spans == kMaxRopeSpans || blocks + span_blocks > int64_t(INT32_MAX) / 2) launch();
    k.span[k.spans++] = {s.x, s.pos0, int32_t(s.rows), int32_t(blocks)};
    blocks += span_blocks;
  }
  launch();
}

}  // namespace dsv4
