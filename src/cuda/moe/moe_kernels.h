// moe family (CUDA): the launchers behind CudaOps::moe (moe.cu), in step order:
//   router_logits  logits [n, E] = x · gateᵀ                               (route.cu)
//   route          scores, top-k / hash choice, weights, and the grouping of (token, choice) pairs by expert
//                  into chunks of ≤ kChunk pairs, all on the GPU (one block)  (route.cu)
//   expert_up      h = clip-SwiGLU(w1·x, w3·x) · weight per pair             (experts_items.cu)
//   expert_down    y = w2 · h per pair                                       (experts_items.cu)
//   combine        out = the ordered sum of each token's y rows                (experts_items.cu)
// Fast numerics (ExpertParams::fast) round inside these kernels, where the activations are staged and where the
// sums are written: no launches of their own. The router stays fp32.
// At one token each of the two runs on its decode kernel instead (experts_decode.cu) when its matrices all go
// through the tensor cores; expert_down's decode kernel combines in its blocks (no combine launch).
// Every launch reads each selected expert's weights once per chunk; the number of chunks lives on the
// device, so nothing waits for the host between the steps. expert_up's shared-expert items overlap route.
//
// Expert parallelism (model/parallel.h): a rank holds the routed experts [expert_begin, expert_end) of a layer and
// the shared expert only where has_shared. route chooses over all E experts as before, and the plan keeps only
// the local pairs: a pair of another rank's expert gets no position and no chunk, and its combine_order entry is
// −1, last in the token's order. The combines skip −1, and the shared expert's slot without it. A rank that
// gets no pair at all still writes its out rows (zeros): its share of the all-reduce that sums the ranks.
//
// The shared expert runs as the plan's first chunks (shared_items) or, in fast numerics from
// shared_grouped_min_tokens(I) tokens on the item kernels' path, between route and expert_up on the grouped path's
// GEMMs (launch_shared_grouped), which write its h and y rows: item kernels read an expert's weights once per
// chunk of kChunk tokens, so a 64-token step read the shared expert 16 times.
//
// NOTE: every kernel here lets its successor launch (pdl_trigger, launch.cuh) right after its wait for the
// predecessor, whatever its grid size, and route before its wait: each kernel's early part (weight prefetch,
// the shared expert's items, the plan read through L2) runs while its predecessor drains.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/common/check.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/device_weight.h"
#include "cuda/moe/moe_grouped.h"
#include "cuda/moe/weight_dot.cuh"
#include "cuda/moe/weight_mma.cuh"

namespace dsv4::cuda::moe {

constexpr int kChunk = 4;        // pairs (token rows) one pass of an expert kernel multiplies at once
constexpr int kMaxExperts = 512;  // route keeps per-expert counters in shared memory
constexpr int kMaxTopK = 16;

// Where a routed expert's three matrices live (one entry per expert, uploaded once per layer).
struct ExpertPtrs {
  const uint8_t* w1;  // [I, D] data
  const uint8_t* w3;  // [I, D]
  const uint8_t* w2;  // [D, I]
  const void* s1;     // their scales (nullptr for F32 / BF16)
  const void* s3;
  const void* s2;
};

// A family of matrices with one shape and format: the routed experts' w1/w3 (or w2), or one shared matrix.
struct MatFormat {
  WFormat format = WFormat::kF32;
  int64_t row_bytes = 0;
  int64_t scale_cols = 0;
  bool aligned = true;        // row_bytes % 16 == 0: 16-byte loads
  bool tensor_cores = false;  // FP4 (scales in the fp16 window) or aligned FP8: weight_mma.cuh
  bool tiled = false;         // tensor-core matrices stored in the MMA tile order (weight_mma.cuh)
  // The grouped FP8 GEMM can read it (experts_grouped.cu): tiled FP8, or tiled FP4 whose four E8M0 scales in
  // every row's 128-column block lie within kGroupedScaleSpan of each other (moe.cu's fp4_spans_fit).
  bool grouped = false;
};

// The step's plan, in the workspace. P = n·k routed pairs; pair p = t·k + j is token t's j-th choice.
struct Plan {
  float* scores = nullptr;         // [n, E] router logits, then sqrt(softplus) scores in place
  int32_t* topk_expert = nullptr;  // [n, k]
  float* topk_weight = nullptr;    // [n, k] normalised × routed_scaling_factor
  int32_t* combine_order = nullptr;  // [n, k] local choices j sorted by (expert, j): the CPU's accumulation
                                     // order; then −1 for the choices of other ranks' experts
  // Pairs sorted by expert (then by p); the n shared-expert pairs (token t, weight 1) follow at P + t.
  int32_t* pair_token = nullptr;   // [P + n]
  int32_t* pair_out = nullptr;     // [P + n] row of y: t·(k+1) + j, j = k for the shared expert
  float* pair_weight = nullptr;    // [P + n]
  // Chunks of ≤ kChunk consecutive pairs of one expert; the shared expert's shared_chunks() chunks first.
  int32_t* chunk_pair = nullptr;    // [max_chunks] first pair
  int32_t* chunk_count = nullptr;   // [max_chunks] 1 .. kChunk
  int32_t* chunk_expert = nullptr;  // [max_chunks] routed expert, −1 = shared
  int32_t* counters = nullptr;  // [1]: the chunks, written by route every step
  // From kRouteManyBlocksMin tokens route runs over blocks of route_block_tokens(n) tokens (route.cu), counting
  // each block's pairs per expert here: [route_blocks(n), E]; nullptr keeps route in one block.
  int32_t* route_counts = nullptr;
  float* h = nullptr;  // [P + n, I] SwiGLU output, weight applied, by pair
  float* y = nullptr;  // [n·(k+1), D] down projections, by pair_out
};

struct RouterLogitsParams {
  const float* x = nullptr;  // [n, D]
  MatView gate;              // [E, D]
  MatFormat gate_format;
  int64_t n = 0, D = 0, E = 0;
  float* logits = nullptr;  // [n, E]
  int passes = 1;           // gate row pairs per block: launch_router_logits sets it from n
};

struct RouteParams {
  Plan plan;
  const float* gate_bias = nullptr;  // [E] scored layers; nullptr on hash layers
  const int32_t* tid2eid = nullptr;  // [V, k] hash layers; nullptr on scored layers
  const int32_t* tokens = nullptr;   // [n] hash layers
  int64_t n = 0, E = 0, k = 0;
  float routed_scaling_factor = 1.0f;
  int expert_begin = 0, expert_end = 0;  // the rank's routed experts (file comment); [0, E) on one rank
  bool shared_items = true;              // the plan starts with the shared expert's chunks (file comment)
};

// route's tokens a block and its blocks of tokens (moe_grouped.h): none below kRouteManyBlocksMin tokens (one
// block does the step).
__host__ __device__ inline int64_t route_block_tokens(int64_t n) {
  return n >= kRouteBigBlocksMin ? kRouteBlockTokens : kRouteSmallBlockTokens;
}
__host__ __device__ inline int64_t route_blocks(int64_t n) {
  return n >= kRouteManyBlocksMin ? (n + route_block_tokens(n) - 1) / route_block_tokens(n) : 0;
}

struct ExpertParams {
  Plan plan;
  const float* x = nullptr;  // [n, D]
  const ExpertPtrs* experts = nullptr;  // [E]
  MatFormat routed_up, routed_down;     // routed w1/w3 [I, D], w2 [D, I]
  MatView shared_w1, shared_w3, shared_w2;
  MatFormat shared_up, shared_down;
  int64_t n = 0, D = 0, I = 0, k = 0;
  int64_t E = 0;              // routed experts (the grouped path's tile plan)
  bool has_shared = true;     // the rank holds the shared expert: the combines add its y rows (file comment)
  bool shared_items = true;   // ... and the expert kernels compute them (the plan's first chunks)
  float swiglu_limit = 0.0f;  // 0: no clamp
  // Fast numerics: round where CpuOps::moe does (fast-numerics.md §7 steps 15–16) — each GEMM's activations as
  // it stages them (act_quant for FP8 / FP4), its outputs and h to bf16 (experts.cuh), the combined sum once.
  bool fast = false;
  bool round_sum = true;      // fast numerics: the combined sum rounded (false: a rank's share, Ops::moe_partial)
  int64_t row_blocks = 0;     // expert_up: ceil(I / rows per item); expert_down: ceil(D / rows per item)
  int64_t staged_rows = 0;    // activation rows staged per pass: rows_for(min(kChunk, n)) (a token's k experts
                              // are distinct, so a chunk holds each token at most once)
  float* out = nullptr;       // [n, D]
};

// Items: kUpRowsPerItem rows of w1 and w3, kDownRowsPerItem rows of w2. Tensor-core path: the warps split K
// over the item's 16-row tiles (up: one tile of w1 and one of w3; down: kDownTiles tiles of w2, as many bytes
// per warp as up's, since w2's K is half of w1's at V4's shapes: every item ends in barriers, and two tiles a
// down item left expert_down at ~40% of the copy bandwidth at 64 tokens). fp32 path: each warp owns
// kUpRowsPerWarp / kDownRowsPerWarp whole rows, down in kDownRowsPerItem / (kDownRowsPerWarp · warps) passes.
constexpr int kUpRowsPerWarp = 2;
constexpr int kDownRowsPerWarp = 4;
constexpr int kExpertWarps = 8;
constexpr int kMmaRows = 16, kMmaCols = 8;  // mma m16n8k16: rows of a tile; columns, two per token (hi, lo)
static_assert(kMmaRows == kTileRows, "the MMA tile order stores whole MMA tiles");
static_assert(2 * kChunk <= kMmaCols, "a pass's tokens fit the MMA's columns as hi / lo pairs");
constexpr int kDownTiles = 4;
constexpr int kUpRowsPerItem = kUpRowsPerWarp * kExpertWarps;
constexpr int kDownRowsPerItem = kDownTiles * kMmaRows;
static_assert(kUpRowsPerItem == kMmaRows, "an up item is one tile of w1 and one of w3");
static_assert(kDownRowsPerItem % (kDownRowsPerWarp * kExpertWarps) == 0, "the fp32 path's passes cover a down item");

// The shared expert's chunks at the head of the plan: ceil(n / kChunk), or none (file comment).
__host__ __device__ inline int shared_chunks(int64_t n, bool shared_items) {
  return shared_items ? int((n + kChunk - 1) / kChunk) : 0;
}


// Activation rows a pass of `count` pairs stages and multiplies: the kernels are instantiated for 1, 2 and 4.
__host__ __device__ constexpr int rows_for(int count) { return count <= 1 ? 1 : count == 2 ? 2 : kChunk; }

// Blocks of `kernel` that fit on one SM with `threads` and `smem` dynamic bytes; allows more than 48 KiB of
// dynamic shared memory first. Computed once per kernel, device and size (host calls stay out of the steps).
int prepare_kernel(const void* kernel, int threads, size_t smem);

// pdl: launch with programmatic stream serialization (sm_90; the kernels wait for their predecessor first).
// sm_count sizes the work-stealing grids of the expert kernels to the blocks that fit at once.
void launch_router_logits(const RouterLogitsParams& p, bool pdl, cudaStream_t stream);
void launch_route(const RouteParams& p, bool pdl, cudaStream_t stream);
void launch_expert_up(const ExpertParams& p, int sm_count, bool pdl, cudaStream_t stream);
void launch_expert_down(const ExpertParams& p, int sm_count, bool pdl, cudaStream_t stream);  // and the combine
// out[t] = Σ over t's choices in (expert, j) order of its y rows, then the shared expert's (the CPU's order;
// another rank's experts and an absent shared expert add nothing), in fp32; fast numerics round it once.
void launch_combine(const ExpertParams& p, bool pdl, cudaStream_t stream);

// ---- The grouped path (experts_grouped.cu): fast numerics at n ≥ grouped_min_tokens(I) (moe_grouped.h), when
// every expert matrix is `grouped`. Per expert a real GEMM over its tokens: e4m3 weights (FP4 e2m1 widened, its
// scales folded as below) × act_quant'ed e4m3 activations, as exact f16 operands of mma.sync m16n8k16 (sm_90
// emulates the e4m3 form), fp32 accumulation, the weight and activation scales applied per 128-column K block in
// fp32 — or, from grouped_wgmma_min_pairs() pairs an expert (moe_grouped.h), the e4m3 values on wgmma
// (experts_wgmma.cu; GroupedBuffers::wgmma). Launches, after route:
//   grouped_quant (x → its e4m3 values as f16 or bytes, in the kernel's order, + a power-of-two scale per 128
//   columns),
//   grouped_tiles (the plan's expert segments cut into tiles of ≤ kGroupedTokens pairs), grouped_up (w1, w3,
//   SwiGLU, weight → h), grouped_quant (h), grouped_down (w2 → y), combine (y → out in the CPU's order,
//   launch_combine).
constexpr int kGroupedTokens = 64;     // pairs of one expert per tile: the GEMM's N
// Routed FP4 tiles where experts hold few pairs (grouped_routed_tile): a kernel of ≤ 128 registers, two blocks an
// SM (experts_grouped.cu).
constexpr int kGroupedSmallTokens = 24;
// Routed FP4 tiles where experts hold a few pairs each (decode steps: grouped_routed_tile), on wgmma's N = 16
// (experts_wgmma.cu): the FP4 decode feeds wgmma's k32 e4m3 steps (docs/design/moe.md, "Decode tiles on wgmma" and
// "The FP4 bit order": since the FP4 bit order, ahead of the item kernels from 16 tokens of V4-Flash and of every
// other tile up to 1024).
constexpr int kGroupedDecodeTokens = 16;
// Routed FP4 tiles where experts hold many pairs (prefill: grouped_routed_tile), on wgmma's N = 128 with both
// operands in shared memory, the FP4 decode in a producer warpgroup (experts_wide.cu; docs/design/moe.md, "Wide
// tiles").
constexpr int kGroupedWideTokens = 128;
constexpr int kGroupedScaleSpan = 9;   // FP4: max − min of a row's four E8M0 scales in one 128-column block
constexpr int kGroupedScaleMin = 7;    // FP4: the smallest E8M0 scale (wgmma_fp4.cuh: a normal weight factor)

struct GroupedBuffers {
  // Activations act_quant'ed to e4m3 values, stored as f16 codes (the GEMMs multiply in f16: experts_grouped.cu).
  uint16_t* xq_routed = nullptr;  // [n, D] x in the routed format's fragment order
  uint16_t* xq_shared = nullptr;  // [n, D] in the shared expert's fragment order
  float* xs = nullptr;           // [n, D / 128] their scales
  uint16_t* hq = nullptr;        // [P + n, I] h (routed pairs: routed order; shared: shared order)
  float* hs = nullptr;           // [P + n, I / 128]
  int32_t* tile_expert = nullptr;  // [max_tiles] −1 = shared
  int32_t* tile_pair0 = nullptr;   // [max_tiles]
  int32_t* tile_count = nullptr;   // [max_tiles] 1 .. kGroupedTokens
  int32_t* tiles = nullptr;        // [1] tiles of this step
  int64_t max_tiles = 0;
  bool routed = true;  // grouped_tiles: the routed experts' tiles too; false: the shared expert's alone
  // K split over up_splits / down_splits blocks (the shared expert alone: its few tiles would leave most SMs idle),
  // their fp32 sums in partials [tile][split][split_slab floats] and added up by a finish launch. The split count
  // follows the SM count: each device's results are deterministic, but the sums' order (so their last bits)
  // differs between GPUs with different SM counts.
  float* partials = nullptr;
  int64_t partial_floats = 0;
  int up_splits = 1, down_splits = 1;
  int routed_tile = kGroupedTokens;  // pairs per routed tile: kGroupedTokens or kGroupedSmallTokens
  // Tiles of kGroupedTokens pairs on wgmma (experts_wgmma.cu; moe_grouped.h says when): their activations are then
  // e4m3 bytes in the wgmma order (wgmma_pos), each row in the first K bytes of its 2K-byte row of the buffers above:
  // row r starts where its f16 codes would, so grouped_quant addresses rows one way for both kernels. Small routed
  // tiles stay on mma.sync in the f16 fragment order: with them only the shared expert's tiles take wgmma.
  bool wgmma = false;
  // Routed wide tiles (routed_tile == kGroupedWideTokens) take their activations by TMA, a tile's rows as one box:
  // e4m3 bytes in column order, a pair a row, K bytes a row (x in xq_pairs, h in the first P·I bytes of hq), their
  // scales by K block then pair (xs_pairs [D / 128, pairs_ld], hs_pairs [I / 128, pairs_ld]; pairs_ld = P rounded
  // up to 4, a TMA row stride being a multiple of 16 bytes). slot_pair [n·k]: the pair of token t's choice j, −1
  // for another rank's expert (grouped_tiles writes it; grouped_quant copies x's rows to their pairs by it). The
  // shared expert's tiles of kGroupedTokens stay on the kernel above, in the rows above.
  uint8_t* xq_pairs = nullptr;
  float* xs_pairs = nullptr;
  float* hs_pairs = nullptr;
  int64_t pairs_ld = 0;
  int32_t* slot_pair = nullptr;
};

// The wgmma kernels' activation order (experts_wgmma.cu): in each 128-column K block the e4m3 code of column col
// lies at byte wgmma_pos(fp4, col), so that k slot 32s + 16u + 4c + i of the block (wgmma step s, half u of the
// A fragment, lane c of a quad) holds the column that the weight decode hands lane c for that slot:
//   FP4  col = 32c + 8s + 4u + i           (lane c's 16-byte unit is the 32 columns of chunk c);
//   FP8  col = 64(s / 2) + 16c + 8(s % 2) + 4u + i   (two 64-column K groups, 16 columns a lane).
__host__ __device__ constexpr int wgmma_pos(bool fp4, int col) {
  const int i = col % 4, u = (col / 4) % 2;
  const int c = fp4 ? col / 32 : (col / 16) % 4;
  const int s = fp4 ? (col / 8) % 4 : 2 * (col / 64) + (col / 8) % 2;
  return 32 * s + 16 * u + 4 * c + i;
}

// The GEMM (up: w1 and w3 with the SwiGLU into h; else w2 into y) of tiles [tile_begin, tile_end) of ≤
// tile_pairs pairs (kGroupedTokens or kGroupedDecodeTokens) on wgmma, K unsplit (experts_wgmma.cu; only the
// shared expert alone splits K, on mma.sync).
// Requires an sm_90a device and D, I multiples of 128. beside_shared: decode tiles launched right after the shared
// expert's tiles of the same GEMM, which they need not wait for: they start once those are all resident
// (programmatic dependent launch), and the launch completes only after them (experts_wgmma.cu).
void launch_grouped_wgmma(bool up, const ExpertParams& p, const GroupedBuffers& g, int64_t tile_begin,
                          int64_t tile_end, int tile_pairs, cudaStream_t stream, bool beside_shared = false);

// The routed GEMM (up or down) of tiles [tile_begin, tile_end) of ≤ kGroupedWideTokens pairs on wgmma with both
// operands in shared memory (experts_wide.cu), K unsplit. Requires an sm_90a device, routed FP4 experts in the
// MMA tile order, D and I multiples of 128.
void launch_grouped_wide(bool up, const ExpertParams& p, const GroupedBuffers& g, int64_t tile_begin,
                         int64_t tile_end, cudaStream_t stream);

// Upper bound of the tiles of a step of n tokens (ceil(n / kGroupedTokens) shared, Σ ceil(count_e / N) ≤ P / N +
// min(E, P) routed for routed tiles of N pairs).
inline int64_t grouped_max_tiles(int64_t n, int64_t k, int64_t E, int routed_tile) {
  const int64_t P = n * k;
  return (n + kGroupedTokens - 1) / kGroupedTokens + (P + routed_tile - 1) / routed_tile + std::min(E, P);
}
// The routed tiles' size for a step (GroupedBuffers::routed_tile), where every routed matrix is FP4 (moe_grouped.h):
// on sm_90a (cc_major 9) with wgmma on, kGroupedWideTokens from grouped_wide_tile_min_pairs() pairs an expert on
// average and kGroupedDecodeTokens up to grouped_decode_tile_max_pairs(); else kGroupedSmallTokens up to
// grouped_small_tile_max_pairs(); else kGroupedTokens.
int grouped_routed_tile(int64_t n, int64_t k, int64_t E, bool routed_fp4, int cc_major);
// Whether a step of the grouped path with routed tiles of routed_tile pairs runs its tiles of kGroupedTokens on wgmma
// (moe_grouped.h), on sm_90a (major 9): all of them from grouped_wgmma_min_pairs() pairs an expert on average; the
// shared expert's beside small routed tiles; every tile beside decode tiles (which are wgmma's).
bool grouped_takes_wgmma(int64_t n, int64_t k, int64_t E, int routed_tile, int cc_major);
bool grouped_fits(const ExpertParams& p);
void launch_experts_grouped(const ExpertParams& p, const GroupedBuffers& g, cudaStream_t stream);

// The shared expert alone on the grouped path, after route (it reads pair_token and pair_out) and before the item
// kernels, which then skip it (shared_items false; file comment): x's quantisation, its tiles, up, h's, down; the
// GEMMs' K split to fill sm_count SMs, the partial sums in g.partials (shared_split_floats of them).
bool shared_grouped_fits(const ExpertParams& p);
int64_t shared_split_floats(int64_t n, int64_t D, int64_t I, int sm_count);
void launch_shared_grouped(const ExpertParams& p, const GroupedBuffers& g, int sm_count, cudaStream_t stream);

}  // namespace dsv4::cuda::moe
