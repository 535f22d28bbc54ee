// CpuOps: memory and the small elementwise ops; the families live in their own files.
#include <algorithm>
#include <cstring>
#include <utility>

#include "cpu/cpu_ops.h"
#include "sampler/sampler.h"

namespace dsv4 {

CpuOps::CpuOps(const ModelConfig& config, std::shared_ptr<HostGroup> group, int rank)
    : config_(config),
      group_(std::move(group)),
      rank_(rank),
      inv_freq_plain_(rope_inv_freq(config.rope_dim, config.rope_theta, nullptr)),
      inv_freq_compressed_(rope_inv_freq(config.rope_dim, config.compress_rope_theta, &config.yarn)) {}

float* CpuOps::alloc(size_t count) { return buffers_.emplace_back(count, 0.0f).data(); }
int32_t* CpuOps::alloc_i32(size_t count) { return int_buffers_.emplace_back(count, 0).data(); }
void CpuOps::fill(float* x, size_t count, float value) { std::fill(x, x + count, value); }
void CpuOps::upload_i32(int32_t* dst, const int32_t* host, size_t count) { std::copy(host, host + count, dst); }
void CpuOps::download(float* host, const float* src, size_t count) { std::copy(src, src + count, host); }
void CpuOps::download_i32(int32_t* host, const int32_t* src, size_t count) { std::copy(src, src + count, host); }
void CpuOps::greedy_tokens(const float* logits, int64_t rows, int64_t vocab, int32_t* tokens, float* values) {
  for (int64_t r = 0; r < rows; ++r) {
    tokens[r] = argmax(logits + r * vocab, vocab);
    if (values) values[r] = logits[r * vocab + tokens[r]];
  }
}
void CpuOps::sample_tokens(const float* logits, int64_t vocab, std::span<const RowDraw> draws, int32_t* tokens) {
#pragma omp parallel for schedule(dynamic, 1) if (draws.size() > 1)
  for (size_t r = 0; r < draws.size(); ++r) tokens[r] = sample_row(logits + int64_t(r) * vocab, vocab, draws[r]);
}
void CpuOps::token_logprobs(const float* logits, int64_t vocab, std::span<const int64_t> rows, const int32_t* tokens,
                            int64_t top, std::span<TokenLogprobs> out) {
  for (size_t i = 0; i < rows.size(); ++i)
    out[i] = dsv4::token_logprobs(logits + rows[i] * vocab, vocab, tokens[rows[i]], top);
}
void CpuOps::copy(const float* src, size_t count, float* dst) { std::copy(src, src + count, dst); }
void CpuOps::all_reduce(float* x, size_t count) {
  if (group_) group_->all_reduce(rank_, x, count);
}
void CpuOps::abort_group() {
  if (group_) group_->abort();
}

std::vector<float>& CpuOps::scratch(size_t slot, size_t count) {
  if (scratch_.size() <= slot) scratch_.resize(slot + 1);
  if (scratch_[slot].size() < count) scratch_[slot].resize(count);
  return scratch_[slot];
}

void CpuOps::embed(const Weight& table, const int32_t* tokens, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) dequant_row(table, tokens[i], out + i * table.cols);
  if (fast()) round_bf16(out, size_t(n * table.cols));  // exact for the bf16 table of a real checkpoint
}

void CpuOps::broadcast_streams(const float* x, int64_t n, int64_t hc, int64_t dim, float* X) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < hc; ++j) std::copy(x + t * dim, x + (t + 1) * dim, X + (t * hc + j) * dim);
}

void CpuOps::add(const float* a, const float* b, size_t count, float* out) {
  for (size_t i = 0; i < count; ++i) out[i] = a[i] + b[i];
  if (fast()) round_bf16(out, count);  // a bf16 add
}

void CpuOps::scale(float* x, size_t count, float factor) {
  for (size_t i = 0; i < count; ++i) x[i] *= factor;
  if (fast()) round_bf16(x, count);  // a bf16 tensor times an fp32 scalar
}

void CpuOps::ring_store(const float* x, int64_t n, int64_t cols, int64_t pos0, int64_t slots, float* ring) {
  for (int64_t i = 0; i < n; ++i) std::copy(x + i * cols, x + (i + 1) * cols, ring + ((pos0 + i) % slots) * cols);
}

}  // namespace dsv4
