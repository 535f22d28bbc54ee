// The CPU reference backend: plain fp32 loops (OpenMP over independent rows), readable first.
// It is the oracle every CUDA kernel is tested against. Each op family lives in its own file:
// gemm.cpp, norm_rope.cpp, quant.cpp, hc.cpp, attention.cpp, moe.cpp.
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "cpu/host_group.h"
#include "model/ops.h"

namespace dsv4 {

// Row r of a checkpoint matrix decoded to fp32 (the spec §3.3 formulas).
void dequant_row(const Weight& w, int64_t row, float* out);

// ---- The rounding points of fast numerics (docs/design/fast-numerics.md §1.2, §1.3), in place.
// Every value of x [count] rounded to bf16 (RNE) and back.
void round_bf16(float* x, size_t count);
// DeepSeek's act_quant of one row, dequantised: per block of `block` columns a power-of-two scale
// s = 2^ceil_log2(max(amax, 1e-4) / 448), then v ← e4m3_RNE(clamp(v / s, ±448)) · s (exact in fp32).
void fp8_round_trip(float* v, int64_t cols, int64_t block);
// x's rows [rows, cols] (row stride ldx) act_quant'ed into q as codes and scales: their values are fp8_round_trip's
// (block 128) of the same rows. cols a multiple of 128, rows ≤ q.rows.
void act_quant_rows(const float* x, int64_t rows, int64_t cols, int64_t ldx, const E4m3Rows& q);
// fp4_act_quant of one row, dequantised: per 32 columns s = 2^ceil_log2(max(amax, 6·2^-126) / 6), then
// v ← e2m1_RNE(clamp(v / s, ±6)) · s. cols is a multiple of 32.
void fp4_round_trip(float* v, int64_t cols);

// Inverse frequencies f_i of the rope_dim/2 rotary pairs (spec §3.2), YaRN applied when enabled.
std::vector<float> rope_inv_freq(int64_t rope_dim, double theta, const YarnConfig* yarn);

class CpuOps final : public Ops {
 public:
  // group: the in-process ranks this backend's shard belongs to (model/parallel.h), nullptr when alone.
  explicit CpuOps(const ModelConfig& config, std::shared_ptr<HostGroup> group = nullptr, int rank = 0);

  // kFast rounds where DeepSeek's GPU code rounds (fast-numerics.md §7): bf16 between ops, act_quant before
  // FP8 / FP4 GEMMs. exact and reference stay fp32 between ops.
  void set_numerics(Numerics numerics) override { numerics_ = numerics; }

  float* alloc(size_t count) override;
  int32_t* alloc_i32(size_t count) override;
  void fill(float* x, size_t count, float value) override;
  void upload_i32(int32_t* dst, const int32_t* host, size_t count) override;
  void download(float* host, const float* src, size_t count) override;
  void download_i32(int32_t* host, const int32_t* src, size_t count) override;
  void copy(const float* src, size_t count, float* dst) override;
  void all_reduce(float* x, size_t count) override;
  void abort_group() override;

  void embed(const Weight& table, const int32_t* tokens, int64_t n, float* out) override;
  void broadcast_streams(const float* x, int64_t n, int64_t hc, int64_t dim, float* X) override;
  void add(const float* a, const float* b, size_t count, float* out) override;
  void scale(float* x, size_t count, float factor) override;
  void greedy_tokens(const float* logits, int64_t rows, int64_t vocab, int32_t* tokens, float* values) override;
  void sample_tokens(const float* logits, int64_t vocab, std::span<const RowDraw> draws, int32_t* tokens) override;
  void token_logprobs(const float* logits, int64_t vocab, std::span<const int64_t> rows, const int32_t* tokens,
                      int64_t top, std::span<TokenLogprobs> out) override;
  void ring_store(const float* x, int64_t n, int64_t cols, int64_t pos0, int64_t slots, float* ring) override;

  void linear(const float* x, int64_t ldx, const Weight& w, int64_t n, float* y, int64_t ldy,
              const E4m3Rows* xq = nullptr, Bf16Rows* yb = nullptr) override;
  void linear_partial(const float* x, int64_t ldx, const Weight& w, int64_t n, float* y, int64_t ldy) override;
  void lm_head(const float* x, const Weight& head, int64_t n, float* logits) override;
  void linear_grouped(const float* x, const Weight& w, int64_t groups, int64_t n, float* y,
                      const Bf16Rows* xb = nullptr) override;

  void rms_norm(const float* x, const std::vector<float>* gamma, int64_t rows, int64_t dim, float* y,
                E4m3Rows* yq = nullptr) override;
  void rope(float* x, int64_t rows, int64_t row_stride, int64_t offset, int64_t rows_per_pos, int64_t pos0,
            int64_t pos_stride, RopeKind kind, bool inverse) override;

  // bf16 query heads (QueryKvParams::q_bf16) widened, normed and rotated in fp32 as fp32 ones, then narrowed: the
  // values are bf16 already (fast numerics round the norm and the rotation).
  void query_kv_finish(std::span<const QueryKvParams> batch) override;

  void sim_fp8(float* x, int64_t rows, int64_t row_stride, int64_t cols, int64_t block) override;
  void hadamard_sim_fp4(float* x, int64_t rows, int64_t dim) override;

  void hc_pre(const float* X, const HcWeights& w, int64_t n, float* x, float* post, float* comb) override;
  void hc_post(const float* f, const float* post, const float* comb, int64_t n, float* X) override;
  void hc_head(const float* X, const HcHeadWeights& w, int64_t n, float* y) override;

  // One sequence after the other.
  void compressor(std::span<const CompressorParams> batch) override;
  void indexer_topk(std::span<const IndexerParams> batch) override;
  void attention(std::span<const AttentionParams> batch) override;

  void moe(const MoeWeights& w, const float* x, const int32_t* tokens, int64_t n, float* out) override;
  void moe_partial(const MoeWeights& w, const float* x, const int32_t* tokens, int64_t n, float* out) override;

 private:
  std::vector<float>& scratch(size_t slot, size_t count);  // reused per-op buffers, grown on demand
  // The per-sequence ops, on one sequence.
  void compressor(const CompressorParams& p);
  void indexer_topk(const IndexerParams& p);
  void attention(const AttentionParams& p);
  bool fast() const { return numerics_ == Numerics::kFast; }
  // y = x · Wᵀ in fp32 from the decoded weight, whatever the numerics: the projections DeepSeek runs in fp32
  // (mHC mixes, compressor, router, LM head) and every GEMM of exact and reference numerics.
  void linear_f32(const float* x, int64_t ldx, const Weight& w, int64_t n, float* y, int64_t ldy);
  // A GEMM as fast numerics computes it (fast-numerics.md §1.4, §1.5): bf16 activations, act_quant'ed per 128
  // for FP8 / FP4 weights with fp32 partial sums per scale tile, and a bf16 output.
  // xq, where given, replaces the act_quant of x (the same values). round_out false: y in fp32 (linear_partial).
  void linear_fast(const float* x, int64_t ldx, const Weight& w, int64_t n, float* y, int64_t ldy,
                   const E4m3Rows* xq, bool round_out = true);
  // moe and moe_partial: round_sum, the combined sum rounded in fast numerics.
  void moe_rounded(const MoeWeights& w, const float* x, const int32_t* tokens, int64_t n, float* out, bool round_sum);
  void rms_norm_bf16(const float* x, int64_t rows, int64_t dim, float* y);  // the gain-less q re-norm (§2.3)

  ModelConfig config_;
  std::shared_ptr<HostGroup> group_;
  int rank_ = 0;
  Numerics numerics_ = Numerics::kReference;
  std::vector<float> inv_freq_plain_, inv_freq_compressed_;
  std::deque<std::vector<float>> buffers_;  // deque: growth keeps earlier buffers' addresses
  std::deque<std::vector<int32_t>> int_buffers_;
  std::vector<std::vector<float>> scratch_;
};

}  // namespace dsv4
