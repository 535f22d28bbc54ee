// attention family (CUDA), tensor cores: CudaOps::attention in fast numerics on compact FP8 caches — what
// DeepSeek's sparse attention kernel computes: QKᵀ and P·V as bf16 MMAs with fp32 accumulation, the softmax in
// fp32 (base-2 units against an integer running maximum: attention.cu's top), P rounded to bf16, the sink in the
// denominator only, a bf16 output. attention.cu's launcher picks this kernel where tc_fits holds (but for V4's
// 64-head blocks on Hopper: attention_wg.cu), and merges its key splits with attn_combine_kernel as it does the
// fp32 kernel's.
//
// NOTE: MQA layout. The H heads of a query row share its single K = V head, so a block takes 64 heads (4 row
// tiles of 16; 16 heads where a few decode rows would leave most SMs idle: AttnKernelParams::tc_heads) of one
// query row and one split of the row's key list, in tiles of kTcKeys = 64 keys. Each tile's
// compact rows (e4m3 nope channels with an E8M0 scale per 64, fp32 rope channels; kv_cache.cuh) land raw in
// shared memory by cp.async while the previous tile computes, then decode exactly to bf16 (e4m3 · 2^k and the
// bf16-valued rope channels are bf16 values). 8 warps (mma.sync m16n8k16 bf16, operands by ldmatrix):
//   QKᵀ  warp (mh, kh) = (w % 4, w / 4): heads 16mh .. +15 × keys 32kh .. +31 of the tile over all d channels;
//   P·V  warp w: all 64 heads × channels [w·d/8, (w+1)·d/8), P from shared memory — V is read once per warp
//        slice, and the 64 × d fp32 output lives in registers (≤ 128 per thread).
// Shared matrices are rows of 16-byte chunks with chunk c of row r stored at c ^ (r % 8): ldmatrix's 8 rows of
// one chunk column fall in 8 different bank groups.
#include "cuda/attention/attention.cuh"
#include "cuda/common/check.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/smem.h"

namespace dsv4::cuda::attn {
namespace {

constexpr int kTcWarps = 8;
constexpr int kTcThreads = kTcWarps * 32;
constexpr int kMaxNt = kMaxHeadDim / 64;  // P·V n-tiles (8 channels) per warp: d / 8 channels per warp

// Byte offset of chunk c of row r in a swizzled matrix of `chunks` 16-byte chunks per row (chunks % 8 == 0).
__device__ __forceinline__ int swz(int r, int c, int chunks) { return (r * chunks + (c ^ (r & 7))) * 16; }

// Shared memory of a block, by d and the caches' row bytes.
struct TcLayout {
  int q, k, raw, p, stats, live, bytes;
  __host__ __device__ TcLayout(int d, int64_t row_bytes) {
    q = 0;                                     // [64 heads][d] bf16, swizzled
    k = q + kTcHeads * d * 2;                  // [64 keys][d] bf16, swizzled
    raw = k + kTcKeys * d * 2;                 // [64 keys][row_bytes] the tile's compact rows as stored
    p = raw + kTcKeys * int(row_bytes);        // [64 heads][64 keys] bf16 P, swizzled
    stats = p + kTcHeads * kTcKeys * 2;        // floats: tmax[2][64], lsum[2][64], alpha[64], m[2][64], l[64]
    live = stats + 8 * kTcHeads * 4;           // [2][64] bytes: the tile's key is live (parity-buffered)
    bytes = live + 2 * kTcKeys;
  }
};

// grid (ceil(H / tc_heads), splits, rows), kTcThreads threads, dynamic smem TcLayout(d, row_bytes).bytes.
// Block (g, s, r): heads tc_heads·g .. + tc_heads − 1 of launch row r over keys [s·keys_per_split,
// (s+1)·keys_per_split).
// NT: P·V n-tiles per warp (d / 64), MT: row tiles of 16 heads (every block holds 16·MT heads); 0 = from the
// parameters, guarded on every tile (NT = 0 serves d ≤ 256: kMaxNt / 2 n-tiles of registers).
template <int NT, int MT>
__global__ void __launch_bounds__(kTcThreads, 1) attn_tc_kernel(const __grid_constant__ AttnKernelParams p) {
  constexpr int kNt = NT > 0 ? NT : kMaxNt / 2;  // register arrays: the most n-tiles this instance serves
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float2 rot_s[kMaxHeadDim / 2];  // the output's derotation (splits == 1)
  const int d = NT > 0 ? 64 * NT : p.head_dim, chunks = d / 8, row_bytes = int(p.row_bytes);
  const TcLayout L(d, p.row_bytes);
  uint8_t* q_s = smem + L.q;
  uint8_t* k_s = smem + L.k;
  uint8_t* raw_s = smem + L.raw;
  uint8_t* p_s = smem + L.p;
  float* tmax_s = reinterpret_cast<float*>(smem + L.stats);  // [2 key halves][64]
  float* lsum_s = tmax_s + 2 * kTcHeads;                     // [2 key halves][64]
  float* alpha_s = lsum_s + 2 * kTcHeads;                    // [64]
  float* m_s = alpha_s + kTcHeads;                           // [2 parities][64] running maximum (integer)
  float* l_s = m_s + 2 * kTcHeads;                           // [64] denominator
  uint8_t* live_s = smem + L.live;                           // [2 parities][64]

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, c = lane % 4;
  const int head0 = blockIdx.x * p.tc_heads, split = blockIdx.y, r = blockIdx.z;
  const AttnSequence& sq = sequence_of(p, r);
  const int64_t i = r - sq.row0, t = sq.pos0 + i;
  const int heads_here = min(p.tc_heads, p.heads - head0);
  const int mtiles = MT > 0 ? MT : (heads_here + 15) / 16;
  const int64_t nw = window_keys(p.window_size, t);
  const int64_t total = nw + compressed_keys(sq.entries != nullptr, sq.selected != nullptr, p.top_k, p.ratio, t);
  const int64_t begin = int64_t(split) * p.keys_per_split;
  const int64_t end = total < begin + p.keys_per_split ? total : begin + p.keys_per_split;
  if (p.splits == 1) derotation_table(p, t, rot_s);
  if (tid < kTcHeads) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
  }
  pdl_wait();

  // The tile at key tile0 into raw_s: 4 threads per key row, each its own 16-byte chunks (no barrier between
  // finding a row and copying it). live_s[par]: the key exists and is not a masked (−1) slot.
  const int my_row = tid / 4, my_sub = tid % 4;  // the key row this thread copies and decodes
  const auto issue = [&](int64_t tile0, int par) {
    const int64_t key = tile0 + my_row;
    const uint8_t* src = key < end ? key_row(p, sq, i, t, nw, key) : nullptr;
    if (my_sub == 0) live_s[par * kTcKeys + my_row] = src != nullptr;
    if (src)
      for (int ch = my_sub; ch < row_bytes / 16; ch += 4)
        cp_async16(raw_s + my_row * row_bytes + 16 * ch, src + 16 * ch);
    cp_async_commit();
  };
  if (begin < end) issue(begin, 0);

  // q as bf16: as it is, or from bf16-valued fp32 exactly; heads past the last of the row tiles are zero rows.
  for (int x = tid; x < 16 * mtiles * chunks; x += kTcThreads) {
    const int h = x / chunks, ch = x % chunks;
    const int64_t at = (i * p.heads + head0 + h) * d + 8 * ch;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (h < heads_here && p.q_bf16) {
      v = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(sq.q) + at);
    } else if (h < heads_here) {
      const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(sq.q) + at);
      const float4 a = src[0], b = src[1];
      v = make_uint4(bf16x2(a.x, a.y), bf16x2(a.z, a.w), bf16x2(b.x, b.y), bf16x2(b.z, b.w));
    }
    *reinterpret_cast<uint4*>(q_s + swz(h, ch, chunks)) = v;
  }

  const int mh = warp % 4, kh = warp / 4;  // QKᵀ roles
  const int nt_count = NT > 0 ? NT : chunks / kTcWarps;  // P·V n-tiles of this warp
  const int cb = warp * nt_count;                          // its first channel chunk
  // Per-thread ldmatrix offsets within a row group of 8 chunks (the swizzle touches the low 3 bits only; every
  // row a lane addresses is ≡ lane mod 8): chunk pair kk of the group, the lane's half by lane / 16 — QKᵀ's A (q)
  // at k-step 4kb + kk, P·V's A (P) at k-step kk, V (NT even) at n-tile pair kk — or, for QKᵀ's B (k), by
  // (lane / 8) % 2.
  const int a_row = 16 * mh + lane % 16, b_row = 32 * kh + lane % 8 + 8 * (lane / 16);
  const int v_row = lane % 8 + 8 * ((lane / 8) % 2);
  int off[4], b_off[4];
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    off[kk] = 16 * ((2 * kk + lane / 16) ^ (lane & 7));
    b_off[kk] = 16 * ((2 * kk + (lane / 8) % 2) ^ (lane & 7));
  }
  float acc[4][kNt][4];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;

  int par = 0;
  for (int64_t tile0 = begin; tile0 < end; tile0 += kTcKeys, par ^= 1) {
    const int tile_keys = end - tile0 < kTcKeys ? int(end - tile0) : kTcKeys;
    cp_async_wait_all();
    __syncthreads();  // raw_s holds this tile (every thread's copies); the previous tile's P·V is done with k_s

    // ---- decode: this thread's key row, chunks my_sub, my_sub + 4, ... (8 channels each); dead rows zero.
    {
      const bool live = live_s[par * kTcKeys + my_row];
      const uint8_t* src = raw_s + my_row * row_bytes;
      uint8_t* dst = k_s + my_row * chunks * 16;
#pragma unroll 4
      for (int ch = my_sub; ch < chunks; ch += 4) {
        uint4 v = make_uint4(0, 0, 0, 0);
        if (live && 8 * ch < p.kv.nope) {
          const uint2 codes = *reinterpret_cast<const uint2*>(src + 8 * ch);
          const float s = e8m0_value(src[p.kv.scales + ch / 8]);
          const float2 a = e4m3x2_to_float2(codes.x), b = e4m3x2_to_float2(codes.x >> 16);
          const float2 e = e4m3x2_to_float2(codes.y), f = e4m3x2_to_float2(codes.y >> 16);
          v = make_uint4(bf16x2(a.x * s, a.y * s), bf16x2(b.x * s, b.y * s), bf16x2(e.x * s, e.y * s),
                         bf16x2(f.x * s, f.y * s));
        } else if (live) {
          const float4* rope = reinterpret_cast<const float4*>(src + p.kv.rope + 4 * (8 * ch - p.kv.nope));
          const float4 a = rope[0], b = rope[1];
          v = make_uint4(bf16x2(a.x, a.y), bf16x2(a.z, a.w), bf16x2(b.x, b.y), bf16x2(b.z, b.w));
        }
        *reinterpret_cast<uint4*>(dst + 16 * (ch ^ (my_row & 7))) = v;
      }
    }
    __syncthreads();  // k_s holds the tile; raw_s is free
    if (tile0 + kTcKeys < end) issue(tile0 + kTcKeys, par ^ 1);

    // ---- S = q · kᵀ for heads 16mh .. +15 × keys 32kh .. +31, then its rows' maxima in base-2 units.
    float s[4][4] = {};
    const bool qk = mh < mtiles;
    if (qk) {
      const uint8_t* a_base = q_s + a_row * chunks * 16;
      const uint8_t* b_base = k_s + b_row * chunks * 16;
#pragma unroll 2
      for (int kb = 0; kb < chunks / 8; ++kb) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          uint32_t a[4], b0[4], b1[4];
          ldmatrix_x4(a, a_base + 128 * kb + off[kk]);
          ldmatrix_x4(b0, b_base + 128 * kb + b_off[kk]);
          ldmatrix_x4(b1, b_base + 16 * chunks * 16 + 128 * kb + b_off[kk]);
          mma_bf16(s[0], a[0], a[1], a[2], a[3], b0[0], b0[1]);
          mma_bf16(s[1], a[0], a[1], a[2], a[3], b0[2], b0[3]);
          mma_bf16(s[2], a[0], a[1], a[2], a[3], b1[0], b1[1]);
          mma_bf16(s[3], a[0], a[1], a[2], a[3], b1[2], b1[3]);
        }
      }
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = 32 * kh + 8 * nt + 2 * c + e % 2;
          s[nt][e] = key < tile_keys && live_s[par * kTcKeys + key] ? softmax_unit(true, s[nt][e] * p.scale) : -INFINITY;
          mx[e / 2] = fmaxf(mx[e / 2], s[nt][e]);
        }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        if (c == 0) tmax_s[kh * kTcHeads + 16 * mh + g + 8 * h] = mx[h];
      }
    }
    __syncthreads();  // both key halves' maxima

    // ---- P = bf16(2^(u − M)) against the new integer maximum M; the fp32 sums; α = 2^(M_old − M), exact.
    if (qk) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int head = 16 * mh + g + 8 * h;
        const float m_old = m_s[par * kTcHeads + head];
        const float m_new = fmaxf(m_old, ceilf(fmaxf(tmax_s[head], tmax_s[kTcHeads + head])));
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const float e0 = m_new == -INFINITY ? 0.0f : exp2f(s[nt][2 * h] - m_new);
          const float e1 = m_new == -INFINITY ? 0.0f : exp2f(s[nt][2 * h + 1] - m_new);
          sum += e0 + e1;
          *reinterpret_cast<uint32_t*>(p_s + swz(head, 4 * kh + nt, kTcKeys / 8) + 4 * c) = bf16x2(e0, e1);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (c == 0) {
          lsum_s[kh * kTcHeads + head] = sum;
          if (kh == 0) {
            alpha_s[head] = m_new == -INFINITY ? 1.0f : exp2f(m_old - m_new);
            m_s[(par ^ 1) * kTcHeads + head] = m_new;
          }
        }
      }
    }
    __syncthreads();  // P, α and the partial sums of every head
    if (tid < 16 * mtiles) l_s[tid] = l_s[tid] * alpha_s[tid] + lsum_s[tid] + lsum_s[kTcHeads + tid];

    // ---- acc = α · acc + P · V over this warp's channels (α is 1 once the maxima settle: skipped then).
    {
      bool rescale = false;
      for (int mt = 0; mt < mtiles; ++mt) rescale |= alpha_s[16 * mt + g] != 1.0f || alpha_s[16 * mt + g + 8] != 1.0f;
      if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
          if (mt >= mtiles) break;
          const float a0 = alpha_s[16 * mt + g], a1 = alpha_s[16 * mt + g + 8];
#pragma unroll
          for (int nt = 0; nt < kNt; ++nt) {
            acc[mt][nt][0] *= a0;
            acc[mt][nt][1] *= a0;
            acc[mt][nt][2] *= a1;
            acc[mt][nt][3] *= a1;
          }
        }
      }
    }
#pragma unroll
    for (int ks = 0; ks < kTcKeys / 16; ++ks) {
      if (16 * ks >= tile_keys) break;
      uint32_t a[4][4];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
        if (mt < mtiles) ldmatrix_x4(a[mt], p_s + (16 * mt + lane % 16) * kTcKeys * 2 + off[ks]);
      const uint8_t* v_base = k_s + (16 * ks + v_row) * chunks * 16;
#pragma unroll
      for (int nt = 0; nt < kNt; nt += 2) {
        if (nt >= nt_count) break;
        uint32_t b[4];
        if (NT == kMaxNt) {  // cb = 8·warp: a whole row group of 8 chunks per warp
          ldmatrix_x4_trans(b, v_base + 128 * warp + off[nt / 2]);
        } else if (nt + 1 < nt_count) {
          ldmatrix_x4_trans(b, v_base + 16 * ((cb + nt + lane / 16) ^ (lane & 7)));
        } else {
          ldmatrix_x2_trans(b[0], b[1], v_base + 16 * ((cb + nt) ^ (lane & 7)));
          b[2] = b[3] = 0;
        }
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
          if (mt >= mtiles) break;
          mma_bf16(acc[mt][nt], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[0], b[1]);
          if (nt + 1 < nt_count) mma_bf16(acc[mt][nt + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[2], b[3]);
        }
      }
    }
  }
  __syncthreads();  // m_s, l_s final (also for blocks without keys)

#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
    if (mt >= mtiles) break;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int head = 16 * mt + g + 8 * h;
      if (head >= heads_here) continue;
      const float m = m_s[par * kTcHeads + head], l = l_s[head];
      if (p.splits == 1) {
        const float factor = fast_output_factor(p, head0 + head, m, l);
        const int64_t out = (i * p.heads + head0 + head) * d;
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) {
          if (nt >= nt_count) break;
          store_fast_pair(p, sq, rot_s, out, 8 * (cb + nt) + 2 * c, acc[mt][nt][2 * h] * factor,
                          acc[mt][nt][2 * h + 1] * factor);
        }
      } else {
        const int64_t part = (int64_t(r) * p.splits + split) * p.heads + head0 + head;  // [rows, splits, H]
        float* o = reinterpret_cast<float*>(p.part_o) + part * d;
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) {
          if (nt >= nt_count) break;
          const int ch = 8 * (cb + nt) + 2 * c;
          *reinterpret_cast<float2*>(o + ch) = make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
        }
        if (warp == 0 && c == 0) p.part_ml[part] = make_float2(m, l);
      }
    }
  }
}

}  // namespace

bool tc_fits(const CacheLayout& l, int64_t head_dim, size_t smem_limit) {
  return l.format == CacheFormat::kFp8Kv && l.dim == head_dim && head_dim % 64 == 0 &&
         (head_dim <= 32 * kMaxNt || head_dim == 64 * kMaxNt) &&
         l.nope % 8 == 0 && l.row_bytes % 16 == 0 &&
         size_t(TcLayout(int(head_dim), l.row_bytes).bytes) + sizeof(float2) * kMaxHeadDim / 2 <= smem_limit;
}

void launch_tc(const AttnKernelParams& k, dim3 grid, cudaStream_t stream, bool pdl) {
  const int smem = TcLayout(k.head_dim, k.row_bytes).bytes;
  // d = 512 (V4) with every block 64 heads, or any head count; d ≤ 256 through the general instance.
  const auto kernel = k.head_dim != 64 * kMaxNt                             ? attn_tc_kernel<0, 0>
                      : k.tc_heads == kTcHeads && k.heads % kTcHeads == 0 ? attn_tc_kernel<kMaxNt, 4>
                                                                            : attn_tc_kernel<kMaxNt, 0>;
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  launch_pdl(kernel, grid, dim3(kTcThreads), size_t(smem), stream, pdl, k);
}

}  // namespace dsv4::cuda::attn
