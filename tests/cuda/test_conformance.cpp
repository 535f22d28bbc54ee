// The CUDA backend op by op on a real forward pass. TeeOps runs every op the model issues on both backends
// from identical inputs: after each op the CUDA copies of its outputs are compared with the CPU's and then
// overwritten by them, so an error cannot propagate and each op is judged on its own. This is the test that
// localises an end-to-end mismatch (the golden tests only see logits): the table of worst errors per op is
// printed on every run, and a failure names the op and its call number.
//
// Model: tests/data/reference/ref-small (every layer type, MTP, hash routing), its fixture prompt as
// prefill chunks of 13 then single-token decodes, in reference, exact and fast numerics.
//
// Tolerances (error = max |cuda − cpu| over the op's outputs / max |cpu|): ops that only move or round values
// are bit-exact (0): embed, copies, ring_store, add, scale, the FP8 / FP4 simulations. Reductions in fp32 with a
// different summation order (GEMMs up to K = 512 here, hc, MoE, attention, norms, the compressor's pooling
// with expf): 1e-4. The indexer's choices must be the same sets (16 indexer heads make exact ties rare).
//
// Fast numerics round to bf16 between ops (docs/design/fast-numerics.md §7), so a last-bit difference of an fp32
// sum flips a bf16 rounding now and then: one bf16 step is at most 2^-7 of the value. Tolerances count the
// rounding points in the op's chain (bf16 steps): 2^-7 for one (GEMMs, norms, RoPE), 2^-6 for mHC (collapse,
// then norm) and attention (P and the output), 2^-5 for the MoE (w1/w3, hidden row, w2, combine). Where a
// flipped bf16 value feeds an FP8 / FP4 rounding (the K = V ring, compressed entries), one e4m3 step is 2^-3
// of the value and one e2m1 step up to 1/3 of its block's maximum: 2^-3 and 0.5. So that these loose bounds
// cannot hide a wrong function, fast numerics also bound the share of values off by a bf16 step or more at 2%
// (attention excepted, see there): flips are rare (an fp32 difference of a few ulps against bf16's 2^16 times
// coarser grid), errors are not.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <nlohmann/json.hpp>
#include <string>

#include "core/dtype.h"
#include "cuda/gpu.h"
#include "engine/backend.h"
#include "harness/files.h"
#include "loader/weight_map.h"
#include "model/deepseek_v4.h"

namespace dsv4::test {
namespace {

#if DSV4_HAVE_CUDA

class TeeOps final : public Ops {
 public:
  TeeOps(const ModelConfig& config, CudaOps& gpu) : cpu_(config), gpu_(gpu), config_(config) {}

  struct OpStats {
    int64_t calls = 0;
    double worst = 0.0;
    int64_t worst_call = -1;
    int64_t failed = 0;
    int64_t first_failed_call = -1;
    int64_t values = 0, flipped = 0;  // values compared; values off by a bf16 step or more
  };
  const std::map<std::string, OpStats>& stats() const { return stats_; }
  void print() const {
    std::printf("%-18s %7s %12s %10s %9s %8s %s\n", "op", "calls", "worst err", "at call", "flipped", "failed",
                "first failing call");
    for (const auto& [name, s] : stats_)
      std::printf("%-18s %7lld %12.3g %10lld %8.3f%% %8lld %lld\n", name.c_str(), (long long)s.calls, s.worst,
                  (long long)s.worst_call, s.values ? 100.0 * double(s.flipped) / double(s.values) : 0.0,
                  (long long)s.failed, (long long)s.first_failed_call);
  }

  void set_numerics(Numerics n) override {
    cpu_.set_numerics(n);
    gpu_.set_numerics(n);
    fast_ = n == Numerics::kFast;
  }

  float* alloc(size_t count) override {
    float* c = cpu_.alloc(count);
    regions_[c] = {c, gpu_.alloc(count), count * sizeof(float)};
    return c;
  }
  int32_t* alloc_i32(size_t count) override {
    int32_t* c = cpu_.alloc_i32(count);
    regions_[c] = {c, gpu_.alloc_i32(count), count * sizeof(int32_t)};
    return c;
  }
  // The CPU keeps every cache in fp32; the CUDA twin is compact where the model asks for it and is compared and
  // resynchronised through its fp32 view (read_cache / write_cache).
  float* alloc_cache(CacheFormat format, int64_t rows, int64_t dim) override {
    float* c = cpu_.alloc_cache(format, rows, dim);
    regions_[c] = {c, gpu_.alloc_cache(format, rows, dim), size_t(rows * dim) * sizeof(float), dim};
    return c;
  }
  void fill(float* x, size_t count, float value) override {
    cpu_.fill(x, count, value);
    gpu_.fill(g(x), count, value);
    check("fill", 0.0, {{x, count}});
  }
  void upload_i32(int32_t* dst, const int32_t* host, size_t count) override {
    cpu_.upload_i32(dst, host, count);
    gpu_.upload_i32(g(dst), host, count);
  }
  void download_i32(int32_t* host, const int32_t* src, size_t count) override { cpu_.download_i32(host, src, count); }
  // The logits twins are equal here (every check leaves the CUDA copy equal to the CPU's): the ids must be too.
  void greedy_tokens(const float* logits, int64_t rows, int64_t vocab, int32_t* tokens, float* values) override {
    EXPECT_EQ(values, nullptr);  // one rank: the forward pass never asks for them
    cpu_.greedy_tokens(logits, rows, vocab, tokens, nullptr);
    gpu_.greedy_tokens(g(logits), rows, vocab, g(tokens), nullptr);
    OpStats& s = stats_["greedy_tokens"];
    const int64_t call = s.calls++;
    const std::vector<int32_t> got = to_host(gpu_, g(tokens), size_t(rows));
    int64_t differing = 0;
    for (int64_t r = 0; r < rows; ++r) differing += got[size_t(r)] != tokens[r];
    record(s, call, double(differing), differing > 0);
  }
  void sample_tokens(const float* logits, int64_t vocab, std::span<const RowDraw> draws, int32_t* tokens) override {
    cpu_.sample_tokens(logits, vocab, draws, tokens);
    gpu_.sample_tokens(g(logits), vocab, draws, g(tokens));
    OpStats& s = stats_["sample_tokens"];
    const int64_t call = s.calls++;
    const std::vector<int32_t> got = to_host(gpu_, g(tokens), draws.size());
    int64_t differing = 0;
    for (size_t r = 0; r < draws.size(); ++r) differing += got[r] != tokens[r];
    record(s, call, double(differing), differing > 0);
  }
  void token_logprobs(const float* logits, int64_t vocab, std::span<const int64_t> rows, const int32_t* tokens,
                      int64_t top, std::span<TokenLogprobs> out) override {
    cpu_.token_logprobs(logits, vocab, rows, tokens, top, out);
  }
  void download(float* host, const float* src, size_t count) override {
    cpu_.download(host, src, count);
    check("download", 1e-4, {{src, count}});
  }
  void copy_cache(const float* src, int64_t rows, int64_t dim, float* dst) override {
    cpu_.copy_cache(src, rows, dim, dst);
    gpu_.copy_cache(g(src), rows, dim, g(dst));
    check("copy_cache", 0.0, {{dst, size_t(rows * dim)}});
  }
  void copy(const float* src, size_t count, float* dst) override {
    cpu_.copy(src, count, dst);
    gpu_.copy(g(src), count, g(dst));
    check("copy", 0.0, {{dst, count}});
  }

  void embed(const Weight& table, const int32_t* tokens, int64_t n, float* out) override {
    cpu_.embed(table, tokens, n, out);
    gpu_.embed(table, g(tokens), n, g(out));
    check("embed", 0.0, {{out, size_t(n * config_.dim)}});
  }
  void broadcast_streams(const float* x, int64_t n, int64_t hc, int64_t dim, float* X) override {
    cpu_.broadcast_streams(x, n, hc, dim, X);
    gpu_.broadcast_streams(g(x), n, hc, dim, g(X));
    check("broadcast_streams", 0.0, {{X, size_t(n * hc * dim)}});
  }
  void add(const float* a, const float* b, size_t count, float* out) override {
    cpu_.add(a, b, count, out);
    gpu_.add(g(a), g(b), count, g(out));
    check("add", 0.0, {{out, count}});
  }
  void scale(float* x, size_t count, float factor) override {
    cpu_.scale(x, count, factor);
    gpu_.scale(g(x), count, factor);
    check("scale", 0.0, {{x, count}});
  }
  void ring_store(const float* x, int64_t n, int64_t cols, int64_t pos0, int64_t slots, float* ring) override {
    cpu_.ring_store(x, n, cols, pos0, slots, ring);
    gpu_.ring_store(g(x), n, cols, pos0, slots, g(ring));
    check("ring_store", 0.0, {{ring, size_t(slots * cols)}});
  }

  void linear(const float* x, int64_t ldx, const Weight& w, int64_t n, float* y, int64_t ldy, const E4m3Rows* xq,
              Bf16Rows* yb) override {
    cpu_.linear(x, ldx, w, n, y, ldy, xq, yb);
    const E4m3Rows gq = twin(xq);
    Bf16Rows gb;
    if (yb) gb = {g(yb->data), yb->rows, yb->cols};
    gpu_.linear(g(x), ldx, w, n, g(y), ldy, xq ? &gq : nullptr, yb ? &gb : nullptr);
    if (yb) check_bf16("linear", tol(1e-4, 0x1p-7), yb->data, size_t(n * w.rows));
    else check("linear", tol(1e-4, 0x1p-7), strided(y, n, ldy, w.rows));
  }
  void linear_partial(const float* x, int64_t ldx, const Weight& w, int64_t n, float* y, int64_t ldy) override {
    cpu_.linear_partial(x, ldx, w, n, y, ldy);
    gpu_.linear_partial(g(x), ldx, w, n, g(y), ldy);
    check("linear_partial", tol(1e-4, 0x1p-7), strided(y, n, ldy, w.rows));
  }
  void linear_pair(const float* x, int64_t ldx, int64_t n, const Weight& wa, float* ya, int64_t ldya, const Weight& wb,
                   float* yb, int64_t ldyb, const E4m3Rows* xq) override {
    cpu_.linear_pair(x, ldx, n, wa, ya, ldya, wb, yb, ldyb, xq);
    const E4m3Rows gq = twin(xq);
    gpu_.linear_pair(g(x), ldx, n, wa, g(ya), ldya, wb, g(yb), ldyb, xq ? &gq : nullptr);
    std::vector<Span> outs = strided(ya, n, ldya, wa.rows);
    for (const auto& o : strided(yb, n, ldyb, wb.rows)) outs.push_back(o);
    check("linear_pair", tol(1e-4, 0x1p-7), outs);
  }
  void linear_grouped(const float* x, const Weight& w, int64_t groups, int64_t n, float* y,
                      const Bf16Rows* xb) override {
    cpu_.linear_grouped(x, w, groups, n, y, xb);
    Bf16Rows gb;
    if (xb) gb = {g(xb->data), xb->rows, xb->cols};
    gpu_.linear_grouped(g(x), w, groups, n, g(y), xb ? &gb : nullptr);
    check("linear_grouped", tol(1e-4, 0x1p-7), {{y, size_t(n * w.rows)}});
  }

  void rms_norm(const float* x, const std::vector<float>* gamma, int64_t rows, int64_t dim, float* y,
                E4m3Rows* yq) override {
    cpu_.rms_norm(x, gamma, rows, dim, y, yq);
    E4m3Rows gq = twin(yq);
    gpu_.rms_norm(g(x), gamma, rows, dim, g(y), yq ? &gq : nullptr);
    check("rms_norm", tol(1e-5, 0x1p-7), {{y, size_t(rows * dim)}});
    if (yq) check_e4m3("rms_norm_e4m3", *yq, rows);
  }
  void rope(float* x, int64_t rows, int64_t row_stride, int64_t offset, int64_t rows_per_pos, int64_t pos0,
            int64_t pos_stride, RopeKind kind, bool inverse) override {
    cpu_.rope(x, rows, row_stride, offset, rows_per_pos, pos0, pos_stride, kind, inverse);
    gpu_.rope(g(x), rows, row_stride, offset, rows_per_pos, pos0, pos_stride, kind, inverse);
    check(inverse ? "rope_inverse" : "rope", tol(1e-5, 0x1p-7), {{x, size_t(rows * row_stride)}});
  }
  // The fused ops: the norm is bit-exact (norm_rope.cu), the rope channels carry the fp64 sin/cos last bits.
  void norm_rope(float* x, const std::vector<float>* gamma, int64_t rows, int64_t dim, int64_t offset,
                 int64_t rows_per_pos, int64_t pos0, RopeKind kind) override {
    cpu_.norm_rope(x, gamma, rows, dim, offset, rows_per_pos, pos0, kind);
    gpu_.norm_rope(g(x), gamma, rows, dim, offset, rows_per_pos, pos0, kind);
    check("norm_rope", tol(1e-5, 0x1p-7), {{x, size_t(rows * dim)}});
  }
  // kv is scratch afterwards (the CUDA ring rounds on store and leaves kv unsimulated): only the ring is judged.
  void kv_finish(float* kv, const std::vector<float>& gamma, int64_t n, int64_t dim, int64_t nope, int64_t pos0,
                 RopeKind kind, bool simulate, int64_t slots, float* ring) override {
    cpu_.kv_finish(kv, gamma, n, dim, nope, pos0, kind, simulate, slots, ring);
    gpu_.kv_finish(g(kv), gamma, n, dim, nope, pos0, kind, simulate, slots, g(ring));
    check("kv_finish", tol(1e-5, 0x1p-3), {{ring, size_t(slots * dim)}});
  }
  // The per-sequence ops run as the model calls them, one batch of sequences per call, on both backends; each
  // sequence's outputs are judged.
  void query_kv_finish(std::span<const QueryKvParams> batch) override {
    cpu_.query_kv_finish(batch);
    std::vector<QueryKvParams> on_gpu(batch.begin(), batch.end());
    for (QueryKvParams& p : on_gpu) {
      p.q = g(p.q);
      p.q_bf16 = g(p.q_bf16);
      p.kv = g(p.kv);
      p.ring = g(p.ring);
    }
    gpu_.query_kv_finish(on_gpu);
    for (const QueryKvParams& p : batch) {
      const size_t q_count = size_t(p.n * p.heads * p.dim);
      if (p.q_bf16) {
        check_bf16("query_kv_finish_q", tol(1e-5, 0x1p-7), p.q_bf16, q_count);
        check("query_kv_finish", tol(1e-5, 0x1p-3), {{p.ring, size_t(p.slots * p.dim)}});
      } else {
        check("query_kv_finish", tol(1e-5, 0x1p-3), {{p.q, q_count}, {p.ring, size_t(p.slots * p.dim)}});
      }
    }
  }

  void sim_fp8(float* x, int64_t rows, int64_t row_stride, int64_t cols, int64_t block) override {
    cpu_.sim_fp8(x, rows, row_stride, cols, block);
    gpu_.sim_fp8(g(x), rows, row_stride, cols, block);
    check("sim_fp8", 0.0, {{x, size_t(rows * row_stride)}});
  }
  void hadamard_sim_fp4(float* x, int64_t rows, int64_t dim) override {
    cpu_.hadamard_sim_fp4(x, rows, dim);
    gpu_.hadamard_sim_fp4(g(x), rows, dim);
    check("hadamard_sim_fp4", 0.0, {{x, size_t(rows * dim)}});
  }

  void hc_pre(const float* X, const HcWeights& w, int64_t n, float* x, float* post, float* comb) override {
    cpu_.hc_pre(X, w, n, x, post, comb);
    gpu_.hc_pre(g(X), w, n, g(x), g(post), g(comb));
    const size_t hc = size_t(config_.hc_mult);
    check("hc_pre", tol(1e-4, 0x1p-6), {{x, size_t(n * config_.dim)}, {post, size_t(n) * hc}, {comb, size_t(n) * hc * hc}});
  }
  // The CUDA backend defers hc_post (cuda_ops.h): reading X back for the check runs it unfused, so the fused
  // hc_post_mix is judged in test_hc and end to end in the golden tests.
  void hc_post(const float* f, const float* post, const float* comb, int64_t n, float* X) override {
    cpu_.hc_post(f, post, comb, n, X);
    gpu_.hc_post(g(f), g(post), g(comb), n, g(X));
    check("hc_post", tol(1e-4, 0x1p-7), {{X, size_t(n * config_.hc_mult * config_.dim)}});
  }
  void hc_head(const float* X, const HcHeadWeights& w, int64_t n, float* y) override {
    cpu_.hc_head(X, w, n, y);
    gpu_.hc_head(g(X), w, n, g(y));
    check("hc_head", tol(1e-4, 0x1p-7), {{y, size_t(n * config_.dim)}});
  }
  void hc_pre_norm(const float* X, const HcWeights& w, const std::vector<float>& gamma, int64_t n, int64_t dim,
                   float* x, float* xn, float* post, float* comb, E4m3Rows* xnq) override {
    cpu_.hc_pre_norm(X, w, gamma, n, dim, x, xn, post, comb, xnq);
    E4m3Rows gq = twin(xnq);
    gpu_.hc_pre_norm(g(X), w, gamma, n, dim, g(x), g(xn), g(post), g(comb), xnq ? &gq : nullptr);
    const size_t hc = size_t(config_.hc_mult);
    check("hc_pre_norm", tol(1e-4, 0x1p-6), {{x, size_t(n * dim)}, {xn, size_t(n * dim)}, {post, size_t(n) * hc},
                                {comb, size_t(n) * hc * hc}});
    if (xnq) check_e4m3("hc_pre_norm_e4m3", *xnq, n);
  }

  void compressor(std::span<const CompressorParams> batch) override {
    cpu_.compressor(batch);
    std::vector<CompressorState> states;
    for (const CompressorParams& p : batch)
      states.push_back({g(p.state->kv), g(p.state->score), g(p.state->entries), p.state->max_entries});
    std::vector<CompressorParams> on_gpu(batch.begin(), batch.end());
    for (size_t i = 0; i < on_gpu.size(); ++i) {
      on_gpu[i].state = &states[i];
      on_gpu[i].x = g(on_gpu[i].x);
    }
    gpu_.compressor(on_gpu);
    for (const CompressorParams& p : batch) {
      const CompressorWeights& w = *p.weights;
      const CompressorState& state = *p.state;
      const int64_t coff = w.overlap ? 2 : 1, cells = coff * w.ratio * coff * w.width;
      const char* name = p.sim == EntrySim::kNone        ? "compressor"
                         : p.sim == EntrySim::kFp8NoPe   ? "compressor_fp8"
                                                         : "compressor_fp4";
      // Pooling differs by expf's last bit, and an entry's FP8 / FP4 rounding may flip with it: entries are
      // judged relative to their scale like the pooled sums (a flip moves one value by one grid step).
      check(name, tol(1e-4, p.sim == EntrySim::kHadamardFp4 ? 0.5 : p.sim == EntrySim::kFp8NoPe ? 0x1p-3 : 0x1p-7),
            {{state.kv, size_t(cells)},
             {state.score, size_t(cells)},
             {state.entries, size_t((p.pos0 + p.n) / w.ratio * w.width)}});
    }
  }
  void indexer_topk(std::span<const IndexerParams> batch) override {
    cpu_.indexer_topk(batch);
    std::vector<IndexerParams> on_gpu(batch.begin(), batch.end());
    for (IndexerParams& q : on_gpu) {
      q.q = g(q.q);
      q.weights = g(q.weights);
      q.keys = g(q.keys);
      q.selected = g(q.selected);
    }
    gpu_.indexer_topk(on_gpu);
    for (const IndexerParams& p : batch) check_selection(p.selected, p.n, p.top_k);
  }
  void attention(std::span<const AttentionParams> batch) override {
    cpu_.attention(batch);
    std::vector<AttentionParams> on_gpu(batch.begin(), batch.end());
    for (AttentionParams& q : on_gpu) {
      q.q = g(q.q);
      q.q_bf16 = g(q.q_bf16);
      q.window = g(q.window);
      q.entries = g(q.entries);
      q.selected = g(q.selected);
      q.out = g(q.out);
      q.out_bf16 = g(q.out_bf16);
    }
    gpu_.attention(on_gpu);
    // Both backends round P against an integer maximum in base-2 units, so the same values whatever the
    // partition (src/cpu/attention.cpp, attend_fast): only summation order flips an output's rounding.
    for (const AttentionParams& p : batch) {
      const size_t count = size_t(p.n * p.heads * p.head_dim);
      if (p.out_bf16) check_bf16("attention", tol(1e-4, 0x1p-6), p.out_bf16, count);
      else check("attention", tol(1e-4, 0x1p-6), {{p.out, count}});
    }
  }

  void moe(const MoeWeights& w, const float* x, const int32_t* tokens, int64_t n, float* out) override {
    cpu_.moe(w, x, tokens, n, out);
    gpu_.moe(w, g(x), g(tokens), n, g(out));
    check("moe", tol(1e-4, 0x1p-5), {{out, size_t(n * config_.dim)}});
  }
  void moe_partial(const MoeWeights& w, const float* x, const int32_t* tokens, int64_t n, float* out) override {
    cpu_.moe_partial(w, x, tokens, n, out);
    gpu_.moe_partial(w, g(x), g(tokens), n, g(out));
    check("moe_partial", tol(1e-4, 0x1p-5), {{out, size_t(n * config_.dim)}});
  }

 private:
  struct Region {
    const void* cpu;
    void* gpu;
    size_t bytes;
    int64_t cache_dim = 0;  // > 0: a cache of rows of this many channels, only addressed by its base pointer
  };
  struct Span {
    const float* cpu;
    size_t count;
  };

  // The region from alloc() / alloc_cache() that holds a CPU pointer; nullptr for any other pointer.
  const Region* region(const void* cpu) const {
    auto it = regions_.upper_bound(cpu);
    if (it == regions_.begin()) return nullptr;
    --it;
    const auto* base = static_cast<const char*>(it->first);
    if (static_cast<const char*>(cpu) >= base + it->second.bytes) return nullptr;
    if (it->second.cache_dim > 0 && cpu != base) throw std::logic_error("a cache addressed inside its rows");
    return &it->second;
  }

  // The CUDA twin of a CPU pointer from alloc(); any other pointer (weights, host vectors) is shared.
  template <class T>
  T* g(T* cpu) const {
    const Region* r = cpu ? region(cpu) : nullptr;
    if (!r) return cpu;
    const auto offset = reinterpret_cast<const char*>(cpu) - static_cast<const char*>(r->cpu);
    return reinterpret_cast<T*>(static_cast<char*>(r->gpu) + offset);
  }

  // The CUDA twin of act_quant'ed rows from alloc_e4m3 (codes and scales in alloc() regions).
  E4m3Rows twin(const E4m3Rows* q) const {
    if (!q) return {};
    E4m3Rows t = *q;
    t.codes = g(q->codes);
    t.scales = g(q->scales);
    return t;
  }

  // Judges act_quant'ed rows [0, rows) by their values (code · scale): a producer's output differing by a bf16 flip
  // may move a code by one e4m3 step (2^-3 of the value, as kv_finish), then makes the CUDA bytes the CPU's.
  void check_e4m3(const std::string& op, const E4m3Rows& q, int64_t rows) {
    OpStats& s = stats_[op];
    const int64_t call = s.calls++;
    const size_t code_floats = size_t(q.rows * q.cols / 4), scale_floats = size_t(q.cols / 128 * q.scale_ld);
    std::vector<float> codes(code_floats), scales(scale_floats);
    float* codes_twin = g(reinterpret_cast<float*>(q.codes));
    gpu_.read_cache(codes_twin, 1, int64_t(code_floats), codes.data());
    gpu_.read_cache(g(q.scales), 1, int64_t(scale_floats), scales.data());
    const auto* got = reinterpret_cast<const uint8_t*>(codes.data());
    double diff = 0.0, scale = 0.0;
    int64_t flipped = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < q.cols; ++c) {
        const size_t b = size_t(c / 128 * q.scale_ld + r), i = size_t(r * q.cols + c);
        const float want = e4m3_to_f32(q.codes[i]) * q.scales[b], have = e4m3_to_f32(got[i]) * scales[b];
        scale = std::max(scale, double(std::fabs(want)));
        diff = std::max(diff, double(std::fabs(have - want)));
        flipped += want != have;
      }
    gpu_.write_cache(codes_twin, 1, int64_t(code_floats), reinterpret_cast<const float*>(q.codes));
    gpu_.write_cache(g(q.scales), 1, int64_t(scale_floats), q.scales);
    s.values += rows * q.cols;
    s.flipped += flipped;
    const double err = diff / std::max(scale, 1e-30);
    record(s, call, err, err > 0x1p-3 || double(flipped) > kFastMaxFlipped * double(rows * q.cols));
  }

  std::vector<Span> strided(const float* y, int64_t rows, int64_t ld, int64_t cols) const {
    std::vector<Span> spans;
    for (int64_t r = 0; r < rows; ++r) spans.push_back({y + r * ld, size_t(cols)});
    return spans;
  }

  // The tolerance of an op in the numerics under test (the header says why).
  double tol(double reference, double fast) const { return fast_ ? fast : reference; }

  // Compares the CUDA copies of `outputs` with the CPU's, records the error, then makes them equal.
  // Fast numerics also fail an op when more than max_flipped of its values are off by a bf16 step or more.
  void check(const std::string& op, double tolerance, const std::vector<Span>& outputs,
             double max_flipped = kFastMaxFlipped) {
    std::vector<float> want, have;
    for (const Span& o : outputs) {
      if (o.count == 0) continue;
      // A cache is read and rewritten as fp32 rows (write_cache quantises as the store does: lossless for
      // simulated values); any other buffer as one row of o.count values (read_cache / write_cache copy it).
      const Region* r = region(o.cpu);
      const int64_t dim = r && r->cache_dim > 0 ? r->cache_dim : int64_t(o.count), rows = int64_t(o.count) / dim;
      float* twin = g(const_cast<float*>(o.cpu));
      const size_t at = have.size();
      have.resize(at + o.count);
      gpu_.read_cache(twin, rows, dim, have.data() + at);
      want.insert(want.end(), o.cpu, o.cpu + o.count);
      gpu_.write_cache(twin, rows, dim, o.cpu);
    }
    judge(op, tolerance, want, have, max_flipped);
  }

  // check() for bf16 rows (Bf16Rows, count values from cpu on): compared as values, then the CUDA bits made the
  // CPU's. count is even (rows of H·d values).
  void check_bf16(const std::string& op, double tolerance, const uint16_t* cpu, size_t count) {
    std::vector<float> raw(count / 2), want(count), have(count);
    float* twin = g(reinterpret_cast<float*>(const_cast<uint16_t*>(cpu)));
    gpu_.read_cache(twin, 1, int64_t(raw.size()), raw.data());
    const auto* bits = reinterpret_cast<const uint16_t*>(raw.data());
    for (size_t i = 0; i < count; ++i) {
      want[i] = bf16_to_f32(cpu[i]);
      have[i] = bf16_to_f32(bits[i]);
    }
    gpu_.write_cache(twin, 1, int64_t(raw.size()), reinterpret_cast<const float*>(cpu));
    judge(op, tolerance, want, have, kFastMaxFlipped);
  }

  // Records the error of the CUDA values `have` against the CPU's `want` (check's judgement).
  void judge(const std::string& op, double tolerance, const std::vector<float>& want, const std::vector<float>& have,
             double max_flipped) {
    OpStats& s = stats_[op];
    const int64_t call = s.calls++;
    double diff = 0.0, scale = 0.0;
    std::vector<std::pair<float, float>> off;  // (cpu, cuda) of the values that differ
    bool nan_mismatch = false;
    for (size_t i = 0; i < want.size(); ++i) {
      const float w = want[i], h = have[i];
      if (std::isfinite(w)) scale = std::max(scale, double(std::fabs(w)));
      if (std::isnan(w) || std::isnan(h)) {
        nan_mismatch |= std::isnan(w) != std::isnan(h);
        continue;
      }
      if (w == h) continue;  // also equal infinities (empty compressor scores are −inf)
      if (std::isinf(w) || std::isinf(h)) {
        nan_mismatch = true;
        continue;
      }
      diff = std::max(diff, double(std::fabs(h - w)));
      off.emplace_back(w, h);
    }
    const double err = nan_mismatch ? INFINITY : diff / std::max(scale, 1e-30);
    // A bf16 step is ≥ 2^-8 of a value; fp32 summation noise stays orders of magnitude below 2^-10.
    size_t flipped = 0;
    for (const auto& [w, h] : off) flipped += std::fabs(h - w) > std::max(0x1p-10 * std::fabs(w), 1e-6 * scale);
    s.values += int64_t(want.size());
    s.flipped += int64_t(flipped);
    const bool too_many = fast_ && tolerance > 0 && double(flipped) > max_flipped * double(want.size());
    record(s, call, err, err > tolerance || too_many);
  }

  void check_selection(int32_t* selected, int64_t n, int64_t k) {
    OpStats& s = stats_["indexer_topk"];
    const int64_t call = s.calls++;
    const std::vector<int32_t> got = to_host(gpu_, g(selected), size_t(n * k));
    int64_t rows_differing = 0;
    for (int64_t r = 0; r < n; ++r) {
      std::vector<int32_t> a(selected + r * k, selected + (r + 1) * k), b(got.begin() + r * k, got.begin() + (r + 1) * k);
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      rows_differing += a != b;
    }
    gpu_.upload_i32(g(selected), selected, got.size());
    record(s, call, double(rows_differing), rows_differing > 0);
  }

  void record(OpStats& s, int64_t call, double err, bool failed) {
    if (err > s.worst || s.worst_call < 0) {
      s.worst = err;
      s.worst_call = call;
    }
    if (failed && s.failed++ == 0) s.first_failed_call = call;
  }

  static constexpr double kFastMaxFlipped = 0.02;  // fast numerics: share of values a bf16 flip may change

  CpuOps cpu_;
  CudaOps& gpu_;
  bool fast_ = false;
  ModelConfig config_;
  std::map<const void*, Region> regions_;
  std::map<std::string, OpStats> stats_;
};

#endif  // DSV4_HAVE_CUDA

class Conformance : public ::testing::TestWithParam<Numerics> {};

TEST_P(Conformance, EveryOpOfARefSmallForwardMatchesCpu) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  const auto weights = load_model(ref_small_dir());
  const auto index = nlohmann::json::parse(read_text(ref_small_dir() + "/logits/index.json"));
  const auto prompt = index["prompt_ids"].get<std::vector<int32_t>>();
  ASSERT_GE(prompt.size(), 40u);

  CudaOps gpu(weights->config);
  gpu.upload_model(*weights);
  TeeOps tee(weights->config, gpu);
  const int64_t decodes = 8, context = int64_t(prompt.size()) + decodes + 1;
  DeepseekV4 model(*weights, tee, GetParam(), context, /*max_step=*/13);
  const int64_t V = weights->config.vocab_size;
  std::vector<float> logits(size_t(13 * V));
  // Prefill in chunks of 13 (windows and compression blocks straddle chunks), then greedy decodes, then MTP.
  for (size_t i = 0; i < prompt.size(); i += 13) {
    const int64_t n = std::min<int64_t>(13, int64_t(prompt.size() - i));
    model.step(prompt.data() + i, n, logits.data(), /*all_rows=*/true);
  }
  int32_t next = int32_t(std::max_element(logits.begin(), logits.begin() + V) - logits.begin());
  for (int64_t t = 0; t < decodes; ++t) {  // with the backend's greedy choice too (StepInput::next_token)
    const int32_t input = next;
    int32_t chosen = -1;
    model.step(&input, 1, logits.data(), false, &chosen);
    next = int32_t(std::max_element(logits.begin(), logits.begin() + V) - logits.begin());
    EXPECT_EQ(chosen, next) << "decode " << t;
  }
  model.mtp_step(&next, 1, logits.data());

  tee.print();
  for (const auto& [op, s] : tee.stats())
    EXPECT_EQ(s.failed, 0) << op << ": " << s.failed << " of " << s.calls << " calls out of tolerance, first at call "
                           << s.first_failed_call << " (worst error " << s.worst << " at call " << s.worst_call << ")";
  const bool reference = GetParam() != Numerics::kExact;  // fast keeps the simulation points
  for (const char* op : {"linear", "linear_pair", "linear_grouped", "attention", "moe", "hc_pre_norm", "hc_post", "hc_head",
                         "indexer_topk", "download", "greedy_tokens", "query_kv_finish", "rms_norm",
                         reference ? "compressor_fp8" : "compressor", reference ? "compressor_fp4" : "rope",
                         reference ? "hadamard_sim_fp4" : "rope"})
    EXPECT_GT(tee.stats().count(op) ? tee.stats().at(op).calls : 0, 0) << op << " was never exercised";
#endif
}

INSTANTIATE_TEST_SUITE_P(Numerics, Conformance,
                         ::testing::Values(Numerics::kReference, Numerics::kExact, Numerics::kFast),
                         [](const auto& info) { return std::string(numerics_name(info.param)); });

}  // namespace
}  // namespace dsv4::test
