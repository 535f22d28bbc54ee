// The CPU reference backend: plain fp32 loops (OpenMP over independent rows), readable first.
// It is the oracle every CUDA kernel is tested against. Each op family lives in its own file:
// gemm.cpp, norm_rope.cpp, quant.cpp, hc.cpp, attention.cpp, moe.cpp.
#pragma once

#include <deque>
#include <vector>

#include "model/ops.h"

namespace dsv4 {

// Row r of a checkpoint matrix decoded to fp32 (the spec §3.3 formulas).
void dequant_row(const Weight& w, int64_t row, float* out);

// Inverse frequencies f_i of the rope_dim/2 rotary pairs (spec §3.2), YaRN applied when enabled.
std::vector<float> rope_inv_freq(int64_t rope_dim, double theta, const YarnConfig* yarn);

class CpuOps final : public Ops {
 public:
  explicit CpuOps(const ModelConfig& config);

  float* alloc(size_t count) override;
  int32_t* alloc_i32(size_t count) override;
  void fill(float* x, size_t count, float value) override;
  void upload_i32(int32_t* dst, const int32_t* host, size_t count) override;
  void download(float* host, const float* src, size_t count) override;
  void download_i32(int32_t* host, const int32_t* src, size_t count) override;
  void copy(const float* src, size_t count, float* dst) override;

  void embed(const Weight& table, const int32_t* tokens, int64_t n, float* out) override;
  void broadcast_streams(const float* x, int64_t n, int64_t hc, int64_t dim, float* X) override;
  void add(const float* a, const float* b, size_t count, float* out) override;
  void scale(float* x, size_t count, float factor) override;
  void greedy_tokens(const float* logits, int64_t rows, int64_t vocab, int32_t* tokens) override;
  void ring_store(const float* x, int64_t n, int64_t cols, int64_t pos0, int64_t slots, float* ring) override;

  void linear(const float* x, int64_t ldx, const Weight& w, int64_t n, float* y, int64_t ldy) override;
  void linear_grouped(const float* x, const Weight& w, int64_t groups, int64_t n, float* y) override;

  void rms_norm(const float* x, const std::vector<float>* gamma, int64_t rows, int64_t dim, float* y) override;
  void rope(float* x, int64_t rows, int64_t row_stride, int64_t offset, int64_t rows_per_pos, int64_t pos0,
            int64_t pos_stride, RopeKind kind, bool inverse) override;

  void sim_fp8(float* x, int64_t rows, int64_t row_stride, int64_t cols, int64_t block) override;
  void hadamard_sim_fp4(float* x, int64_t rows, int64_t dim) override;

  void hc_pre(const float* X, const HcWeights& w, int64_t n, float* x, float* post, float* comb) override;
  void hc_post(const float* f, const float* post, const float* comb, int64_t n, float* X) override;
  void hc_head(const float* X, const HcHeadWeights& w, int64_t n, float* y) override;

  void compressor(const CompressorWeights& w, CompressorState& state, const float* x, int64_t pos0, int64_t n,
                  EntrySim sim) override;
  void indexer_topk(const IndexerParams& p) override;
  void attention(const AttentionParams& p) override;

  void moe(const MoeWeights& w, const float* x, const int32_t* tokens, int64_t n, float* out) override;

 private:
  std::vector<float>& scratch(size_t slot, size_t count);  // reused per-op buffers, grown on demand

  ModelConfig config_;
  std::vector<float> inv_freq_plain_, inv_freq_compressed_;
  std::deque<std::vector<float>> buffers_;  // deque: growth keeps earlier buffers' addresses
  std::deque<std::vector<int32_t>> int_buffers_;
  std::vector<std::vector<float>> scratch_;
};

}  // namespace dsv4
