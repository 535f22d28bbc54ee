// hc family (CUDA): manifold-constrained hyper-connections (spec §5), the same functions as src/cpu/hc.cpp.
//
// hc_pre / hc_head run two kernels:
//   hc_mix     split-K over the flattened streams v = X[t] (K = hc·D columns): block (chunk, 8-token tile), each
//              warp owns a few rows of fn plus, as the extra row M, Σ v²; lanes stride the chunk with 16-byte
//              loads, so fn is read once per token tile and X once. Writes per-chunk partials [chunks, n, M+1].
//              From kMixStagedMinTokens tokens (prefill) hc_mix_staged: the same sums, X's tile through a
//              cp.async ring in shared memory and the warps' fn columns one sweep ahead in registers.
//   hc_finish  block (token, D slice): 8 collapse warps sum the partials over the chunks (fp64, fixed order);
//              the coefficient warp computes rinv in fp64 as the CPU does and pre, hands pre over at a named
//              barrier, then computes post and the Sinkhorn–Knopp projection of comb (one lane per matrix entry,
//              row/column sums by shuffles in the CPU's sequential order) while the collapse warps compute
//              x = Σ_j pre[j]·X[j] over the slice (unfused fp32, the CPU's order): the 20 serial Sinkhorn
//              iterations overlap the collapse instead of preceding it.
//              hc_pre_norm: one block per token covers all of D in kSlices slices and also writes
//              xn = γ·(x·inv), inv = 1 / sqrt(Σx²/D + eps) (rms_norm's arithmetic; one launch less).
//              Beyond one wave of it (more tokens than SMs) hc_coeffs (a warp a token: the coefficient warp's
//              work) and hc_collapse (a block a token: the collapse warps') instead, bit for bit the same.
// NOTE: X is read twice (once per kernel); at decode the second read hits L2 (64 KiB per token at V4 sizes),
// while fn (1.5 MiB fp32 per site) is spread over every SM by the split-K — that is where the time goes.
// Fast numerics (the `bf16` flags): the mixes, Sinkhorn, post and comb stay fp32; the collapsed x, xn and the
// new streams are rounded to bf16 as they are written (docs/design/fast-numerics.md §7, steps 2, 12, 18), and
// the post-mix rounds its f first (the ranks' fp32 sum of their shares: Ops::linear_partial).
// hc_post: block (D slice, token), post and comb in shared memory, X'[k] = post[k]·f + Σ_j C[j][k]·X[j] in place.
// CudaOps::hc_post only records its arguments (DeferredPost); the next use of the stream launches it (flush_deferred),
// unless the next op is hc_pre_norm on the same X: then hc_post_mix replaces hc_post + hc_mix — block (128-column
// slice of D, token) computes X' over its slice of every stream as hc_post does, writes it, and dots it with its
// warps' fn rows (loaded before waiting for the predecessor): the partials hc_finish sums, one launch less and X
// read once. Beyond kPostMixMaxTokens tokens hc_post_mix_tiled does the same for tiles of tokens a block.
// With several ranks f is each rank's share: a deferred all-reduce of it (CudaOps::all_reduce) rides along with the
// deferred hc_post. Where the GPUs reach each other and the call's slices fit the exchange's slots (V4: 64 rows)
// hc_post_mix (or hc_post_mix_tiled) trades the shares itself over NVLink (comm/peer_exchange.cuh) right after its
// PDL wait, each block its slice; otherwise NCCL reduces f in place first.
#include <algorithm>
#include <utility>

#include "cuda/comm/peer_exchange.cuh"
#include "cuda/common/barrier.cuh"
#include "cuda/common/check.h"
#include "cuda/common/cp_async.cuh"
#include "cuda/common/fp_grid.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/elementwise/pack.cuh"

namespace dsv4 {

namespace {

using cuda::barrier_sync;
using cuda::cp_async16;
using cuda::cp_async_commit;
using cuda::cp_async_wait;
using cuda::load_pack;
using cuda::Pack;
using cuda::store_pack;

constexpr int kMaxHc = 4;                 // comb has hc² ≤ 32 entries: one warp lane each
constexpr int kMixWarps = 8;
constexpr int kMixTokens = 8;             // tokens per hc_mix block: fn is re-read once per tile
constexpr int kCollapseWarps = 8;         // hc_finish: warps 0..7 collapse, warp 8 computes the coefficients
constexpr int kCollapseThreads = kCollapseWarps * 32;
constexpr int kFinishThreads = kCollapseThreads + 32;
// Named barriers of hc_finish (0 is __syncthreads'): the chunk sums handed to the coefficient warp, pre handed
// back to the collapse warps, and the collapse warps' RMSNorm sum.
constexpr int kBarrierSums = 1, kBarrierPre = 2, kBarrierCollapse = 3;
constexpr int kPostThreads = 128;
constexpr int kPostMixCols = 32 * 4;      // hc_post_mix: columns of D per block, a pack of 4 per lane
// hc_post_mix_kernel loads its fn rows once per token: up to this many tokens; beyond, hc_post_mix_tiled_kernel
// loads them once per block of kPostMixTileTokens-token tiles (one wave of kPostMixBlocksPerSm blocks an SM).
constexpr int64_t kPostMixMaxTokens = 8;
constexpr int kPostMixTileTokens = 8;
constexpr int kPostMixBlocksPerSm = 2;
// hc_mix_staged: from this many tokens; its ring of kMixStages sweeps (8 tokens × 128 columns, 4 KiB each); the
// blocks it aims at per SM (about three waves of two blocks an SM: a short last wave).
constexpr int64_t kMixStagedMinTokens = 64;
constexpr int kMixStages = 4;
constexpr int kMixStagedBlocksPerSm = 6;

// ---- hc_mix: partial fn·v and Σ v² per column chunk

struct HcMixParams {
  const float* X;         // [n, K]: the hc streams of a token, flattened stream-major (K = hc·D)
  cuda::DeviceWeight fn;  // [M, K]
  float* partial;         // [chunks, n, M + 1]: fn rows · v over the chunk, then Σ v² over the chunk
  int64_t n, K;
  int M;
  int64_t chunk_cols;     // columns per block, a multiple of 32·N
};

// The warp's rows' sums over its lanes, into the block's chunk of the partials.
template <int kRows>
__device__ __forceinline__ void write_mix_partials(const HcMixParams& p, const float (&acc)[kRows][kMixTokens],
                                                   int warp, int lane, int64_t t0) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int r = warp + kMixWarps * i;
#pragma unroll
    for (int tt = 0; tt < kMixTokens; ++tt) {
      float v = acc[i][tt];
      for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
      if (lane == 0 && r <= p.M && t0 + tt < p.n) p.partial[(int64_t(blockIdx.x) * p.n + t0 + tt) * (p.M + 1) + r] = v;
    }
  }
}

// kRows: rows per warp, ≥ ceil((M + 1) / kMixWarps); warp w owns rows w, w + kMixWarps, ... ≤ M. Two blocks an SM
// (≤ 128 registers; 76 bytes spilled at <4, 4>): at 168 registers one block fit an SM and a 64-token step's 256
// blocks ran in two waves (8.8 µs under ncu, 2 warps a scheduler; 14 → 10.5 µs exposed in the trace, H100).
template <int N, int kRows>
__global__ void __launch_bounds__(kMixWarps * 32, 2) hc_mix_kernel(HcMixParams p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t0 = int64_t(blockIdx.y) * kMixTokens;
  const int64_t c_end = min(p.K, int64_t(blockIdx.x + 1) * p.chunk_cols);
  const int64_t c_first = int64_t(blockIdx.x) * p.chunk_cols + lane * N;
  // This warp's fn rows at the lane's first columns (at decode, its only ones): constants, in flight before
  // the wait.
  Pack<N> w_first[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int r = warp + kMixWarps * i;
    if (r < p.M && c_first < c_end) w_first[i] = cuda::weight_pack<N>(p.fn, r, c_first);
  }
  cuda::pdl_wait();
  float acc[kRows][kMixTokens] = {};
  for (int64_t c = c_first; c < c_end; c += 32 * N) {
    Pack<N> xv[kMixTokens];
#pragma unroll
    for (int tt = 0; tt < kMixTokens; ++tt) {
      if (t0 + tt < p.n) {
        xv[tt] = cuda::load_pack<N>(p.X + (t0 + tt) * p.K + c);
      } else {
#pragma unroll
        for (int k = 0; k < N; ++k) xv[tt].v[k] = 0.0f;
      }
    }
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = warp + kMixWarps * i;
      if (r < p.M) {
        const Pack<N> w = c == c_first ? w_first[i] : cuda::weight_pack<N>(p.fn, r, c);
#pragma unroll
        for (int tt = 0; tt < kMixTokens; ++tt)
#pragma unroll
          for (int k = 0; k < N; ++k) acc[i][tt] += w.v[k] * xv[tt].v[k];
      } else if (r == p.M) {
#pragma unroll
        for (int tt = 0; tt < kMixTokens; ++tt)
#pragma unroll
          for (int k = 0; k < N; ++k) acc[i][tt] += xv[tt].v[k] * xv[tt].v[k];
      }
    }
  }
  write_mix_partials<kRows>(p, acc, warp, lane, t0);
}

// hc_mix at prefill sizes. hc_mix_kernel waits on its loads once per sweep: at 512 tokens (64 token tiles × 5
// chunks of 26 sweeps, 1.2 waves of two blocks an SM) it took 84 µs a launch where X's 33.5 MB take 11 µs at the
// copy bandwidth (H100 trace, docs/design/hc.md). Here the block's 8 tokens × 128 columns of a sweep come by
// cp.async kMixStages − 1 sweeps ahead (thread i copies token i / 32's 16 bytes at lane i % 32), the warps read
// them from shared memory, and each warp loads its fn packs for the next sweep before the current one's FMAs.
// Each lane's sums run over the same columns in the same order as hc_mix_kernel's for the same chunk_cols.
// Requires N = 4 packs (K % 4 == 0, X 16-byte aligned) and chunk_cols a multiple of 128.
template <int kRows>
__global__ void __launch_bounds__(kMixWarps * 32, 2) hc_mix_staged_kernel(HcMixParams p) {
  static_assert(kMixWarps == kMixTokens, "one copy per thread: a warp's 32 lanes × 16 bytes per token");
  __shared__ __align__(16) float ring[kMixStages][kMixTokens][32 * 4];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t0 = int64_t(blockIdx.y) * kMixTokens;
  const int64_t c_begin = int64_t(blockIdx.x) * p.chunk_cols;
  const int64_t c_end = min(p.K, c_begin + p.chunk_cols);
  const int sweeps = int((c_end - c_begin + 127) / 128);
  const auto col = [&](int sweep) { return c_begin + int64_t(sweep) * 128 + 4 * lane; };
  cuda::pdl_wait();
  // Stage `sweep` of the ring: this thread's 16 bytes (token `warp`, columns col(sweep)), zeros past n and K.
  const auto copy = [&](int sweep) {
    if (sweep < sweeps) {
      float* dst = &ring[sweep % kMixStages][warp][4 * lane];
      const int64_t c = col(sweep);
      if (t0 + warp < p.n && c < c_end) cp_async16(dst, p.X + (t0 + warp) * p.K + c);
      else store_pack<4>(dst, Pack<4>{});
    }
    cp_async_commit();  // an empty group past the last sweep keeps the wait counts uniform
  };
#pragma unroll
  for (int s = 0; s < kMixStages - 1; ++s) copy(s);
  Pack<4> w[kRows];
  const auto load_fn = [&](int sweep) {
    const int64_t c = col(sweep);
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = warp + kMixWarps * i;
      if (r < p.M && sweep < sweeps && c < c_end) w[i] = cuda::weight_pack<4>(p.fn, r, c);
    }
  };
  load_fn(0);
  float acc[kRows][kMixTokens] = {};
  for (int s = 0; s < sweeps; ++s) {
    cp_async_wait<kMixStages - 2>();
    __syncthreads();             // sweep s has landed for every thread; every warp is done with sweep s − 1
    copy(s + kMixStages - 1);    // into sweep s − 1's stage
    Pack<4> xv[kMixTokens];
#pragma unroll
    for (int tt = 0; tt < kMixTokens; ++tt) xv[tt] = load_pack<4>(&ring[s % kMixStages][tt][4 * lane]);
    Pack<4> wc[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) wc[i] = w[i];
    load_fn(s + 1);
    if (col(s) >= c_end) continue;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = warp + kMixWarps * i;
      if (r < p.M) {
#pragma unroll
        for (int tt = 0; tt < kMixTokens; ++tt)
#pragma unroll
          for (int k = 0; k < 4; ++k) acc[i][tt] += wc[i].v[k] * xv[tt].v[k];
      } else if (r == p.M) {
#pragma unroll
        for (int tt = 0; tt < kMixTokens; ++tt)
#pragma unroll
          for (int k = 0; k < 4; ++k) acc[i][tt] += xv[tt].v[k] * xv[tt].v[k];
      }
    }
  }
  write_mix_partials<kRows>(p, acc, warp, lane, t0);
}

// ---- hc_finish: coefficients and the collapse x = Σ_j pre[j]·X[j]

struct HcFinishParams {
  const float* X;          // [n, hc, D]
  const float* partial;    // [chunks, n, M + 1]
  int64_t chunks, n, D;
  int hc, M;               // M = (2 + hc)·hc for hc_pre; hc for hc_head (pre only)
  const float* base;       // [M]
  const float* scale;      // [3] for hc_pre, [1] for hc_head
  float hc_eps;
  double norm_eps;
  int sinkhorn_iters;
  float* x;                // [n, D]
  float* post;             // [n, hc], nullptr for hc_head
  float* comb;             // [n, hc, hc], nullptr for hc_head
  const float* gamma = nullptr;  // hc_pre_norm: [D] RMSNorm gain of xn
  float* xn = nullptr;           // hc_pre_norm: [n, D]
  float rms_eps = 0.0f;
  bool bf16 = false;             // fast numerics: x and xn rounded to bf16
  // hc_pre_norm, where asked (D a multiple of 128): xn act_quant'ed too, E4m3Rows' codes and scales.
  uint8_t* codes = nullptr;
  float* scales = nullptr;
  int64_t scale_ld = 0;
  // hc_pre_norm at prefill sizes: pre [n, hc], from hc_coeffs_kernel to hc_collapse_kernel.
  float* pre = nullptr;
};

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

// Affine map of one mixing logit, unfused as on the CPU: m·scale + base.
__device__ __forceinline__ float affine(float m, float scale, float base) { return __fadd_rn(__fmul_rn(m, scale), base); }

// Sinkhorn–Knopp on an hc × hc matrix held one entry per lane (lane = j·hc + k, row j, column k) of a full
// warp, in src/cpu/hc.cpp's exact order: row softmax + eps, column normalisation, then (iters − 1) × (rows,
// cols); every sum runs sequentially over the row or column like the CPU loop. Lanes ≥ hc² carry garbage.
__device__ float sinkhorn_entry(float logit, int hc, int iters, float eps) {
  const int lane = threadIdx.x % 32, j = lane / hc, k = lane % hc;
  const auto row_entry = [&](float v, int kk) { return __shfl_sync(0xffffffffu, v, (j * hc + kk) % 32); };
  const auto col_entry = [&](float v, int jj) { return __shfl_sync(0xffffffffu, v, (jj * hc + k) % 32); };
  // Loops run to kMaxHc with a guard: unrolled, a row's or column's shuffles issue together before the
  // sequential sum instead of one round trip per entry.
  const auto row_sum = [&](float v) {
    float r[kMaxHc];
#pragma unroll
    for (int kk = 0; kk < kMaxHc; ++kk) r[kk] = row_entry(v, kk);
    float s = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kMaxHc; ++kk)
      if (kk < hc) s += r[kk];
    return s;
  };
  const auto col_sum = [&](float v) {
    float r[kMaxHc];
#pragma unroll
    for (int jj = 0; jj < kMaxHc; ++jj) r[jj] = col_entry(v, jj);
    float s = 0.0f;
#pragma unroll
    for (int jj = 0; jj < kMaxHc; ++jj)
      if (jj < hc) s += r[jj];
    return s;
  };
  float row[kMaxHc];
#pragma unroll
  for (int kk = 0; kk < kMaxHc; ++kk) row[kk] = row_entry(logit, kk);
  float mx = row[0];
#pragma unroll
  for (int kk = 1; kk < kMaxHc; ++kk)
    if (kk < hc) mx = fmaxf(mx, row[kk]);
  const float e = expf(logit - mx);
  float c = e / row_sum(e) + eps;
  c = c / (col_sum(c) + eps);
  for (int it = 1; it < iters; ++it) {
    c = c / (row_sum(c) + eps);
    c = c / (col_sum(c) + eps);
  }
  return c;
}

// The coefficient warp's affine constants (weights: loaded before the PDL wait — at decode an HBM round trip
// each, which would otherwise sit on the step's path twice, before pre and before the Sinkhorn).
struct HcAffine {
  float scale_pre, base_pre, scale_post = 0.0f, scale_comb = 0.0f, base_post = 0.0f, base_comb = 0.0f;
};
__device__ __forceinline__ HcAffine load_affine(const HcFinishParams& p, int lane) {
  HcAffine a{p.scale[0], lane < p.hc ? p.base[lane] : 0.0f};
  if (p.post) {
    a.scale_post = p.scale[1];
    a.scale_comb = p.scale[2];
    if (lane < p.hc) a.base_post = p.base[p.hc + lane];
    if (lane < p.hc * p.hc) a.base_comb = p.base[2 * p.hc + lane];
  }
  return a;
}

// Token t's mixes summed over the chunks, lane i ≤ M holding mix i (row M: Σ v²), in hc_finish's order: the chunks
// k ≡ w (mod kCollapseWarps) summed in fp64 for each w in turn, then those eight sums in order.
__device__ __forceinline__ double chunk_sum(const HcFinishParams& p, int64_t t, int w, int lane) {
  double s = 0.0;
  if (lane <= p.M) {
#pragma unroll 16  // every load in flight at once: at decode each warp walks 16 chunks
    for (int64_t k = w; k < p.chunks; k += kCollapseWarps) s += p.partial[(k * p.n + t) * (p.M + 1) + lane];
  }
  return s;
}

// From the summed mixes (lane i ≤ M: mix i), mixing logit `lane` before its affine map: rinv in fp64 like the
// CPU's stream_rms_inv, 1 / sqrt(mean(v²) + eps) over the hc·D values.
__device__ __forceinline__ float mix_logit(const HcFinishParams& p, double total) {
  const double sumsq = __shfl_sync(0xffffffffu, total, p.M);
  const float rinv = float(1.0 / sqrt(sumsq / double(int64_t(p.hc) * p.D) + p.norm_eps));
  return __fmul_rn(float(total), rinv);
}

__device__ __forceinline__ float pre_of(const HcFinishParams& p, const HcAffine& a, float m) {
  return sigmoid(affine(m, a.scale_pre, a.base_pre)) + p.hc_eps;
}

// Token t's post and comb (the Sinkhorn projection) from the warp's logits; written where `write`.
__device__ __forceinline__ void post_comb(const HcFinishParams& p, const HcAffine& a, float m, int64_t t, bool write) {
  const int lane = threadIdx.x % 32, hh = p.hc * p.hc;
  // Lane j < hc needs logit hc + j; lane l < hc² needs logit 2·hc + l.
  const float m_post = __shfl_sync(0xffffffffu, m, (p.hc + lane) % 32);
  const float m_comb = __shfl_sync(0xffffffffu, m, (2 * p.hc + lane) % 32);
  const float logit = lane < hh ? affine(m_comb, a.scale_comb, a.base_comb) : 0.0f;
  const float c = sinkhorn_entry(logit, p.hc, p.sinkhorn_iters, p.hc_eps);
  if (write) {
    if (lane < p.hc) p.post[t * p.hc + lane] = 2.0f * sigmoid(affine(m_post, a.scale_post, a.base_post));
    if (lane < hh) p.comb[t * hh + lane] = c;
  }
}

// The collapse of one token's columns by kCollapseThreads threads (thread i: columns c[s] = ((blockIdx.x·kSlices
// + s)·kCollapseThreads + i)·N), in two calls: load() before the coefficients are known, then finish(pre) —
// x = Σ_j pre[j]·X[j] (unfused fp32, the CPU's order), and with p.xn its RMSNorm (one block a token, kSlices
// slices covering D) and act_quant where asked.
template <int N, int kSlices>
struct Collapse {
  // hc_pre_norm's γ before the PDL wait (a weight) — but for the widest rows (V4-Pro), where the streams alone
  // take 128 registers of the 224 that 288 threads leave each: there it is loaded at use.
  static constexpr bool kPrefetchGain = kSlices <= 4;
  int64_t c[kSlices];
  Pack<N> gain[kSlices];
  Pack<N> streams[kSlices][kMaxHc];

  __device__ __forceinline__ void gains(const HcFinishParams& p) {
#pragma unroll
    for (int s = 0; s < kSlices; ++s) c[s] = ((int64_t(blockIdx.x) * kSlices + s) * kCollapseThreads + threadIdx.x) * N;
    if (kPrefetchGain && p.xn) {
#pragma unroll
      for (int s = 0; s < kSlices; ++s)
        if (c[s] < p.D) gain[s] = cuda::load_pack<N>(p.gamma + c[s]);
    }
  }
  // Token t's columns of the streams (after the wait).
  __device__ __forceinline__ void load(const HcFinishParams& p, int64_t t) {
    const float* Xt = p.X + t * p.hc * p.D;
#pragma unroll
    for (int s = 0; s < kSlices; ++s)
#pragma unroll
      for (int j = 0; j < kMaxHc; ++j)
        if (j < p.hc && c[s] < p.D) streams[s][j] = cuda::load_pack<N>(Xt + j * p.D + c[s]);
  }
  // pre: the token's hc coefficients; warp_sumsq: kCollapseWarps floats of shared memory.
  __device__ __forceinline__ void finish(const HcFinishParams& p, int64_t t, const float* pre, float* warp_sumsq) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    Pack<N> acc[kSlices];
    float sumsq = 0.0f;
#pragma unroll
    for (int s = 0; s < kSlices; ++s) {
#pragma unroll
      for (int k = 0; k < N; ++k) acc[s].v[k] = 0.0f;
      if (c[s] >= p.D) continue;
#pragma unroll
      for (int j = 0; j < kMaxHc; ++j) {
        if (j >= p.hc) break;
#pragma unroll
        for (int k = 0; k < N; ++k) acc[s].v[k] = __fadd_rn(acc[s].v[k], __fmul_rn(pre[j], streams[s][j].v[k]));
      }
#pragma unroll
      for (int k = 0; k < N; ++k) acc[s].v[k] = cuda::round_bf16_if(p.bf16, acc[s].v[k]);
      cuda::store_pack<N>(p.x + t * p.D + c[s], acc[s]);
      if (p.xn) {  // block-uniform: only hc_pre_norm needs the sum
#pragma unroll
        for (int k = 0; k < N; ++k) sumsq += acc[s].v[k] * acc[s].v[k];
      }
    }
    if (!p.xn) return;  // block-uniform
    for (int offset = 16; offset > 0; offset /= 2) sumsq += __shfl_xor_sync(0xffffffffu, sumsq, offset);
    if (lane == 0) warp_sumsq[warp] = sumsq;
    barrier_sync(kBarrierCollapse, kCollapseThreads);
    float total = 0.0f;
    for (int w = 0; w < kCollapseWarps; ++w) total += warp_sumsq[w];
    const float inv = 1.0f / sqrtf(total / float(p.D) + p.rms_eps);
#pragma unroll
    for (int s = 0; s < kSlices; ++s) {
      if (c[s] >= p.D) continue;
      Pack<N> y;
      if (!kPrefetchGain) gain[s] = cuda::load_pack<N>(p.gamma + c[s]);
#pragma unroll
      for (int k = 0; k < N; ++k) y.v[k] = cuda::round_bf16_if(p.bf16, gain[s].v[k] * (acc[s].v[k] * inv));
      cuda::store_pack<N>(p.xn + t * p.D + c[s], y);
      // A warp's slice is 128 aligned columns (N = 4): one act_quant block.
      if constexpr (N == 4)
        if (p.codes) cuda::act_quant_store_warp(y.v, p.codes + t * p.D + c[s], p.scales + c[s] / 128 * p.scale_ld + t);
    }
  }
};

// kSlices: slices of kCollapseThreads·N columns per block (grid.x · kSlices slices cover D); with p.xn set the
// grid has one block per token (kSlices slices cover D) and the block also writes the RMSNorm.
template <int N, int kSlices>
__global__ void __launch_bounds__(kFinishThreads) hc_finish_kernel(HcFinishParams p) {
  __shared__ double chunk_sums[kCollapseWarps][32];
  __shared__ float pre[kMaxHc];
  __shared__ float warp_sumsq[kCollapseWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = blockIdx.y;

  if (warp == kCollapseWarps) {  // the coefficient warp
    const HcAffine a = load_affine(p, lane);
    cuda::pdl_wait();
    barrier_sync(kBarrierSums, kFinishThreads);  // the collapse warps' chunk sums
    double total = 0.0;
    for (int w = 0; w < kCollapseWarps; ++w) total += chunk_sums[w][lane];
    const float m = mix_logit(p, total);  // lane i < M: mixing logit i before its affine map
    if (lane < p.hc) pre[lane] = pre_of(p, a, m);
    barrier_sync(kBarrierPre, kFinishThreads);  // the collapse warps are waiting there already
    if (p.post) post_comb(p, a, m, t, blockIdx.x == 0);
    return;
  }

  // The collapse warps: their streams loaded right after the wait, in flight through the chunk sums and the
  // coefficient warp's work.
  Collapse<N, kSlices> col;
  col.gains(p);
  cuda::pdl_wait();
  col.load(p, t);
  chunk_sums[warp][lane] = chunk_sum(p, t, warp, lane);
  barrier_sync(kBarrierSums, kFinishThreads);  // the coefficient warp is waiting there already
  barrier_sync(kBarrierPre, kFinishThreads);  // pre is ready
  col.finish(p, t, pre, warp_sumsq);
}

// hc_pre_norm at prefill sizes, two kernels in place of hc_finish (docs/design/hc.md, "hc_finish at prefill
// sizes"). hc_finish's block lives through its token's whole chain — the chunk sums' loads, the coefficients, the
// 20 serial Sinkhorn iterations, the collapse — one block an SM (128 registers × 288 threads): beyond one wave
// (4096 tokens: 31) each wave waits out that chain, 255 µs where the bytes take ~100. Here hc_coeffs_kernel runs
// the coefficient warp's work for kCollapseWarps tokens a block, a warp a token (its chunk sums in one lane's
// loop, in hc_finish's order), writing pre beside post and comb; hc_collapse_kernel then collapses and norms one
// token a block, the collapse warps' threads and columns. The same arithmetic in the same order: the outputs are
// hc_finish's bit for bit.
__global__ void __launch_bounds__(kCollapseThreads) hc_coeffs_kernel(HcFinishParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * kCollapseWarps + threadIdx.x / 32;
  const HcAffine a = load_affine(p, lane);
  cuda::pdl_wait();
  if (t >= p.n) return;  // warp-uniform
  double total = 0.0;
  for (int w = 0; w < kCollapseWarps; ++w) total += chunk_sum(p, t, w, lane);
  const float m = mix_logit(p, total);
  if (lane < p.hc) p.pre[t * p.hc + lane] = pre_of(p, a, m);
  post_comb(p, a, m, t, true);
}

// Two blocks an SM where the streams fit 128 registers (D ≤ 4096).
template <int kSlices>
__global__ void __launch_bounds__(kCollapseThreads, kSlices <= 4 ? 2 : 1) hc_collapse_kernel(HcFinishParams p) {
  __shared__ float pre[kMaxHc];
  __shared__ float warp_sumsq[kCollapseWarps];
  const int64_t t = blockIdx.y;
  Collapse<4, kSlices> col;
  col.gains(p);
  cuda::pdl_wait(kSlices <= 4 ? 2 : 1);
  col.load(p, t);
  if (threadIdx.x < p.hc) pre[threadIdx.x] = p.pre[t * p.hc + threadIdx.x];
  __syncthreads();
  col.finish(p, t, pre, warp_sumsq);
}

// ---- hc_post

struct HcPostParams {
  const float* f;     // [n, D], the sub-block output
  const float* post;  // [n, hc]
  const float* comb;  // [n, hc, hc], C[j][k]: source stream j, destination stream k
  float* X;           // [n, hc, D], updated in place
  int64_t n, D;
  int hc;
  bool bf16;          // fast numerics: the new streams rounded to bf16
};

// Stages token t's post [hc] and comb [hc, hc] in shared memory (the caller's barrier publishes them).
__device__ __forceinline__ void stage_post_coefficients(const HcPostParams& p, int64_t t, float* post, float* C) {
  if (threadIdx.x < p.hc) post[threadIdx.x] = p.post[t * p.hc + threadIdx.x];
  if (threadIdx.x < p.hc * p.hc) C[threadIdx.x] = p.comb[t * p.hc * p.hc + threadIdx.x];
}

// X'[k] = post[k]·f + Σ_j C[j][k]·X[j] at one pack of columns, in the CPU's order (unfused fp32, j ascending).
// Fast numerics (bf16) round f first: a bf16 sub-block output as it is, or the ranks' fp32 sum of their shares
// (Ops::linear_partial), rounded once as one rank's producer rounds it.
// Loops run to kMaxHc with a guard so the streams stay in registers (no dynamically indexed local array).
template <int N>
__device__ __forceinline__ void post_streams(const Pack<N>& f, const Pack<N> (&streams)[kMaxHc], const float* post,
                                             const float* C, int hc, bool bf16, Pack<N> (&out)[kMaxHc]) {
#pragma unroll
  for (int k = 0; k < kMaxHc; ++k) {
    if (k >= hc) break;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      float acc = __fmul_rn(post[k], cuda::round_bf16_if(bf16, f.v[e]));
#pragma unroll
      for (int j = 0; j < kMaxHc; ++j)
        if (j < hc) acc = __fadd_rn(acc, __fmul_rn(C[j * hc + k], streams[j].v[e]));
      out[k].v[e] = cuda::round_bf16_if(bf16, acc);
    }
  }
}

template <int N>
__global__ void __launch_bounds__(kPostThreads) hc_post_kernel(HcPostParams p) {
  cuda::pdl_wait();
  __shared__ float post[kMaxHc], C[kMaxHc * kMaxHc];
  const int64_t t = blockIdx.y;
  stage_post_coefficients(p, t, post, C);
  __syncthreads();
  const int64_t c = (int64_t(blockIdx.x) * kPostThreads + threadIdx.x) * N;
  if (c >= p.D) return;
  float* Xt = p.X + t * p.hc * p.D;
  const Pack<N> f = cuda::load_pack<N>(p.f + t * p.D + c);
  Pack<N> streams[kMaxHc], out[kMaxHc];
#pragma unroll
  for (int j = 0; j < kMaxHc; ++j)
    if (j < p.hc) streams[j] = cuda::load_pack<N>(Xt + j * p.D + c);
  post_streams(f, streams, post, C, p.hc, p.bf16, out);
#pragma unroll
  for (int k = 0; k < kMaxHc; ++k)
    if (k < p.hc) cuda::store_pack<N>(Xt + k * p.D + c, out[k]);
}

// ---- hc_post_mix: hc_post, then hc_mix's partials of the updated streams

struct HcPostMixParams {
  HcPostParams post;      // f, post, comb, X (updated in place), n, D, hc
  cuda::DeviceWeight fn;  // [M, hc·D]
  float* partial;         // [chunks, n, M + 1], chunk b = columns [b·kPostMixCols, (b+1)·kPostMixCols) of each stream
  int M;
  int tiles = 1;          // hc_post_mix_tiled_kernel: token tiles per block
  cuda::PeerSlots peers;  // hc_post_mix_kernel: ranks > 1: f is this rank's share, summed over the ranks here
};

// This warp's fn rows (w, w + kMixWarps, ... < M) at the lane's columns c of every stream (both hc_post_mix kernels).
template <int kRows>
__device__ __forceinline__ void load_post_mix_fn(const HcPostMixParams& p, int warp, int64_t c,
                                                 Pack<4> (&w)[kRows][kMaxHc]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int r = warp + kMixWarps * i;
#pragma unroll
    for (int j = 0; j < kMaxHc; ++j)
      if (r < p.M && j < p.post.hc && c < p.post.D) w[i][j] = cuda::weight_pack<4>(p.fn, r, j * p.post.D + c);
  }
}

// The lane's term of mixing row r (r < M: fn row r · X'; r = M: Σ X'²) over its pack of every stream, summed in
// one fixed order (both hc_post_mix kernels).
template <int kRows>
__device__ __forceinline__ float post_mix_term(const Pack<4> (&w)[kRows][kMaxHc], int i, bool sum_squares,
                                               const Pack<4> (&out)[kMaxHc], int hc) {
  float v = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxHc; ++j) {
    if (j >= hc) break;
#pragma unroll
    for (int e = 0; e < 4; ++e) v += sum_squares ? out[j].v[e] * out[j].v[e] : w[i][j].v[e] * out[j].v[e];
  }
  return v;
}

// grid (ceil(D / kPostMixCols), n), kMixWarps warps; warp w owns rows w, w + kMixWarps, ... ≤ M (row M: Σ v²).
// Every warp computes the lane's pack of X' (cheap next to the fn loads); warp 0 stores it.
template <int kRows>
__global__ void __launch_bounds__(kMixWarps * 32) hc_post_mix_kernel(HcPostMixParams p) {
  __shared__ float post[kMaxHc], C[kMaxHc * kMaxHc];
  const HcPostParams& q = p.post;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = blockIdx.y, c = int64_t(blockIdx.x) * kPostMixCols + lane * 4;
  const bool live = c < q.D;
  Pack<4> w[kRows][kMaxHc];
  load_post_mix_fn(p, warp, c, w);  // constants, in flight before the wait
  cuda::pdl_wait();
  stage_post_coefficients(q, t, post, C);
  float* Xt = q.X + t * q.hc * q.D;
  Pack<4> f{}, streams[kMaxHc];
  if (live) {
    f = cuda::load_pack<4>(q.f + t * q.D + c);
#pragma unroll
    for (int j = 0; j < kMaxHc; ++j)
      if (j < q.hc) streams[j] = cuda::load_pack<4>(Xt + j * q.D + c);
  }
  // The ranks' shares of f summed (slot: the block): warp 0 trades the packs with the peers and hands the sums to
  // the other warps.
  __shared__ Pack<4> f_sum[32];
  if (p.peers.ranks > 1 && warp == 0) f_sum[lane] = cuda::peer_sum(p.peers, int(t * gridDim.x + blockIdx.x), live, f);
  __syncthreads();  // post and C are in shared memory, and every warp has read X before warp 0 overwrites it
  if (p.peers.ranks > 1) f = f_sum[lane];
  Pack<4> out[kMaxHc];
  if (live) {
    post_streams(f, streams, post, C, q.hc, q.bf16, out);
    if (warp == 0)
#pragma unroll
      for (int k = 0; k < kMaxHc; ++k)
        if (k < q.hc) cuda::store_pack<4>(Xt + k * q.D + c, out[k]);
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int r = warp + kMixWarps * i;
    if (r > p.M) break;  // warp-uniform
    float v = live ? post_mix_term(w, i, r == p.M, out, q.hc) : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (lane == 0) p.partial[(int64_t(blockIdx.x) * q.n + t) * (p.M + 1) + r] = v;
  }
}

// K warp sums at once (K a power of two ≤ 32; v[i] the lane's term of sum i), each in the order of the xor tree
// above (offsets 16, 8, ..., 1), so bit for bit its total: at the first log2(K) offsets each lane keeps half of its
// sums and hands its partner the other half (K − 1 shuffles, not 5·K). Returns sum lane / (32 / K)'s total.
template <int K>
__device__ __forceinline__ float warp_sums_transposed(float (&v)[K]) {
  static_assert(K >= 1 && K <= 32 && (K & (K - 1)) == 0, "K a power of two ≤ 32");
  const int lane = threadIdx.x % 32;
  int offset = 16;
#pragma unroll
  for (int half = K / 2; half >= 1; half /= 2, offset /= 2) {
    const bool upper = (lane & offset) != 0;  // keeps sums [half, 2·half) of those left
#pragma unroll
    for (int i = 0; i < half; ++i) {
      const float send = upper ? v[i] : v[i + half], keep = upper ? v[i + half] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, offset);
    }
  }
  float total = v[0];
  for (; offset > 0; offset /= 2) total += __shfl_xor_sync(0xffffffffu, total, offset);
  return total;
}

// hc_post_mix at prefill sizes: the same X' and partials as hc_post_mix_kernel, bit for bit, with the warps' fn
// rows loaded once per block instead of once per token (at 512 tokens hc_post + hc_mix_staged took 22 + 40 µs a
// sub-block boundary, H100 trace: docs/design/hc.md). grid (ceil(D / kPostMixCols), runs of p.tiles token tiles).
// Per tile of kPostMixTileTokens tokens, thread (warp w, lane) stages token w's f and streams at its pack by
// cp.async a tile ahead, computes X' from them as hc_post does, and stores it to X and over its staged streams; then
// each warp reads every token's X' there once, forms its rows' terms and sums them over the lanes for all tokens at
// once (warp_sums_transposed). kFnRows ≥ ceil(M / kMixWarps): warp w's fn rows are w, w + kMixWarps, ... < M; row
// M (Σ X'²) is warp M % kMixWarps's too (an fn-free row: no registers held for it).
template <int kFnRows>
__global__ void __launch_bounds__(kMixWarps * 32, 2) hc_post_mix_tiled_kernel(HcPostMixParams p) {
  static_assert(kMixWarps == kPostMixTileTokens, "a warp a token in the post phase");
  constexpr int kTile = kPostMixTileTokens;
  // [tile parity][token][stream j < hc, then f at kMaxHc][pack]: each thread's own 16 bytes until the post phase's
  // barrier, every token's X' after it.
  __shared__ __align__(16) float stage_s[2][kTile][kMaxHc + 1][kPostMixCols];
  __shared__ float post_s[kTile][kMaxHc], C_s[kTile][kMaxHc * kMaxHc];
  const HcPostParams& q = p.post;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t c = int64_t(blockIdx.x) * kPostMixCols + lane * 4;
  const bool live = c < q.D, squares = warp == p.M % kMixWarps;
  Pack<4> w[kFnRows][kMaxHc];
  load_post_mix_fn(p, warp, c, w);  // constants, in flight before the wait
  cuda::pdl_wait();
  const int64_t first = int64_t(blockIdx.y) * p.tiles * kTile;
  // The ranks' shares of f (p.peers.ranks > 1; slot: the token's row of the block's slice): every thread pushes
  // its token of each of the block's tiles at once (the share is final: its producer finished before the wait),
  // so that the post phase of each tile finds the peers' packs landed or landing.
  if (p.peers.ranks > 1 && live)
    for (int tile = 0; tile < p.tiles; ++tile) {
      const int64_t t = first + int64_t(tile) * kTile + warp;
      if (t >= q.n) break;
      const int slot = int(t * gridDim.x + blockIdx.x);
      cuda::peer_push(p.peers, slot, cuda::peer_call(p.peers, slot), cuda::load_pack<4>(q.f + t * q.D + c));
    }
  const auto stage = [&](int tile) {  // this thread's token of the tile, if any, into its parity's stage
    const int64_t t = first + int64_t(tile) * kTile + warp;
    if (tile < p.tiles && t < q.n && live) {
      float(*dst)[kPostMixCols] = stage_s[tile % 2][warp];
#pragma unroll
      for (int j = 0; j < kMaxHc; ++j)
        if (j < q.hc) cp_async16(&dst[j][4 * lane], q.X + (t * q.hc + j) * q.D + c);
      cp_async16(&dst[kMaxHc][4 * lane], q.f + t * q.D + c);
    }
    cp_async_commit();  // possibly empty: the wait counts stay uniform
  };
  stage(0);
  for (int tile = 0; tile < p.tiles; ++tile) {
    const int64_t t0 = first + int64_t(tile) * kTile;
    if (t0 >= q.n) break;  // block-uniform
    stage(tile + 1);     // copies only below n: none outlives the loop
    cp_async_wait<1>();  // this thread's copies of the tile have landed
    float(*tok)[kPostMixCols] = stage_s[tile % 2][warp];
    // The post phase: token t0 + warp.
    const int64_t t = t0 + warp;
    Pack<4> out[kMaxHc] = {};
    if (t < q.n) {
      if (lane < q.hc) post_s[warp][lane] = q.post[t * q.hc + lane];
      if (lane < q.hc * q.hc) C_s[warp][lane] = q.comb[t * q.hc * q.hc + lane];
      __syncwarp();
      Pack<4> f = live ? cuda::load_pack<4>(&tok[kMaxHc][4 * lane]) : Pack<4>{};
      if (p.peers.ranks > 1) {  // warp-uniform
        const int slot = int(t * gridDim.x + blockIdx.x);
        const unsigned call = cuda::peer_call(p.peers, slot);
        if (live) f = cuda::peer_gather(p.peers, slot, call, f);
        cuda::peer_done(p.peers, slot, call);
      }
      if (live) {
        Pack<4> streams[kMaxHc];
#pragma unroll
        for (int j = 0; j < kMaxHc; ++j)
          if (j < q.hc) streams[j] = cuda::load_pack<4>(&tok[j][4 * lane]);
        post_streams(f, streams, post_s[warp], C_s[warp], q.hc, q.bf16, out);
        float* Xt = q.X + t * q.hc * q.D;
#pragma unroll
        for (int k = 0; k < kMaxHc; ++k)
          if (k < q.hc) cuda::store_pack<4>(Xt + k * q.D + c, out[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < kMaxHc; ++k) cuda::store_pack<4>(&tok[k][4 * lane], out[k]);
    __syncthreads();  // the tile's X' is in shared memory
    // The mix phase: this warp's rows over the tile's tokens (v[kFnRows]: row M), each token's X' read once.
    float v[kFnRows + 1][kTile];
#pragma unroll
    for (int tt = 0; tt < kTile; ++tt) {
      Pack<4> x[kMaxHc];
#pragma unroll
      for (int j = 0; j < kMaxHc; ++j) x[j] = cuda::load_pack<4>(&stage_s[tile % 2][tt][j][4 * lane]);
#pragma unroll
      for (int i = 0; i < kFnRows; ++i)
        v[i][tt] = live && warp + kMixWarps * i < p.M ? post_mix_term(w, i, false, x, q.hc) : 0.0f;
      v[kFnRows][tt] = live && squares ? post_mix_term(w, 0, true, x, q.hc) : 0.0f;
    }
    __syncthreads();  // every warp has read the stage before the next tile's copies refill it
    const int64_t tt = lane / (32 / kTile);
    const bool writes = lane % (32 / kTile) == 0 && t0 + tt < q.n;
    float* partial = p.partial + (int64_t(blockIdx.x) * q.n + t0 + tt) * (p.M + 1);
#pragma unroll
    for (int i = 0; i < kFnRows; ++i) {
      const int r = warp + kMixWarps * i;
      if (r >= p.M) break;  // warp-uniform
      const float total = warp_sums_transposed(v[i]);
      if (writes) partial[r] = total;
    }
    if (squares) {
      const float total = warp_sums_transposed(v[kFnRows]);
      if (writes) partial[p.M] = total;
    }
  }
}

// ---- launchers

void launch_hc_mix_staged(const HcMixParams& p, int rows_per_warp, dim3 grid, cudaStream_t stream, bool pdl) {
  switch (rows_per_warp) {
    case 1: cuda::launch_pdl(hc_mix_staged_kernel<1>, dim3(grid), dim3(kMixWarps * 32), 0, stream, pdl, p); break;
    case 2: cuda::launch_pdl(hc_mix_staged_kernel<2>, dim3(grid), dim3(kMixWarps * 32), 0, stream, pdl, p); break;
    default: cuda::launch_pdl(hc_mix_staged_kernel<4>, dim3(grid), dim3(kMixWarps * 32), 0, stream, pdl, p); break;
  }
}

template <int N>
void launch_hc_mix(const HcMixParams& p, int rows_per_warp, dim3 grid, cudaStream_t stream, bool pdl) {
  switch (rows_per_warp) {
    case 1: cuda::launch_pdl(hc_mix_kernel<N, 1>, dim3(grid), dim3(kMixWarps * 32), 0, stream, pdl, p); break;
    case 2: cuda::launch_pdl(hc_mix_kernel<N, 2>, dim3(grid), dim3(kMixWarps * 32), 0, stream, pdl, p); break;
    default: cuda::launch_pdl(hc_mix_kernel<N, 4>, dim3(grid), dim3(kMixWarps * 32), 0, stream, pdl, p); break;
  }
}

template <int N, int kSlices>
void launch_hc_finish(const HcFinishParams& p, dim3 grid, cudaStream_t stream, bool pdl) {
  cuda::launch_pdl(hc_finish_kernel<N, kSlices>, grid, dim3(kFinishThreads), 0, stream, pdl, p);
}

// Slices per block that let one block cover D columns in packs of 4 (hc_pre_norm); 0: D is too wide.
int norm_slices(int64_t D) {
  for (int s : {1, 2, 4, 8})
    if (D <= int64_t(s) * kCollapseThreads * 4) return s;
  return 0;
}

// Shared by hc_pre (M = (2 + hc)·hc, post and comb written), hc_pre_norm (also xn = RMSNorm(x) with gain
// gamma; the caller checked norm_slices; with `pending`, a deferred hc_post into X first, by hc_post_mix: the
// caller checked its conditions) and hc_head (M = hc, pre only).
void hc_collapse(CudaOps& ops, const float* X, const Weight& fn_host, const std::vector<float>& base,
                 const std::vector<float>& scale, int64_t n, float* x, float* post, float* comb, const char* what,
                 const float* gamma = nullptr, float* xn = nullptr, const HcPostParams* pending = nullptr,
                 E4m3Rows* xnq = nullptr, const cuda::PeerSlots* peers = nullptr) {
  const ModelConfig& cfg = ops.config();
  const int64_t hc = cfg.hc_mult, D = cfg.dim, K = hc * D;
  const int64_t M = post ? (2 + hc) * hc : hc;
  DSV4_CHECK(hc >= 1 && hc <= kMaxHc, what, ": hc_mult ", hc, " outside [1, ", kMaxHc, "]");
  DSV4_CHECK(fn_host.rows == M && fn_host.cols == K, what, ": fn is [", fn_host.rows, ", ", fn_host.cols,
             "], expected [", M, ", ", K, "]");
  DSV4_CHECK(int64_t(base.size()) == M && int64_t(scale.size()) >= (post ? 3 : 1), what, ": base has ",
             base.size(), " values (expected ", M, "), scale ", scale.size());
  DSV4_CHECK(n >= 0 && n <= int64_t(65535), what, ": ", n, " tokens in one step (at most 65535)");
  if (n == 0) return;
  const cuda::DeviceWeight& fn = ops.dev(fn_host);
  const bool vec = K % 4 == 0 && cuda::aligned16(X);               // hc_mix: packs along the flattened rows
  const bool vec_d = vec && D % 4 == 0 && cuda::aligned16(x);       // hc_finish: packs along each stream

  const int rows_per_warp = int(cuda::ceil_div(M + 1, kMixWarps));
  DSV4_ASSERT(rows_per_warp <= 4);
  int64_t chunks = 0;
  float* partial = nullptr;
  const auto partials = [&] {
    return static_cast<float*>(ops.workspace(cuda::kWsHcPartials, size_t(chunks * n * (M + 1)) * sizeof(float)));
  };
  if (pending) {
    DSV4_ASSERT(vec_d);
    chunks = cuda::ceil_div(D, kPostMixCols);
    partial = partials();
    HcPostMixParams mix{*pending, fn, partial, int(M)};
    const dim3 block{kMixWarps * 32};
    if (peers) {
      DSV4_ASSERT(chunks * n <= cuda::kPeerSlots);
      mix.peers = *peers;
    }
    if (n <= kPostMixMaxTokens) {
      const dim3 grid{unsigned(chunks), unsigned(n)};
      switch (rows_per_warp) {
        case 1: cuda::launch_pdl(hc_post_mix_kernel<1>, grid, block, 0, ops.stream(), ops.pdl(), mix); break;
        case 2: cuda::launch_pdl(hc_post_mix_kernel<2>, grid, block, 0, ops.stream(), ops.pdl(), mix); break;
        default: cuda::launch_pdl(hc_post_mix_kernel<4>, grid, block, 0, ops.stream(), ops.pdl(), mix); break;
      }
    } else {
      // Runs of tiles for one wave of kPostMixBlocksPerSm blocks an SM: fn is loaded once per block.
      const int64_t tiles = cuda::ceil_div(n, int64_t(kPostMixTileTokens));
      const int64_t runs = std::clamp<int64_t>(kPostMixBlocksPerSm * ops.props().multiProcessorCount / chunks, 1, tiles);
      mix.tiles = int(cuda::ceil_div(tiles, runs));
      DSV4_ASSERT(cuda::ceil_div(M, int64_t(kMixWarps)) <= 3);  // hc ≤ 4: M ≤ 24
      const dim3 grid{unsigned(chunks), unsigned(cuda::ceil_div(tiles, int64_t(mix.tiles)))};
      switch (cuda::ceil_div(M, kMixWarps)) {  // fn rows a warp
        case 1: cuda::launch_pdl(hc_post_mix_tiled_kernel<1>, grid, block, 0, ops.stream(), ops.pdl(), mix); break;
        case 2: cuda::launch_pdl(hc_post_mix_tiled_kernel<2>, grid, block, 0, ops.stream(), ops.pdl(), mix); break;
        default: cuda::launch_pdl(hc_post_mix_tiled_kernel<3>, grid, block, 0, ops.stream(), ops.pdl(), mix); break;
      }
    }
  } else {
    // Split K so that chunks × token tiles fills the GPU about twice (hc_mix_staged: kMixStagedBlocksPerSm
    // blocks an SM); each chunk a whole number of lane sweeps.
    const bool staged = vec && n >= kMixStagedMinTokens;
    const int64_t pack = vec ? 4 : 1, tiles = cuda::ceil_div(n, kMixTokens);
    const int64_t blocks = (staged ? kMixStagedBlocksPerSm : 2) * int64_t(ops.props().multiProcessorCount);
    const int64_t target_chunks = cuda::ceil_div(blocks, tiles);
    const int64_t sweeps = std::max<int64_t>(1, cuda::ceil_div(cuda::ceil_div(K, 32 * pack), target_chunks));
    const int64_t chunk_cols = 32 * pack * sweeps;
    chunks = cuda::ceil_div(K, chunk_cols);
    partial = partials();
    const HcMixParams mix{X, fn, partial, n, K, int(M), chunk_cols};
    const dim3 mix_grid{unsigned(chunks), unsigned(tiles)};
    if (staged) launch_hc_mix_staged(mix, rows_per_warp, mix_grid, ops.stream(), ops.pdl());
    else if (vec) launch_hc_mix<4>(mix, rows_per_warp, mix_grid, ops.stream(), ops.pdl());
    else launch_hc_mix<1>(mix, rows_per_warp, mix_grid, ops.stream(), ops.pdl());
  }

  HcFinishParams fin{X,  partial, chunks, n, D, int(hc), int(M), ops.dev(base), ops.dev(scale),
                     float(cfg.hc_eps), cfg.norm_eps, int(cfg.hc_sinkhorn_iters), x, post, comb};
  fin.bf16 = ops.fast();
  if (xn) {
    DSV4_ASSERT(vec_d && cuda::aligned16(xn) && cuda::aligned16(gamma));
    fin.gamma = gamma;
    fin.xn = xn;
    fin.rms_eps = float(cfg.norm_eps);
    if (xnq) {
      DSV4_CHECK(D % 128 == 0 && xnq->cols == D && xnq->rows >= n && cuda::aligned16(xnq->codes), what,
                 ": act_quant'ed rows [", xnq->rows, ", ", xnq->cols, "] for ", n, " rows of ", D);
      fin.codes = xnq->codes;
      fin.scales = xnq->scales;
      fin.scale_ld = xnq->scale_ld;
    }
    if (n > ops.props().multiProcessorCount) {  // beyond one wave of hc_finish: hc_coeffs + hc_collapse
      fin.pre = static_cast<float*>(ops.workspace(cuda::kWsHcPre, size_t(n * hc) * sizeof(float)));
      cuda::launch_pdl(hc_coeffs_kernel, dim3(unsigned(cuda::ceil_div(n, int64_t(kCollapseWarps)))),
                       dim3(kCollapseThreads), 0, ops.stream(), ops.pdl(), fin);
      const dim3 grid(1, unsigned(n)), block(kCollapseThreads);
      switch (norm_slices(D)) {
        case 1: cuda::launch_pdl(hc_collapse_kernel<1>, grid, block, 0, ops.stream(), ops.pdl(), fin); break;
        case 2: cuda::launch_pdl(hc_collapse_kernel<2>, grid, block, 0, ops.stream(), ops.pdl(), fin); break;
        case 4: cuda::launch_pdl(hc_collapse_kernel<4>, grid, block, 0, ops.stream(), ops.pdl(), fin); break;
        default: cuda::launch_pdl(hc_collapse_kernel<8>, grid, block, 0, ops.stream(), ops.pdl(), fin); break;
      }
      return;
    }
    const dim3 grid(1, unsigned(n));
    switch (norm_slices(D)) {
      case 1: launch_hc_finish<4, 1>(fin, grid, ops.stream(), ops.pdl()); break;
      case 2: launch_hc_finish<4, 2>(fin, grid, ops.stream(), ops.pdl()); break;
      case 4: launch_hc_finish<4, 4>(fin, grid, ops.stream(), ops.pdl()); break;
      default: launch_hc_finish<4, 8>(fin, grid, ops.stream(), ops.pdl()); break;
    }
    return;
  }
  const dim3 fin_grid(unsigned(cuda::ceil_div(D, kCollapseThreads * (vec_d ? 4 : 1))), unsigned(n));
  if (vec_d) launch_hc_finish<4, 1>(fin, fin_grid, ops.stream(), ops.pdl());
  else launch_hc_finish<1, 1>(fin, fin_grid, ops.stream(), ops.pdl());
}

// hc_pre_norm's shape checks, and whether hc_finish can write the norm (packs of 4, one block per token);
// the uploaded gain in *g.
bool norm_fuses(const CudaOps& ops, const char* what, const float* X, const std::vector<float>& gamma, int64_t dim,
                const float* x, const float* xn, const float* post, const float* comb, const float** g) {
  DSV4_CHECK(post && comb, what, ": post and comb outputs are required");
  DSV4_CHECK(dim == ops.config().dim && int64_t(gamma.size()) == dim, what, ": gain of ", gamma.size(),
             " for rows of ", dim, " (model dim ", ops.config().dim, ")");
  *g = ops.dev(gamma);
  return norm_slices(dim) > 0 && dim % 4 == 0 && cuda::aligned16(X) && cuda::aligned16(x) && cuda::aligned16(xn) &&
         cuda::aligned16(*g);
}

}  // namespace

void CudaOps::hc_pre(const float* X, const HcWeights& w, int64_t n, float* x, float* post, float* comb) {
  DSV4_CHECK(post && comb, "hc_pre: post and comb outputs are required");
  hc_collapse(*this, X, w.fn, w.base, w.scale, n, x, post, comb, "hc_pre");
}

void CudaOps::hc_pre_norm(const float* X, const HcWeights& w, const std::vector<float>& gamma, int64_t n,
                          int64_t dim, float* x, float* xn, float* post, float* comb, E4m3Rows* xnq) {
  const float* g = nullptr;
  if (!norm_fuses(*this, "hc_pre_norm", X, gamma, dim, x, xn, post, comb, &g))
    return Ops::hc_pre_norm(X, w, gamma, n, dim, x, xn, post, comb, xnq);
  const DeferredPost d = deferred_post_;
  if (d.n > 0 && d.X == X && d.n == n && cuda::aligned16(d.f)) {
    deferred_post_ = {};  // launched here, by hc_post_mix
    const HcPostParams pending{d.f, d.post, d.comb, d.X, n, dim, int(config_.hc_mult), fast()};
    cuda::PeerSlots peers;
    if (d.reduce) {
      if (exchange_fits(n)) peers = group_->peers()->slots(rank_);
      else group_->all_reduce(rank_, d.f, size_t(n * dim), stream_);
    }
    return hc_collapse(*this, X, w.fn, w.base, w.scale, n, x, post, comb, "hc_pre_norm", g, xn, &pending, xnq,
                       peers.ranks > 1 ? &peers : nullptr);
  }
  hc_collapse(*this, X, w.fn, w.base, w.scale, n, x, post, comb, "hc_pre_norm", g, xn, nullptr, xnq);
}

void CudaOps::hc_head(const float* X, const HcHeadWeights& w, int64_t n, float* y) {
  hc_collapse(*this, X, w.fn, w.base, w.scale, n, y, nullptr, nullptr, "hc_head");
}

void CudaOps::hc_post(const float* f, const float* post, const float* comb, int64_t n, float* X) {
  const int64_t hc = config_.hc_mult;
  DSV4_CHECK(hc >= 1 && hc <= kMaxHc, "hc_post: hc_mult ", hc, " outside [1, ", kMaxHc, "]");
  DSV4_CHECK(n >= 0 && n <= int64_t(65535), "hc_post: ", n, " tokens in one step (at most 65535)");
  // A deferred all-reduce of exactly these rows is taken over (all_reduce flushed anything deferred before it).
  const DeferredReduce r = deferred_reduce_;
  const bool takes = n > 0 && r.x == f && r.count == size_t(n * config_.dim);
  if (takes) deferred_reduce_ = {};
  flush_deferred();  // anything earlier first
  if (n > 0) deferred_post_ = {takes ? r.x : const_cast<float*>(f), post, comb, X, n, takes};
}

bool CudaOps::exchange_fits(int64_t n) const {
  const cuda::PeerExchange* peers = group_ ? group_->peers() : nullptr;
  const int64_t chunks = cuda::ceil_div(config_.dim, int64_t(kPostMixCols));
  if (!peers || chunks * n > cuda::kPeerSlots) return false;
  // Every block of hc_post_mix waits for its peers' blocks: the whole grid must be resident at once on each GPU,
  // or two ranks could each hold blocks waiting for ones the other has not started. Residency: the least of the
  // kernels' instances (the ranks' GPUs share one architecture: PeerExchange::possible).
  const auto least = [](std::initializer_list<const void*> kernels) {
    int fewest = 0;
    for (const void* kernel : kernels) {
      int blocks = 0;
      DSV4_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kMixWarps * 32, 0));
      fewest = fewest == 0 ? blocks : std::min(fewest, blocks);
    }
    return fewest;
  };
  if (n <= kPostMixMaxTokens) {
    static const int per_sm = least({reinterpret_cast<const void*>(hc_post_mix_kernel<1>),
                                     reinterpret_cast<const void*>(hc_post_mix_kernel<2>),
                                     reinterpret_cast<const void*>(hc_post_mix_kernel<4>)});
    return chunks * n <= int64_t(per_sm) * peers->sms();
  }
  // The tiled kernel's grid is one wave of kPostMixBlocksPerSm blocks an SM (hc_collapse) once the slices fit it.
  static const int tiled_per_sm = least({reinterpret_cast<const void*>(hc_post_mix_tiled_kernel<1>),
                                         reinterpret_cast<const void*>(hc_post_mix_tiled_kernel<2>),
                                         reinterpret_cast<const void*>(hc_post_mix_tiled_kernel<3>)});
  return tiled_per_sm >= kPostMixBlocksPerSm && chunks <= int64_t(kPostMixBlocksPerSm) * peers->sms();
}

void CudaOps::flush_deferred() {
  if (deferred_reduce_.count > 0) {
    const DeferredReduce r = std::exchange(deferred_reduce_, {});  // cleared first: the call below uses the stream
    group_->all_reduce(rank_, r.x, r.count, stream_);
  }
  if (deferred_post_.n == 0) return;
  const DeferredPost d = std::exchange(deferred_post_, {});  // cleared first: the launch below uses the stream
  const int64_t D = config_.dim;
  if (d.reduce) group_->all_reduce(rank_, d.f, size_t(d.n * D), stream_);
  const HcPostParams p{d.f, d.post, d.comb, d.X, d.n, D, int(config_.hc_mult), fast()};
  const bool vec = D % 4 == 0 && cuda::aligned16(d.f) && cuda::aligned16(d.X);
  const dim3 grid(unsigned(cuda::ceil_div(D, kPostThreads * (vec ? 4 : 1))), unsigned(d.n));
  if (vec) cuda::launch_pdl(hc_post_kernel<4>, dim3(grid), dim3(kPostThreads), 0, stream_, pdl(), p);
  else cuda::launch_pdl(hc_post_kernel<1>, dim3(grid), dim3(kPostThreads), 0, stream_, pdl(), p);
}

}  // namespace dsv4
