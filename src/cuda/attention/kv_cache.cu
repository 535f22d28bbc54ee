// attention family (CUDA): the compact caches (spec §11) — allocation, the store kernel that quantises rows into
// them (alone, or fused with kv_finish's norm and RoPE), and the fp32 views tests use. Reading inside kernels:
// kv_cache.cuh.
//
// Why compact storage is exact: in reference and fast numerics every window / compressed KV vector leaves
// sim_fp8 as e4m3 × 2^k per 64 non-rope channels, and every indexer key leaves hadamard_sim_fp4 as e2m1 × 2^k
// per 32, so 1 byte (or half a byte) plus one E8M0 scale per block holds it without loss. Re-quantising a
// simulated row returns it unchanged (the block's largest value keeps the scale, or sits at half the grid's max
// and every value doubles exactly), so cache_store may be given simulated or raw rows alike. Rope channels stay
// fp32: the fixtures' numerics keep them unrounded (fast numerics' are bf16 values, which fp32 holds).
#include <algorithm>
#include <cstring>
#include <optional>

#include "cuda/attention/kv_cache.cuh"
#include "cuda/common/check.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/sequence_table.cuh"
#include "cuda/norm_rope/norm_rope_row.cuh"

namespace dsv4 {
namespace cuda {
namespace {

constexpr int kStoreWarps = 8;

int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

CacheLayout make_layout(CacheFormat format, int64_t rows, int64_t dim, int64_t rope_dim) {
  CacheLayout l;
  l.format = format;
  l.rows = rows;
  l.dim = dim;
  if (format == CacheFormat::kFp8Kv) {
    const int64_t nope = dim - rope_dim;
    DSV4_CHECK(rope_dim >= 0 && nope >= 4 && nope % 4 == 0 && rope_dim % 4 == 0, "alloc_cache: an FP8 KV row of ",
               dim, " channels with ", rope_dim, " rope channels (needs multiples of 4 on both sides)");
    l.nope = int32_t(nope);
    l.scales = int32_t(nope);
    l.rope = int32_t(round_up(nope + ceil_div(nope, 64), 16));
    l.row_bytes = round_up(l.rope + 4 * rope_dim, 16);
  } else {
    DSV4_CHECK(dim >= 32 && dim % 32 == 0, "alloc_cache: FP4 key rows of ", dim, " channels (needs a multiple of 32)");
    l.scales = int32_t(dim / 2);
    l.row_bytes = round_up(dim / 2 + dim / 32, 16);
  }
  return l;
}

struct StoreParams {
  CacheLayout layout;
  uint8_t* cache;
  const float* src;  // [n, src_stride]
  int64_t src_stride, n, row0, modulo;
};

// One warp per (row, item) (kv_cache.cuh's cache_store_item). (A warp per row walked its 7–16 blocks in sequence,
// a serial chain for the single row of a decode step: docs/design/attention.md.)
__global__ void __launch_bounds__(kStoreWarps * 32) cache_store_kernel(StoreParams p) {
  pdl_wait();
  const int per_row = cache_row_items(p.layout);
  const int64_t item = int64_t(blockIdx.x) * kStoreWarps + threadIdx.x / 32;
  if (item >= p.n * per_row) return;  // warp-uniform
  const int64_t i = item / per_row;
  cache_store_item(p.layout, p.src + i * p.src_stride, p.cache + ((p.row0 + i) % p.modulo) * p.layout.row_bytes,
                   int(item % per_row), int(threadIdx.x % 32));
}

struct KvFinishParams {
  const float* kv;  // [n, dim]
  NormRopeRow norm;
  int64_t first, pos0;  // block b finishes row first + b, at position pos0 + first + b
  CacheLayout layout;   // kFp8Kv, dim channels
  uint8_t* ring;        // [slots, row_bytes]
  int64_t slots;
};

// kv_finish of row i into a compact FP8 ring by one block: norm and RoPE in shared memory (norm_rope_row, its
// constants gathered before the kernel's wait), then the block's warps store the row's 64-channel blocks and its
// rope channels.
__device__ __forceinline__ void kv_finish_row(const KvFinishParams& p, int64_t i, const NormRopeRowConsts& consts,
                                              float* row_s) {
  norm_rope_row(p.norm, consts, p.kv + i * p.norm.dim, p.pos0 + i, row_s, nullptr);
  __syncthreads();
  uint8_t* row = p.ring + (p.pos0 + i) % p.slots * p.layout.row_bytes;
  for (int b = int(threadIdx.x / 32); b < cache_row_items(p.layout); b += kNormRopeThreads / 32)
    cache_store_item(p.layout, row_s, row, b, int(threadIdx.x % 32));
}

// One block per row.
__global__ void __launch_bounds__(kNormRopeThreads) kv_finish_kernel(KvFinishParams p) {
  extern __shared__ float row_s[];  // [dim]
  const int64_t i = p.first + blockIdx.x;
  const NormRopeRowConsts consts = norm_rope_row_consts(p.norm, p.pos0 + i);
  pdl_wait();
  kv_finish_row(p, i, consts, row_s);
}

constexpr int kMaxQueryKvSequences = 64;  // per launch: the table stays within 4 KB of kernel parameters
// From this many tokens in a sequence (prefill) a block norms kQueryWarpRows query rows, one a warp
// (norm_rope_row_warp): at 512 tokens × 64 heads, a block per row took 102 µs a layer for rows whose 134 MB read
// and written take 44 µs (H100 trace), each block's serial partial sums keeping few rows in flight. Decode
// keeps a block per row and its constants gathered before the wait.
constexpr int64_t kQueryWarpMinTokens = 16;
constexpr int kQueryWarpRows = kNormRopeThreads / 32;
// bf16 query heads (fast numerics) go through registers (query_rows_bf16_warp), a warp kQueryRegisterRows rows of
// mostly one position: its rotation's fp64 sin/cos once for them. At 512 tokens the fp32 rows' staged warp path
// took 49 µs a layer (H200; 1190 instructions a row) for rows whose bf16 bytes take 16.
constexpr int kQueryRegisterRows = 4;

// One sequence of a query_kv_finish launch: its blocks are the launch's [block0, block0 + n·heads + n − first).
struct QueryKvSequence {
  void* q;          // [n, heads, dim], normed and rotated in place: fp32, or bf16 (QueryKvFinishParams::q_bf16)
  const float* kv;  // [n, dim]
  uint8_t* ring;    // [slots, row_bytes]
  int64_t pos0;
  int32_t n, first, block0;  // K = V rows [first, n) are stored (the others' slots are taken by later rows)
};

struct QueryKvFinishParams {
  NormRopeRow q_norm;  // no gain
  NormRopeRow kv_norm;
  CacheLayout layout;  // kFp8Kv, dim channels
  int64_t heads, slots;
  int sequences;
  int query_rows;  // query rows a block: 1, kQueryWarpRows, or kQueryWarpRows · kQueryRegisterRows (q_bf16)
  bool q_bf16;     // every sequence's query heads are bf16 (QueryKvParams::q_bf16): query_rows_bf16_warp
  QueryKvSequence seq[kMaxQueryKvSequences];
};
static_assert(sizeof(QueryKvFinishParams) <= 4096, "query_kv_finish: the kernel parameters exceed 4 KB");

// query_kv_finish over a batch of sequences: per sequence, ceil(n·heads / query_rows) blocks norm and rotate
// query_rows query head rows each (norm_rope; one a warp when query_rows > 1; bf16 rows kQueryRegisterRows a warp
// in registers), then n − first blocks finish a K = V row each (kv_finish_row). One launch for the two and for every
// sequence: at decode each is a short chain after a PDL wait.
__global__ void __launch_bounds__(kNormRopeThreads) query_kv_finish_kernel(const __grid_constant__ QueryKvFinishParams p) {
  extern __shared__ float row_s[];  // [query_rows, dim]
  const QueryKvSequence& sq = sequence_at(p.seq, p.sequences, blockIdx.x, &QueryKvSequence::block0);
  const int64_t b = int64_t(blockIdx.x) - sq.block0, q_rows = int64_t(sq.n) * p.heads;
  const int64_t q_blocks = (q_rows + p.query_rows - 1) / p.query_rows;
  const bool query = b < q_blocks;  // block-uniform
  if (query && p.q_bf16) {
    const int64_t first = b * p.query_rows + int64_t(threadIdx.x / 32) * kQueryRegisterRows;
    pdl_wait();
    query_rows_bf16_warp(p.q_norm, static_cast<uint32_t*>(sq.q), first, min(first + kQueryRegisterRows, q_rows),
                         p.heads, sq.pos0);
    return;
  }
  if (query && p.query_rows > 1) {
    const int warp = int(threadIdx.x / 32);
    const int64_t i = b * p.query_rows + warp;
    pdl_wait();
    if (i >= q_rows) return;  // warp-uniform
    float* x = static_cast<float*>(sq.q) + i * p.q_norm.dim;
    norm_rope_row_warp(p.q_norm, x, sq.pos0 + i / p.heads, row_s + warp * p.q_norm.dim, x);
    return;
  }
  const int64_t i = query ? b : sq.first + (b - q_blocks);
  const int64_t pos = sq.pos0 + (query ? i / p.heads : i);
  const NormRopeRowConsts consts = norm_rope_row_consts(query ? p.q_norm : p.kv_norm, pos);
  pdl_wait();
  if (query) {
    float* x = static_cast<float*>(sq.q) + i * p.q_norm.dim;
    norm_rope_row(p.q_norm, consts, x, pos, row_s, x);
  } else {
    const KvFinishParams kv{sq.kv, p.kv_norm, sq.first, sq.pos0, p.layout, sq.ring, p.slots};
    kv_finish_row(kv, i, consts, row_s);
  }
}

// kv_finish's kernel parameters when it runs fused into a compact FP8 ring (simulated numerics: the store
// rounds like sim_fp8; in fast numerics norm_rope_row rounds the norm and the rotation to bf16 first, and on
// bf16 input sim_fp8's own bf16 rounding is a no-op), its arguments checked; nullopt: the default composition
// (Ops::kv_finish). Rows i and i + slots share a slot: only the last `slots` rows are stored (from `first`), as
// ring_store does.
std::optional<KvFinishParams> fused_kv_finish(const CudaOps& ops, float* kv, const std::vector<float>& gamma,
                                              int64_t n, int64_t dim, int64_t nope, int64_t pos0, RopeKind kind,
                                              bool simulate, int64_t slots, float* ring) {
  const CacheLayout* layout = ops.compact_cache(ring);
  if (!simulate || !layout || layout->format != CacheFormat::kFp8Kv || layout->nope != nope) return std::nullopt;
  DSV4_CHECK(n >= 0 && pos0 >= 0 && slots >= 1 && slots <= layout->rows && layout->dim == dim &&
                 int64_t(gamma.size()) == dim && dim - nope == ops.config().rope_dim,
             "kv_finish: ", n, " rows of ", dim, " channels (", nope, " without RoPE) into a ring of ", slots,
             " slots of a ", layout->rows, " x ", layout->dim, " cache, gain of ", gamma.size());
  DSV4_CHECK(dim <= kNormRopeMaxDim, "kv_finish: rows of ", dim, " channels (at most ", kNormRopeMaxDim, ")");
  const float eps = float(ops.config().norm_eps);
  const NormRopeRow norm{ops.dev(gamma), ops.inv_freq(kind), dim, nope, eps, ops.fast()};
  return KvFinishParams{kv, norm, std::max<int64_t>(0, n - slots), pos0, *layout, reinterpret_cast<uint8_t*>(ring),
                        slots};
}

struct LoadParams {
  CacheLayout layout;
  const uint8_t* cache;
  float* out;  // [n, dim]
  int64_t n;
};

// One thread per 4 channels.
__global__ void cache_load_kernel(LoadParams p) {
  const int64_t quads = p.layout.dim / 4, x = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (x >= p.n * quads) return;
  const int64_t r = x / quads;
  const int c = int(x % quads) * 4;
  const uint8_t* row = p.cache + r * p.layout.row_bytes;
  const float4 v = p.layout.format == CacheFormat::kFp8Kv ? load_fp8kv4(row, c, p.layout) : load_fp4key4(row, c, p.layout);
  reinterpret_cast<float4*>(p.out + r * p.layout.dim)[c / 4] = v;
}

}  // namespace

void cache_store(CudaOps& ops, const CacheLayout& layout, float* cache, const float* src, int64_t src_stride,
                 int64_t n, int64_t row0, int64_t modulo) {
  DSV4_CHECK(n >= 0 && row0 >= 0 && modulo >= 1 && src_stride >= layout.dim, "cache_store: n ", n, ", row0 ", row0,
             ", modulo ", modulo, ", src_stride ", src_stride);
  DSV4_CHECK(std::min(row0 + n, modulo) <= layout.rows, "cache_store: rows up to ", std::min(row0 + n, modulo),
             " in a cache of ", layout.rows);
  if (n == 0) return;
  const StoreParams p{layout, reinterpret_cast<uint8_t*>(cache), src, src_stride, n, row0, modulo};
  const int64_t items = n * cache_row_items(layout);
  launch_pdl(cache_store_kernel, dim3(unsigned(ceil_div(items, kStoreWarps))), dim3(kStoreWarps * 32), 0,
             ops.stream(), ops.props().major >= 9, p);
}

}  // namespace cuda

// Into a compact ring the store itself rounds like sim_fp8 (see the top of this file), so the simulation pass
// is skipped, and the norm, the RoPE and the store run as one kernel (kv is left as it came: scratch).
void CudaOps::kv_finish(float* kv, const std::vector<float>& gamma, int64_t n, int64_t dim, int64_t nope, int64_t pos0,
                        RopeKind kind, bool simulate, int64_t slots, float* ring) {
  const auto p = cuda::fused_kv_finish(*this, kv, gamma, n, dim, nope, pos0, kind, simulate, slots, ring);
  if (!p) return Ops::kv_finish(kv, gamma, n, dim, nope, pos0, kind, simulate, slots, ring);
  if (n == p->first) return;
  cuda::launch_pdl(cuda::kv_finish_kernel, dim3(unsigned(n - p->first)), dim3(cuda::kNormRopeThreads),
                   size_t(dim) * sizeof(float), stream_, pdl(), *p);
}

void CudaOps::query_kv_finish(std::span<const QueryKvParams> batch) {
  if (batch.empty()) return;
  cuda::QueryKvFinishParams k{};
  std::optional<cuda::KvFinishParams> first_kv;
  int64_t blocks = 0;
  k.query_rows = 1;
  for (const QueryKvParams& b : batch)
    if (b.n >= cuda::kQueryWarpMinTokens && b.dim * cuda::kQueryWarpRows <= cuda::kNormRopeMaxDim)
      k.query_rows = cuda::kQueryWarpRows;  // the warps' rows in the dynamic shared memory of one
  const QueryKvParams& b0 = batch[0];
  if (b0.q_bf16) k.query_rows = cuda::kQueryWarpRows * cuda::kQueryRegisterRows;
  // Shared memory: the staged query rows, or one K = V row (kv_finish_row).
  const size_t smem = size_t(b0.q_bf16 ? 1 : k.query_rows) * size_t(b0.dim) * sizeof(float);
  const auto launch = [&] {
    if (blocks > 0)
      cuda::launch_pdl(cuda::query_kv_finish_kernel, dim3(unsigned(blocks)), dim3(cuda::kNormRopeThreads), smem,
                       stream_, pdl(), k);
    blocks = 0;
    k.sequences = 0;
  };
  for (const QueryKvParams& b : batch) {
    const auto kv_p = cuda::fused_kv_finish(*this, b.kv, *b.kv_gamma, b.n, b.dim, b.nope, b.pos0, b.rope, b.simulate,
                                            b.slots, b.ring);
    if (!kv_p) {  // an fp32 ring (exact numerics): the default composition
      DSV4_CHECK(!b.q_bf16, "query_kv_finish: bf16 query heads beside an fp32 window ring");
      Ops::query_kv_finish({&b, 1});
      continue;
    }
    DSV4_CHECK((b.q != nullptr) != (b.q_bf16 != nullptr) && (!b.q_bf16 || fast()),
               "query_kv_finish: the query heads as fp32 or (fast numerics) bf16, one of the two");
    DSV4_CHECK(!b.q_bf16 || (b.dim % 64 == 0 && b.dim <= 64 * cuda::kWarpRowWords &&
                             b.dim / 64 - b.nope / 64 <= cuda::kRopeWords),
               "query_kv_finish: bf16 query heads of ", b.dim, " channels, ", b.dim - b.nope, " of them rotated (whole "
               "64-channel words, at most ", 64 * cuda::kWarpRowWords, "; the rotated ones in ", cuda::kRopeWords,
               " words)");
    DSV4_CHECK(b.heads >= 1 && b.n * b.heads + b.n <= int64_t(INT32_MAX) / 2, "query_kv_finish: ", b.n, " rows of ",
               b.heads, " query heads");
    if (!first_kv) {
      first_kv = kv_p;
      k.q_norm = {nullptr, inv_freq(b.rope), b.dim, b.nope, float(config_.norm_eps), fast()};
      k.kv_norm = kv_p->norm;
      k.layout = kv_p->layout;
      k.heads = b.heads;
      k.slots = b.slots;
      k.q_bf16 = b.q_bf16 != nullptr;
    }
    DSV4_CHECK(b.heads == k.heads && b.slots == k.slots && b.dim == k.q_norm.dim && b.nope == k.q_norm.offset &&
                   kv_p->norm.gamma == k.kv_norm.gamma && kv_p->norm.inv_freq == k.kv_norm.inv_freq &&
                   kv_p->layout.row_bytes == k.layout.row_bytes && (b.q_bf16 != nullptr) == k.q_bf16,
               "query_kv_finish: the sequences of one batch differ in more than their rows, positions and caches");
    const int64_t seq_blocks = cuda::ceil_div(b.n * b.heads, k.query_rows) + (b.n - kv_p->first);
    if (seq_blocks == 0) continue;
    if (k.sequences == cuda::kMaxQueryKvSequences || blocks + seq_blocks > int64_t(INT32_MAX) / 2) launch();
    void* const q = b.q_bf16 ? static_cast<void*>(b.q_bf16) : static_cast<void*>(b.q);
    k.seq[k.sequences++] = {q, b.kv, kv_p->ring, b.pos0, int32_t(b.n), int32_t(kv_p->first), int32_t(blocks)};
    blocks += seq_blocks;
  }
  launch();
}

float* CudaOps::alloc_cache(CacheFormat format, int64_t rows, int64_t dim) {
  DSV4_CHECK(rows >= 1 && dim >= 1, "alloc_cache: ", rows, " rows of ", dim);
  if (format == CacheFormat::kF32) return alloc(size_t(rows * dim));
  const cuda::CacheLayout layout = cuda::make_layout(format, rows, dim, config_.rope_dim);
  const size_t bytes = size_t(rows * layout.row_bytes);
  void* p = device_alloc(bytes);
  DSV4_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
  caches_[p] = layout;
  return static_cast<float*>(p);
}

void CudaOps::copy_cache(const float* src, int64_t rows, int64_t dim, float* dst) {
  const cuda::CacheLayout *from = compact_cache(src), *to = compact_cache(dst);
  if (!from && !to) return copy(src, size_t(rows * dim), dst);
  DSV4_CHECK(from && to && from->format == to->format && from->dim == dim && to->dim == dim &&
                 rows <= std::min(from->rows, to->rows),
             "copy_cache: ", rows, " rows of ", dim, " between caches of different formats or sizes");
  DSV4_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(rows * from->row_bytes), cudaMemcpyDeviceToDevice, stream_));
}

const cuda::CacheLayout* CudaOps::compact_cache(const void* p) const {
  const auto it = caches_.find(p);
  return it == caches_.end() ? nullptr : &it->second;
}

void CudaOps::read_cache(const float* cache, int64_t rows, int64_t dim, float* host) {
  const cuda::CacheLayout* l = compact_cache(cache);
  if (!l) return download(host, cache, size_t(rows * dim));
  DSV4_CHECK(l->dim == dim && rows <= l->rows, "read_cache: ", rows, " rows of ", dim, " from a cache of ", l->rows,
             " rows of ", l->dim);
  auto* staging = static_cast<float*>(workspace(cuda::kWsCacheStaging, size_t(rows * dim) * sizeof(float)));
  const cuda::LoadParams p{*l, reinterpret_cast<const uint8_t*>(cache), staging, rows};
  const int64_t threads = rows * dim / 4;
  if (threads > 0) {
    cuda::cache_load_kernel<<<unsigned(cuda::ceil_div(threads, 256)), 256, 0, stream_>>>(p);
    DSV4_LAUNCH_CHECK();
  }
  download(host, staging, size_t(rows * dim));
}

void CudaOps::write_cache(float* cache, int64_t rows, int64_t dim, const float* host) {
  const cuda::CacheLayout* l = compact_cache(cache);
  if (!l) {
    DSV4_CUDA_CHECK(cudaMemcpyAsync(cache, host, size_t(rows * dim) * sizeof(float), cudaMemcpyHostToDevice, stream_));
    DSV4_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return;
  }
  DSV4_CHECK(l->dim == dim && rows <= l->rows, "write_cache: ", rows, " rows of ", dim, " into a cache of ", l->rows,
             " rows of ", l->dim);
  auto* staging = static_cast<float*>(workspace(cuda::kWsCacheStaging, size_t(rows * dim) * sizeof(float)));
  DSV4_CUDA_CHECK(cudaMemcpyAsync(staging, host, size_t(rows * dim) * sizeof(float), cudaMemcpyHostToDevice, stream_));
  cuda::cache_store(*this, *l, cache, staging, dim, rows, 0, l->rows);
  DSV4_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace dsv4
