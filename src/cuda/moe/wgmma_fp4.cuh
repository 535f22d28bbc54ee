// moe family (CUDA): what the grouped path's two wgmma kernels share (experts_wgmma.cu: the weights as wgmma's A
// from registers; experts_wide.cu: both operands from shared memory) — the FP4 weights widened to e4m3, and each K
// block's partial sums promoted into the fp32 total with the weight and activation scales.
//
// FP4: a row's 32-column chunk of E8M0 scale b decodes to e2m1 · 2^(b − b_max + kLift), b_max the largest of the
// row's four chunk scales in the 128-column K block — a normal e4m3 for b_max − b ≤ kGroupedScaleSpan (checked on
// the host), so exact — and 2^(b_max − 127 − kLift) joins the promotion's scale.
// Precision: the FP8 tensor core keeps ~14 significant bits of its accumulator (tc_wgmma.cuh), so each K block is
// summed into cleared registers and promoted in fp32, as DeepSeek's own FP8 kernels promote every 128 columns.
#pragma once

#include <cstdint>

#include "cuda/moe/moe_kernels.h"
#include "cuda/moe/weight_mma.cuh"

namespace dsv4::cuda::moe {

constexpr int kLift = 6;
static_assert(0.5 * (1 << kLift) / (1 << kGroupedScaleSpan) >= 1.0 / 64 && (6 << kLift) <= 448,
              "the lifted e2m1 magnitudes must be normal e4m3 values");
static_assert(kGroupedScaleMin >= kLift + 1, "fp4_tables' weight factor 2^(b_max − 127 − kLift) must be normal");
constexpr uint32_t kE2m1CodesLo = 0x3C383000u;  // e4m3 codes of 0, 0.5, 1, 1.5
constexpr uint32_t kE2m1CodesHi = 0x4C484440u;  // of 2, 3, 4, 6

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// The lifted e4m3 tables (fp4_lookup's: weight_mma.cuh) of chunk c of a row whose four chunk scales are the bytes
// of s, and the row's weight factor 2^(b_max − 127 − kLift). A normal e4m3's code moves by 8 a power of two, so the
// eight magnitudes at one scale are the table at lift 0 plus 8 · lift each (0 stays 0). select_c = 0x4440 + c
// (prmt's selector of byte c). Every scale byte ≥ kLift + 1 (fp4_spans_fit): the factor is a normal float.
// b_max lands in both u16 halves of bb (two max.u16x2), and the IMADs undo the copy: mod 2^32, bb · 0x00080800 =
// b_max · 0x08080800, bb · 0x0808 = b_max · 0x08080808 and bb · 2^23 = b_max · 2^23. 6 ALU and 5 IMAD instructions,
// the four lanes of a row each computing its b_max (docs/design/moe.md, "The chunk tables on the FMA pipe").
__device__ __forceinline__ void fp4_tables(uint32_t s, uint32_t select_c, uint32_t& tab_lo, uint32_t& tab_hi,
                                           float& sw) {
  uint32_t pairs, bb;
  // The largest of the four bytes: the even and odd bytes as u16 halves, their larger ones, then the larger half
  // against the halves swapped.
  asm("max.u16x2 %0, %1, %2;" : "=r"(pairs) : "r"(prmt(s, 0u, 0x4140u)), "r"(prmt(s, 0u, 0x4342u)));
  asm("max.u16x2 %0, %1, %2;" : "=r"(bb) : "r"(pairs), "r"(prmt(pairs, 0u, 0x1032u)));
  const uint32_t b = prmt(s, 0u, select_c);
  // (b − b_max) · 8 per byte + the table at kLift: lift = b − b_max + kLift ≥ kLift − kGroupedScaleSpan = −3 and
  // every nonzero table byte ≥ 0x30, so no byte borrows.
  tab_lo = b * 0x08080800u + (kE2m1CodesLo + 8u * kLift * 0x01010100u - bb * 0x00080800u);
  tab_hi = b * 0x08080808u + (kE2m1CodesHi + 8u * kLift * 0x01010101u - bb * 0x00000808u);
  sw = __uint_as_float(bb * (1u << 23) - uint32_t(kLift << 23));
}
// total[4j + 2h + e] (row g + 8h, column 8j + 2c + e: tc_wgmma.cuh) += part · sw[h] · x_e for j's two columns.
template <int kAcc>
__device__ __forceinline__ void promote_columns(float (&total)[kAcc], const float (&part)[kAcc], const float (&sw)[2],
                                                int j, float x0, float x1) {
  total[4 * j] = fmaf(part[4 * j], sw[0] * x0, total[4 * j]);
  total[4 * j + 1] = fmaf(part[4 * j + 1], sw[0] * x1, total[4 * j + 1]);
  total[4 * j + 2] = fmaf(part[4 * j + 2], sw[1] * x0, total[4 * j + 2]);
  total[4 * j + 3] = fmaf(part[4 * j + 3], sw[1] * x1, total[4 * j + 3]);
}

// total += part · sw[row half] · sx[column] over a tile of N = 2·kAcc columns (pairs); sx the K block's activation
// scales where promote_scale_slot puts them with the same kStride, so that this thread's columns 8j + 2c, + 1 lie
// at c·kStride + 2j, + 1 (kStride > kAcc / 2 pads the four lane groups' runs apart: their 16-byte loads then meet no
// bank twice).
template <int kAcc, int kStride = kAcc / 2>
__device__ __forceinline__ void promote(float (&total)[kAcc], const float (&part)[kAcc], const float (&sw)[2],
                                        const float* sx, int c) {
#pragma unroll
  for (int jj = 0; jj < kAcc / 8; ++jj) {
    const float4 x = *reinterpret_cast<const float4*>(sx + c * kStride + 4 * jj);
    promote_columns(total, part, sw, 2 * jj, x.x, x.y);
    promote_columns(total, part, sw, 2 * jj + 1, x.z, x.w);
  }
}

// The same with column m's scale at sx[m], as a TMA box lands them (sx only 4-byte aligned: scalar loads; laying
// them out in promote's order on the producer's side cost more than the loads: docs/design/moe.md, "Wide tiles").
template <int kAcc>
__device__ __forceinline__ void promote_natural(float (&total)[kAcc], const float (&part)[kAcc], const float (&sw)[2],
                                                const float* sx, int c) {
#pragma unroll
  for (int j = 0; j < kAcc / 4; ++j) promote_columns(total, part, sw, j, sx[8 * j + 2 * c], sx[8 * j + 2 * c + 1]);
}

// Accumulator i of a thread (lane group c) sums the tile's pair tile_pair(i, c) (tc_wgmma.cuh's column layout); the
// kAcc / 2 distinct pairs of a thread take slots pair_slot(i).
__device__ __forceinline__ int tile_pair(int i, int c) { return 8 * (i / 4) + 2 * c + i % 2; }
__device__ __forceinline__ int pair_slot(int i) { return 2 * (i / 4) + i % 2; }

// v[pair0 + m] for each of this thread's pairs m < count (fill past it), into their slots. The epilogues load these
// (routing weights, output rows) before they store anything: a load after a store to h or y waits for it, as far as
// the compiler knows they may alias — a global round trip a pair (docs/design/moe.md, "The wide kernel by
// elimination").
template <int kAcc, typename T>
__device__ __forceinline__ void load_pairs(T (&out)[kAcc / 2], const T* v, int pair0, int count, int c, T fill) {
#pragma unroll
  for (int i = 0; i < kAcc; ++i)
    if (i % 4 < 2) out[pair_slot(i)] = tile_pair(i, c) < count ? v[pair0 + tile_pair(i, c)] : fill;
}

// Where column m puts its activation scale for promote<kAcc, stride> (a tile of N = 2·kAcc pairs: stride ≥ N / 4).
__device__ __forceinline__ int promote_scale_slot(int m, int stride) { return (m % 8) / 2 * stride + 2 * (m / 8) + m % 2; }

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace dsv4::cuda::moe
