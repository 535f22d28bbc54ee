// moe family (CUDA): the token counts from which CudaOps::moe takes the grouped FP8 GEMM path in fast
// numerics (experts_grouped.cu; the crossover against the item kernels is measured in docs/design/moe.md), and
// route its many-block path. Tests and benchmarks move the first two to force a path.
#pragma once

#include <cstdint>

namespace dsv4::cuda::moe {

// For experts of width I (the item kernels' per-item work shrinks with it, the grouped GEMMs' less).
int64_t grouped_min_tokens(int64_t I);
void set_grouped_min_tokens(int64_t n);  // n ≤ 0: the default again

// Routed tiles of kGroupedSmallTokens pairs (moe_kernels.h) up to this many pairs per expert on average (n·k / E),
// of kGroupedTokens beyond: at ~12 pairs an expert (512 tokens of V4-Flash) a 64-pair tile is mostly empty and its
// kernel's 255 registers leave two warps a scheduler (docs/design/moe.md, "Small routed tiles").
int64_t grouped_small_tile_max_pairs();
void set_grouped_small_tile_max_pairs(int64_t pairs);  // < 0: the default again; 0: never small tiles

// Routed tiles of kGroupedDecodeTokens pairs on wgmma (moe_kernels.h, sm_90a) up to this many pairs per expert on
// average, below the small tiles (docs/design/moe.md, "Decode tiles on wgmma").
int64_t grouped_decode_tile_max_pairs();
void set_grouped_decode_tile_max_pairs(int64_t pairs);  // < 0: the default again; 0: never decode tiles

// Routed wide tiles of kGroupedWideTokens pairs (moe_kernels.h, sm_90a) from this many pairs per expert on average
// (docs/design/moe.md, "Wide tiles").
int64_t grouped_wide_tile_min_pairs();
void set_grouped_wide_tile_min_pairs(int64_t pairs);  // < 0: the default again; 0: never wide tiles
int64_t grouped_wide_launches();  // launch_grouped_wide's launches so far in this process (tests)

// The grouped path's tiles of kGroupedTokens pairs on wgmma (experts_wgmma.cu, sm_90a) rather than mma.sync from
// this many pairs an expert on average (n·k / E): below it the mma.sync kernel is faster (docs/design/moe.md,
// "wgmma"). Where routed tiles are small (fewer pairs still), the shared expert's full tiles of 64 take wgmma:
// FP8 as stored, no FP4 decode (1.8 ms → 1.77 ms a V4-Flash layer at 512 tokens). Tests and benchmarks move the
// threshold; set_grouped_wgmma(false) turns wgmma off.
int64_t grouped_wgmma_min_pairs();
void set_grouped_wgmma_min_pairs(int64_t pairs);  // ≤ 0: the default again
bool grouped_wgmma();
void set_grouped_wgmma(bool on);
// launch_grouped_wgmma's launches so far in this process (all; those of decode tiles): tests tell by them which
// arithmetic and which tiles a step took.
int64_t grouped_wgmma_launches();
int64_t grouped_decode_tile_launches();

// Below grouped_min_tokens(I), the token count from which the shared expert alone takes the grouped path
// (launch_shared_grouped, moe_kernels.h) while the routed ones stay on the item kernels.
int64_t shared_grouped_min_tokens(int64_t I);
void set_shared_grouped_min_tokens(int64_t n);  // n ≤ 0: the default again

// From kRouteManyBlocksMin tokens route runs over blocks of tokens (route.cu), not one block: of
// kRouteSmallBlockTokens tokens (a token a warp) below kRouteBigBlocksMin, of kRouteBlockTokens from there on.
// One block's warps take a token after another, each token a serial chain of ~1.7 K instructions (scores, the
// top-k rounds): 64 tokens in one block took ~21 µs a layer (H100 trace); four blocks take a token a warp.
constexpr int kRouteBlockTokens = 64;
constexpr int kRouteSmallBlockTokens = 16;
constexpr int64_t kRouteManyBlocksMin = 32;
constexpr int64_t kRouteBigBlocksMin = 4 * kRouteBlockTokens;

}  // namespace dsv4::cuda::moe
