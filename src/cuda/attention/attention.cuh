// attention family (CUDA): what the attention kernels share — the launch's parameters (a table of sequences,
// each with its query rows, caches and output), the key list of a query row, the output's rounding and
// derotation, and the tensor-core kernels' entry points (attention_tc.cu, attention_wg.cu) for the launcher in
// attention.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/kv_cache.cuh"
#include "cuda/common/cp_async.cuh"
#include "cuda/common/fp_grid.cuh"
#include "cuda/common/sequence_table.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/norm_rope/rotate.cuh"

namespace dsv4::cuda::attn {

constexpr int kMaxHeadDim = 512;  // PV: 64 threads × 2 float4 columns per head quad
constexpr int kMaxSplits = 256;
constexpr int kMaxSequences = 64;  // per launch: the table stays within the 4 KB of classic kernel parameters

// One sequence of a launch: its query rows are the launch's rows [row0, row0 + n).
struct AttnSequence {
  const void* q;            // [n, H, d] fp32, or bf16 where AttnKernelParams::q_bf16
  void* out;                // [n, H, d] fp32, or bf16 where AttnKernelParams::out_bf16
  const int32_t* selected;  // [n, top_k] or nullptr (HCA: every visible entry)
  const uint8_t* window;    // [ring_slots, d] fp32 rows, or a compact kFp8Kv cache (kv.format)
  const uint8_t* entries;   // [*, d] like the window, or nullptr (sliding layers)
  int64_t pos0;
  int32_t row0, n;
};

struct AttnKernelParams {
  CacheLayout kv;           // compact caches: their layout; kF32: rows of d floats
  int64_t row_bytes;        // between rows of the window and the entries
  const float* sinks;       // [H]
  float4* part_o;           // [rows, splits, H, d/4] unnormalised partial outputs (splits > 1; not attn_wg's)
  float2* part_ml;          // [rows, splits, H] (running max, denominator) of each partial (fast: base-2 units)
  int64_t ring_slots, window_size, top_k, ratio;
  int rows, heads, head_dim, splits, keys_per_split;
  float scale;
  const float* inv_freq;    // derotation: [rope pairs] (nullptr: none); channels [rope_offset, d) turn back
  int rope_offset;          // a multiple of 4
  int tc_heads;             // heads per block of the tensor-core kernel: 16 or 64 (kTcHeads)
  bool fast;                // fast numerics: base-2 softmax, P·V with bf16 P, bf16 output (attention.cu's top)
  bool out_bf16;            // the sequences' outputs are bf16 (AttentionParams::out_bf16), not fp32
  bool q_bf16;              // the sequences' query heads are bf16 (AttentionParams::q_bf16), not fp32
  int sequences;
  AttnSequence seq[kMaxSequences];
};
static_assert(sizeof(AttnKernelParams) <= 4096, "attention: the kernel parameters exceed 4 KB");

// The sequence of launch row r.
__device__ __forceinline__ const AttnSequence& sequence_of(const AttnKernelParams& p, int r) {
  return sequence_at(p.seq, p.sequences, r, &AttnSequence::row0);
}

// The derotation's (cos, −sin) for every rope pair of query row i, computed once per block into rot_s (read
// after a barrier): every head of the row turns by the same angles.
__device__ __forceinline__ void derotation_table(const AttnKernelParams& p, int64_t t, float2* rot_s) {
  const int pairs = (p.head_dim - p.rope_offset) / 2;
  if (p.inv_freq)
    for (int j = int(threadIdx.x); j < pairs; j += int(blockDim.x))
      rot_s[j] = rope_cos_sin(t, p.inv_freq[j], /*inverse=*/true);
}

// Fast numerics run the softmax in base-2 units (u = s · log2 e; exp2) with an integer running maximum, so P
// rounds as on the CPU whatever the partition (src/cpu/attention.cpp, attend_fast); the other numerics in e.
constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ float softmax_unit(bool fast, float s) { return fast ? s * kLog2e : s; }
__device__ __forceinline__ float softmax_exp(bool fast, float x) { return fast ? exp2f(x) : expf(x); }

__device__ __forceinline__ float4 round_bf16_if4(bool fast, float4 v) {
  return make_float4(round_bf16_if(fast, v.x), round_bf16_if(fast, v.y), round_bf16_if(fast, v.z),
                     round_bf16_if(fast, v.w));
}

// Two floats as a bf16 pair (round to nearest even), lo in the low half: the tensor-core kernels' operands.
__device__ __forceinline__ uint32_t bf16x2(float lo, float hi) {
  const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// Output values at element offset `at` of the sequence's output (a multiple of N; N = 2 or 4): fp32, or bf16 (the
// values are bf16 already: output_column rounds them in fast numerics, the only numerics that ask for bf16).
template <int N>
__device__ __forceinline__ void store_output_n(const AttnKernelParams& p, const AttnSequence& sq, int64_t at,
                                               const float (&v)[N]) {
  static_assert(N == 2 || N == 4, "pairs or quads");
  if (p.out_bf16) {
    uint32_t w[N / 2];
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
      const __nv_bfloat162 b = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
      w[k] = *reinterpret_cast<const uint32_t*>(&b);
    }
    uint16_t* out = static_cast<uint16_t*>(sq.out) + at;
    if constexpr (N == 4) *reinterpret_cast<uint2*>(out) = make_uint2(w[0], w[1]);
    else *reinterpret_cast<uint32_t*>(out) = w[0];
  } else {
    float* out = static_cast<float*>(sq.out) + at;
    if constexpr (N == 4) *reinterpret_cast<float4*>(out) = make_float4(v[0], v[1], v[2], v[3]);
    else *reinterpret_cast<float2*>(out) = make_float2(v[0], v[1]);
  }
}
__device__ __forceinline__ void store_output(const AttnKernelParams& p, const AttnSequence& sq, int64_t at, float4 v) {
  store_output_n<4>(p, sq, at, {v.x, v.y, v.z, v.w});
}
__device__ __forceinline__ void store_output(const AttnKernelParams& p, const AttnSequence& sq, int64_t at, float2 v) {
  store_output_n<2>(p, sq, at, {v.x, v.y});
}

// The tensor-core kernels' output, fast numerics. fast_output_factor: what turns a finished row's unnormalised
// sums of head `head` (running maximum m, denominator l, base-2 units) into its output — the sink in the
// denominator only; 0 for a row without keys. store_fast_pair: channels ch, ch + 1 of the row at element offset
// `out` of the sequence's output, rounded to bf16, derotated and rounded again where they are rope channels.
__device__ __forceinline__ float fast_output_factor(const AttnKernelParams& p, int head, float m, float l) {
  const float sink = softmax_unit(true, p.sinks[head]), big = fmaxf(m, sink);
  const float keep = m == -INFINITY ? 0.0f : exp2f(m - big);
  return keep / (l * keep + exp2f(sink - big));
}
__device__ __forceinline__ void store_fast_pair(const AttnKernelParams& p, const AttnSequence& sq, const float2* rot_s,
                                                int64_t out, int ch, float x, float y) {
  x = round_bf16(x);
  y = round_bf16(y);
  if (p.inv_freq && ch >= p.rope_offset) {
    rotate(x, y, rot_s[(ch - p.rope_offset) / 2]);
    x = round_bf16(x);
    y = round_bf16(y);
  }
  store_output(p, sq, out + ch, make_float2(x, y));
}

// The output's float4 column f, derotated with the table when asked (AttentionParams::derotate). Fast numerics:
// the attention output is bf16, and the derotation (CpuOps::rope) rounds what it turns to bf16 again.
__device__ __forceinline__ float4 output_column(const AttnKernelParams& p, const float2* rot_s, int f, float4 v) {
  v = round_bf16_if4(p.fast, v);
  if (p.inv_freq && 4 * f >= p.rope_offset) {
    const int pair = (4 * f - p.rope_offset) / 2;
    rotate(v.x, v.y, rot_s[pair]);
    rotate(v.z, v.w, rot_s[pair + 1]);
    v = round_bf16_if4(p.fast, v);
  }
  return v;
}

// Keys of query position t, in the CPU's order: window positions max(0, t − W + 1) .. t, then the compressed
// part (CSA: the first min(top_k, (t+1)/ratio) selected slots, −1 = masked — the rest cannot name a visible
// entry, AttentionParams::selected; HCA: entries 0 .. (t+1)/ratio − 1).
__host__ __device__ __forceinline__ int64_t window_keys(int64_t window_size, int64_t t) {
  return window_size < t + 1 ? window_size : t + 1;
}
__host__ __device__ __forceinline__ int64_t compressed_keys(bool has_entries, bool has_selected, int64_t top_k,
                                                            int64_t ratio, int64_t t) {
  if (!has_entries) return 0;
  return has_selected ? (top_k < (t + 1) / ratio ? top_k : (t + 1) / ratio) : (t + 1) / ratio;
}

// Where row j of the key list of sequence row i is, before the selection's value is looked at (a kernel can
// find it a tile ahead without waiting for the load): a window slot, or an entries row (at < 0: a masked slot of
// the selection).
struct KeyRef {
  int64_t at;
  bool window;
};
__device__ __forceinline__ KeyRef key_ref(const AttnKernelParams& p, const AttnSequence& sq, int64_t i, int64_t t,
                                          int64_t nw, int64_t j) {
  if (j < nw) return {(t - nw + 1 + j) % p.ring_slots, true};
  j -= nw;
  return {sq.selected ? int64_t(sq.selected[i * p.top_k + j]) : j, false};
}
// Its row in the caches (nullptr = masked).
__device__ __forceinline__ const uint8_t* key_source(const AttnKernelParams& p, const AttnSequence& sq, KeyRef k) {
  if (k.at < 0) return nullptr;
  return (k.window ? sq.window : sq.entries) + k.at * p.row_bytes;
}
__device__ __forceinline__ const uint8_t* key_row(const AttnKernelParams& p, const AttnSequence& sq, int64_t i,
                                                  int64_t t, int64_t nw, int64_t j) {
  return key_source(p, sq, key_ref(p, sq, i, t, nw, j));
}

// The tensor-core kernel (attention_tc.cu): fast numerics on compact FP8 caches, up to kTcHeads heads
// (AttnKernelParams::tc_heads) of one query row per block over tiles of kTcKeys keys. tc_fits: the caches and
// head_dim it takes within smem_limit bytes of shared memory per block; launch_tc: grid
// (ceil(heads / tc_heads), splits, rows).
constexpr int kTcHeads = 64;
constexpr int kTcKeys = 64;
bool tc_fits(const CacheLayout& l, int64_t head_dim, size_t smem_limit);
void launch_tc(const AttnKernelParams& k, dim3 grid, cudaStream_t stream, bool pdl);

// The warpgroup-MMA kernel (attention_wg.cu) for V4's shape on sm_90a: head_dim 512 of 448 e4m3 channels and 64
// rope ones, blocks of kTcHeads heads (tc_heads; every group whole), up to kWgMaxSplits splits, merged inside the
// kernel (no partials, no combine launch). wg_fits: the caches and the launch it takes within smem_limit;
// launch_wg: the same grid as launch_tc.
constexpr int kWgMaxSplits = 8;  // a thread-block cluster of one block a split (the portable cluster size)
bool wg_fits(const CacheLayout& l, int64_t head_dim, int64_t heads, int64_t tc_heads, int splits, int sm_major,
             size_t smem_limit);
void launch_wg(const AttnKernelParams& k, dim3 grid, cudaStream_t stream, bool pdl);

}  // namespace dsv4::cuda::attn
