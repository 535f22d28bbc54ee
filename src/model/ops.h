// The backend seam: every operation the DeepSeek-V4 forward pass needs, at the granularity of the
// architecture's components. The forward pass (deepseek_v4.cpp) only talks to this interface; the CPU
// reference (src/cpu) and the CUDA backend (src/cuda) implement it.
//
// All float pointers are backend memory obtained from alloc(); activations are fp32 row-major (bf16-valued in fast
// numerics), and where an FP8 GEMM consumes them, also act_quant'ed (E4m3Rows); the query heads (wq_b → query_kv_finish
// → attention) and the attention's output (→ wo_a) travel as bf16 rows (Bf16Rows) where the backend says that pays.
// Shape letters: n = tokens in the step, D = hidden, hc = residual streams, H = heads, d = head_dim.
//
// A batched step concatenates several sequences' rows. Matrix ops run once over all rows; the per-sequence ops
// (query_kv_finish, compressor, indexer_topk, attention: each sequence has its own positions and caches) take a
// batch, one params struct per sequence, which a backend may run as one launch. Within one call the entries
// differ only in their rows, positions and caches: every other field is the same.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "model/weights.h"
#include "sampler/sampler.h"

namespace dsv4 {

enum class Numerics : uint8_t {
  kReference,  // the official FP8 / FP4 simulation points (spec §3.4), what real checkpoints were trained for
  kExact,      // no simulation: what transformers computes
  kFast,       // what DeepSeek's GPU code rounds (docs/design/fast-numerics.md §7): bf16 between ops, e4m3
               // act_quant per 128 columns before FP8 / FP4 GEMMs; both backends round at every point. The CUDA
               // default (engine/backend.h); judged by KL divergence on trained models, not by the fixtures
};

enum class RopeKind : uint8_t { kPlain, kCompressed };  // θ = rope_theta | compress_rope_theta + YaRN

// Per-compressor streaming state (spec §7.5) plus the entries it has emitted.
struct CompressorState {
  float* kv = nullptr;       // [coff·m, coff·c]
  float* score = nullptr;    // [coff·m, coff·c], gate logits including ape; −inf when empty
  float* entries = nullptr;  // [max_entries, c], entry w at row w; a cache (alloc_cache), compact or fp32
  int64_t max_entries = 0;
};

// How a per-sequence cache (sliding-window ring, compressed entries, indexer keys) stores its rows. The model
// asks for a compact format only where its numerics make it lossless: in reference (and fast) numerics every
// stored value is already on the FP8 / FP4 grid (spec §3.4, §11). A backend may keep any format as fp32 (the
// CPU does); a compact cache is opaque memory that only ring_store, compressor, attention and indexer_topk
// read or write, always through the pointer alloc_cache returned.
enum class CacheFormat : uint8_t {
  kF32,
  kFp8Kv,    // [rows, dim]: channels [0, dim − rope_dim) e4m3 with an E8M0 scale per 64, rope channels fp32
  kFp4Keys,  // [rows, dim] indexer keys: e2m1 with an E8M0 scale per 32
};

// Rows act_quant'ed for an FP8 GEMM (fast numerics, docs/design/fast-numerics.md §1.4): per row and 128 columns
// an e4m3 code per value and one power-of-two scale, value = code · scale exactly — what DeepSeek's act_quant hands
// its FP8 GEMMs. The typed seam's first activation dtype (§9): a producer that owns whole 128-column blocks of
// its rows writes them beside its bf16-valued fp32 output (rms_norm, hc_pre_norm, asked by a non-null pointer),
// and a linear layer that act_quants its input (FP8 / FP4 weights, fast numerics) reads them instead of
// quantising x itself; every other consumer reads x. Backend memory from Ops::alloc_e4m3.
struct E4m3Rows {
  uint8_t* codes = nullptr;  // [rows, cols]
  float* scales = nullptr;   // [cols / 128, scale_ld]: row r's block b at b·scale_ld + r (the tensor-core GEMM
                             // copies one block's scales of consecutive rows as one piece)
  int64_t rows = 0;          // capacity
  int64_t cols = 0;          // a multiple of 128
  int64_t scale_ld = 0;      // rows rounded up to 4 (16-byte scale rows)
};

// Rows of bf16 values (fast numerics: DeepSeek's dtype between ops), as uint16 bit patterns: the typed seam's
// second activation dtype (docs/design/fast-numerics.md §9). A producer asked for them writes them instead of its
// fp32 output, and the consumer reads them instead of fp32 x — the query heads from wq_b through query_kv_finish
// into the attention, and the attention's output into wo_a: at prefill their fp32 round trips through memory cost
// more than the ops' own work. Backend memory from Ops::alloc_bf16.
struct Bf16Rows {
  uint16_t* data = nullptr;  // [rows, cols]
  int64_t rows = 0;          // capacity
  int64_t cols = 0;
};

// What a compressor does to an entry after pooling, norm and RoPE.
enum class EntrySim : uint8_t { kNone, kFp8NoPe, kHadamardFp4 };

// One sequence's attention: its n query rows over its window ring and compressed entries.
struct AttentionParams {
  const float* q = nullptr;        // [n, H, d], RoPE applied
  const uint16_t* q_bf16 = nullptr;  // fast numerics, where set: q as bf16 instead (then q is null)
  const float* window = nullptr;   // ring [ring_slots, d], position p at slot p % ring_slots (a cache)
  int64_t ring_slots = 0;
  int64_t window_size = 0;         // keys max(0, t − window_size + 1) .. t
  const float* entries = nullptr;  // [*, d] compressed entries, a cache (nullptr on sliding layers)
  // [n, top_k] entry ids, −1 = unused (CSA); nullptr = all visible (HCA). Row t uses only its first
  // min(top_k, (t + 1) / ratio) slots: no more entries exist for it, and indexer_topk writes them first.
  const int32_t* selected = nullptr;
  int64_t top_k = 0;
  int64_t ratio = 0;               // entries visible to query t: w < (t + 1) / ratio
  const float* sinks = nullptr;    // [H]
  int64_t pos0 = 0, n = 0, heads = 0, head_dim = 0;
  float scale = 0.0f;
  float* out = nullptr;            // [n, H, d]
  uint16_t* out_bf16 = nullptr;    // fast numerics, where set: the output as bf16 here instead of out (then null)
  // K = V carries RoPE, so the output's last rope_dim channels are rotated back by the query position's
  // angle (spec §6.5) when set; part of the op so a backend can do it before the output leaves registers.
  bool derotate = false;
  RopeKind rope = RopeKind::kPlain;
};

// One sequence's lightning indexer: its n query rows scored against its indexer keys.
struct IndexerParams {
  const float* q = nullptr;        // [n, n_I, d_I]
  const float* weights = nullptr;  // [n, n_I], already scaled
  const float* keys = nullptr;     // [*, d_I], a cache
  int64_t pos0 = 0, n = 0, heads = 0, head_dim = 0, ratio = 4, top_k = 0;
  int32_t* selected = nullptr;     // [n, top_k], −1 padded
};

// One sequence's query heads q [n, heads, dim] and its K = V rows kv [n, dim] (Ops::query_kv_finish).
struct QueryKvParams {
  float* q = nullptr;
  int64_t heads = 0;
  float* kv = nullptr;
  const std::vector<float>* kv_gamma = nullptr;  // [dim]
  int64_t n = 0, dim = 0, nope = 0, pos0 = 0;
  RopeKind rope = RopeKind::kPlain;
  bool simulate = false;  // the FP8 simulation of channels [0, nope) (reference and fast numerics)
  int64_t slots = 0;      // the ring's slots
  float* ring = nullptr;  // the sliding-window KV ring, a cache
  uint16_t* q_bf16 = nullptr;  // fast numerics, where set: the query heads as bf16, read and written so (q null)
};

// One sequence's rows of an Ops::rope_spans call: rows x .. x + rows·row_stride, row r at position
// pos0 + r / rows_per_pos.
struct RopeSpan {
  float* x = nullptr;
  int64_t rows = 0, pos0 = 0;
};

// One sequence's chunk of n tokens at positions pos0 .. pos0+n−1 through one of its compressors (Ops::compressor).
struct CompressorParams {
  const CompressorWeights* weights = nullptr;
  CompressorState* state = nullptr;
  const float* x = nullptr;  // [n, D] the normed attention input
  int64_t pos0 = 0, n = 0;
  EntrySim sim = EntrySim::kNone;
};

class Ops {
 public:
  virtual ~Ops() = default;

  // ---- memory (planned at load; nothing here is called in the decode loop)
  virtual float* alloc(size_t count) = 0;          // fp32 buffer, lives as long as the backend
  virtual int32_t* alloc_i32(size_t count) = 0;
  virtual float* alloc_cache(CacheFormat, int64_t rows, int64_t dim) { return alloc(size_t(rows * dim)); }
  // Room for `rows` act_quant'ed rows of `cols` columns (a multiple of 128), in alloc() memory.
  E4m3Rows alloc_e4m3(int64_t rows, int64_t cols) {
    E4m3Rows q;
    q.rows = rows;
    q.cols = cols;
    q.scale_ld = (rows + 3) / 4 * 4;
    q.codes = reinterpret_cast<uint8_t*>(alloc(size_t((rows * cols + 3) / 4)));
    q.scales = alloc(size_t(cols / 128 * q.scale_ld));
    return q;
  }
  // Room for `rows` bf16 rows of `cols` columns, in alloc() memory.
  Bf16Rows alloc_bf16(int64_t rows, int64_t cols) {
    return {reinterpret_cast<uint16_t*>(alloc(size_t((rows * cols + 1) / 2))), rows, cols};
  }
  virtual void fill(float* x, size_t count, float value) = 0;
  virtual void upload_i32(int32_t* dst, const int32_t* host, size_t count) = 0;
  virtual void download(float* host, const float* src, size_t count) = 0;
  virtual void download_i32(int32_t* host, const int32_t* src, size_t count) = 0;
  virtual void copy(const float* src, size_t count, float* dst) = 0;  // backend memory to backend memory
  // dst[r, ld_dst] = src[r, cols] for r < rows: rows into a wider array (backend memory both).
  virtual void copy_rows(const float* src, int64_t rows, int64_t cols, float* dst, int64_t ld_dst) {
    for (int64_t r = 0; r < rows; ++r) copy(src + r * cols, size_t(cols), dst + r * ld_dst);
  }
  // Rows [0, rows) of one cache into another of the same format and row size.
  virtual void copy_cache(const float* src, int64_t rows, int64_t dim, float* dst) {
    copy(src, size_t(rows * dim), dst);
  }

  // The model's numerics mode, told once at construction. A backend may pick kernels by it: the CUDA backend
  // keeps GEMMs in fp32 for exact and reference numerics, and uses its tensor-core path only under kFast.
  virtual void set_numerics(Numerics) {}

  // ---- ranks (model/parallel.h). A backend runs one rank's shard; the forward pass calls every op of a rank
  // from one thread, which it tells the backend once (a CUDA backend makes its device current there).
  virtual void bind_thread() {}
  // Sums x [count] over the ranks of this backend's group, in place, in the same order on every rank (so
  // every rank gets the same bits and replicated computations stay identical). Alone in its group: nothing.
  // A backend may instead fold the sum into the hc_post that reads x next (CudaOps): x itself then keeps this
  // rank's share, so rows passed to hc_post must not be read again.
  virtual void all_reduce(float* x, size_t count) { (void)x, (void)count; }
  // This rank failed mid-step: the group's collectives, on every rank, now fail instead of waiting for it.
  virtual void abort_group() {}

  // ---- elementwise / small
  virtual void embed(const Weight& table, const int32_t* tokens, int64_t n, float* out) = 0;  // out [n, D]
  virtual void broadcast_streams(const float* x, int64_t n, int64_t hc, int64_t dim, float* X) = 0;  // X [n, hc, D]
  virtual void add(const float* a, const float* b, size_t count, float* out) = 0;
  virtual void scale(float* x, size_t count, float factor) = 0;
  // tokens[r] = the greedy token of logits row r (rows of `vocab` floats): the lowest id among the row's maxima,
  // as argmax() in sampler.h; values[r] = that maximum unless values is nullptr (ranks that share the
  // vocabulary compare theirs). tokens and values are backend memory.
  virtual void greedy_tokens(const float* logits, int64_t rows, int64_t vocab, int32_t* tokens, float* values) = 0;
  // tokens[r] = sample_row(logits row r, vocab, draws[r]) (sampler.h): the same token on every backend, with only
  // the ids crossing to the host. logits [rows = draws.size(), vocab] and tokens: backend memory; the draws and
  // what they point to (masks, edits): host. The logits are not modified.
  virtual void sample_tokens(const float* logits, int64_t vocab, std::span<const RowDraw> draws, int32_t* tokens) = 0;
  // out[i] = token_logprobs(logits row rows[i], vocab, tokens[rows[i]], top) (sampler.h): the raw
  // log-probability of the chosen token and the `top` most likely, computed where the logits are so that only
  // those cross to the host. logits, tokens: backend memory; rows, out: host.
  virtual void token_logprobs(const float* logits, int64_t vocab, std::span<const int64_t> rows, const int32_t* tokens,
                              int64_t top, std::span<TokenLogprobs> out) = 0;

  // Writes rows x[i] to ring[(pos0 + i) % slots] (the sliding-window KV ring, a cache).
  virtual void ring_store(const float* x, int64_t n, int64_t cols, int64_t pos0, int64_t slots, float* ring) = 0;

  // ---- gemm: y[r, ldy] = x[r, ldx] · Wᵀ for r < n (W is [out, in] in checkpoint storage). xq, where given, holds
  // x's rows act_quant'ed (rows ≥ n, cols = W's): a product that act_quants x reads them instead. yb, where given,
  // takes y as bf16 rows instead (fast numerics, whose products round y to bf16; rows ≥ n, cols = W's rows = ldy;
  // y is null).
  virtual void linear(const float* x, int64_t ldx, const Weight& w, int64_t n, float* y, int64_t ldy,
                      const E4m3Rows* xq = nullptr, Bf16Rows* yb = nullptr) = 0;
  // A rank's share of a row-parallel product (wo_b when the ranks split the heads): y = x · Wᵀ as linear computes
  // it but never rounded, in every numerics. The ranks' shares are summed by all_reduce and the sum is rounded
  // where one rank's product would be (fast numerics: hc_post rounds its input), so several ranks round once, as
  // one does — not each share before the sum.
  virtual void linear_partial(const float* x, int64_t ldx, const Weight& w, int64_t n, float* y, int64_t ldy) = 0;
  // The LM head: logits [n, V] = x [n, D] · headᵀ. Its own entry because fast numerics keep it fp32 (the widened
  // bf16 weight, fp32 logits) where other bf16 projections round their output.
  virtual void lm_head(const float* x, const Weight& head, int64_t n, float* logits) {
    linear(x, head.cols, head, n, logits, head.rows);
  }
  // Two projections of the same rows: ya = x · Waᵀ, yb = x · Wbᵀ — one call, which a backend may run as one
  // pass (the attention's wq_a and wkv of xn; a compressor's wkv and wgate).
  virtual void linear_pair(const float* x, int64_t ldx, int64_t n, const Weight& wa, float* ya, int64_t ldya,
                           const Weight& wb, float* yb, int64_t ldyb, const E4m3Rows* xq = nullptr) {
    linear(x, ldx, wa, n, ya, ldya, xq);
    linear(x, ldx, wb, n, yb, ldyb, xq);
  }
  // Grouped projection: W is [G·out_g, in_g]; y[:, g·out_g ..] = x[:, g·in_g ..] · W_gᵀ. x [n, G·in_g]; or xb,
  // where given, holds x as bf16 (rows ≥ n, cols = G·in_g; fast numerics) and x is null. bf16_rows_pay(n): whether
  // a step of n rows should hand the query heads and the attention's output on as bf16 rather than fp32 (where this
  // backend's kernels read and write bf16 rows as they are; elsewhere they cost a widening or narrowing pass).
  virtual void linear_grouped(const float* x, const Weight& w, int64_t groups, int64_t n, float* y,
                              const Bf16Rows* xb = nullptr) = 0;
  virtual bool bf16_rows_pay(int64_t n) const {
    (void)n;
    return true;
  }

  // ---- norm_rope
  // yq, where given: y's rows act_quant'ed as well (fast numerics; dim a multiple of 128).
  virtual void rms_norm(const float* x, const std::vector<float>* gamma, int64_t rows, int64_t dim, float* y,
                        E4m3Rows* yq = nullptr) = 0;
  // Rotates channels [offset, offset + rope_dim) of each row; the position of row r is
  // pos0 + (r / rows_per_pos) · pos_stride. inverse = rotate by −angle.
  virtual void rope(float* x, int64_t rows, int64_t row_stride, int64_t offset, int64_t rows_per_pos,
                    int64_t pos0, int64_t pos_stride, RopeKind kind, bool inverse) = 0;

  // rope of each sequence's rows (the step's indexer queries): every span as rope(span.x, span.rows, row_stride,
  // offset, rows_per_pos, span.pos0, 1, kind, false), which a backend may run as one launch.
  virtual void rope_spans(std::span<const RopeSpan> spans, int64_t row_stride, int64_t offset, int64_t rows_per_pos,
                          RopeKind kind) {
    for (const RopeSpan& s : spans)
      rope(s.x, s.rows, row_stride, offset, rows_per_pos, s.pos0, 1, kind, /*inverse=*/false);
  }

  // RMSNorm of each row in place (gain gamma or none), then RoPE on channels [offset, dim) with row r at
  // position pos0 + r / rows_per_pos: rms_norm and rope in one call, which a backend may fuse.
  virtual void norm_rope(float* x, const std::vector<float>* gamma, int64_t rows, int64_t dim, int64_t offset,
                         int64_t rows_per_pos, int64_t pos0, RopeKind kind) {
    rms_norm(x, gamma, rows, dim, x);
    rope(x, rows, dim, offset, rows_per_pos, pos0, 1, kind, /*inverse=*/false);
  }

  // The K = V rows of one sequence (spec §6.2), tokens pos0 .. pos0+n−1: RMSNorm with gain gamma, RoPE on
  // channels [nope, dim), the FP8 simulation of channels [0, nope) in blocks of 64 when `simulate`, then
  // into the window ring at (pos0 + i) % slots. kv is scratch afterwards (a backend whose compact ring
  // rounds on store may leave it unsimulated).
  virtual void kv_finish(float* kv, const std::vector<float>& gamma, int64_t n, int64_t dim, int64_t nope,
                         int64_t pos0, RopeKind kind, bool simulate, int64_t slots, float* ring) {
    norm_rope(kv, &gamma, n, dim, nope, 1, pos0, kind);
    if (simulate) sim_fp8(kv, n, dim, nope, 64);
    ring_store(kv, n, dim, pos0, slots, ring);
  }
  // Each sequence's query heads normed (no gain) and rotated (norm_rope, heads rows per position), and its K = V
  // rows kv_finish'ed: the two in one call, which a backend may fuse (neither reads the other). This default
  // composition takes fp32 query heads; a backend that plans bf16 ones (QueryKvParams::q_bf16) overrides it.
  virtual void query_kv_finish(std::span<const QueryKvParams> batch) {
    for (const QueryKvParams& p : batch) {
      norm_rope(p.q, nullptr, p.n * p.heads, p.dim, p.nope, p.heads, p.pos0, p.rope);
      kv_finish(p.kv, *p.kv_gamma, p.n, p.dim, p.nope, p.pos0, p.rope, p.simulate, p.slots, p.ring);
    }
  }

  // ---- quant (simulation points of the official numerics, in place)
  virtual void sim_fp8(float* x, int64_t rows, int64_t row_stride, int64_t cols, int64_t block) = 0;
  virtual void hadamard_sim_fp4(float* x, int64_t rows, int64_t dim) = 0;

  // ---- hc (mHC, spec §5): X [n, hc, D] residual streams, post [n, hc], comb [n, hc, hc] (C[j][k]: source
  // stream j, destination stream k)
  // Pre-mix: the mixing coefficients of X (post and comb for this sub-block's own post-mix) and the collapse
  // x [n, D] = Σ_j pre[j]·X[j].
  virtual void hc_pre(const float* X, const HcWeights& w, int64_t n, float* x, float* post, float* comb) = 0;
  // Post-mix of a sub-block's output f [n, D] into the streams, in place: X[k] ← post[k]·f + Σ_j C[j][k]·X[j].
  // NOTE: a backend may defer it, to run it fused with the hc_pre_norm or hc_head that follows on the same X (the
  // CUDA backend fuses it into hc_pre_norm at decode). Everything else that follows — any other op, a
  // download — sees X as if it had run at once: a deferring backend runs it first. The next hc_pre_norm may
  // write its post and comb over this call's (the model reuses the buffers): a fused backend reads them first.
  virtual void hc_post(const float* f, const float* post, const float* comb, int64_t n, float* X) = 0;
  // The final collapse before the output norm (§5.4): y [n, D] = Σ_j pre[j]·X[j], pre from the head's weights.
  virtual void hc_head(const float* X, const HcHeadWeights& w, int64_t n, float* y) = 0;
  // hc_pre, then xn = RMSNorm(x) with gain gamma over the dim channels of each row: the two in one call,
  // which a backend may fuse (every sub-block starts so). xnq, where given: xn act_quant'ed as well.
  virtual void hc_pre_norm(const float* X, const HcWeights& w, const std::vector<float>& gamma, int64_t n,
                           int64_t dim, float* x, float* xn, float* post, float* comb, E4m3Rows* xnq = nullptr) {
    hc_pre(X, w, n, x, post, comb);
    rms_norm(x, &gamma, n, dim, xn, xnq);
  }

  // ---- attention family
  // Feeds each sequence's tokens pos0 .. pos0+n−1 (normed attention input x [n, D]) through its compressor,
  // emitting every entry whose window completes; emitted entries are RMS-normed, RoPE'd at w·m and simulated per
  // `sim`. All entries share the weights and sim.
  virtual void compressor(std::span<const CompressorParams> batch) = 0;
  virtual void indexer_topk(std::span<const IndexerParams> batch) = 0;
  virtual void attention(std::span<const AttentionParams> batch) = 0;

  // ---- moe: out [n, D] = Σ routed experts + shared expert
  virtual void moe(const MoeWeights& w, const float* x, const int32_t* tokens, int64_t n, float* out) = 0;
  // A rank's share of the MoE (its experts, or its slice of every expert's width): moe without the final rounding
  // of the combined sum, which the ranks' sum takes instead (linear_partial says why). Each expert's output is
  // rounded as in moe: with the width split, a rank's share of an expert is rounded before the sum.
  virtual void moe_partial(const MoeWeights& w, const float* x, const int32_t* tokens, int64_t n, float* out) = 0;
};

}  // namespace dsv4
