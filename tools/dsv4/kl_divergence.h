// dsv4 perplexity --save-logits / --kl-divergence: the base run's log-probabilities on disk, and the statistics
// of a run against them (KL divergence, top-1 agreement, the two perplexities), reported as llama.cpp's
// `perplexity --kl-divergence` reports them.
//
// File format, version 1, little-endian, no padding:
//   header (72 bytes)   char[8] "DSV4LOGP" · u32 version · u32 encoding (0 f32, 1 u16) · u32 vocab V · u32 ctx ·
//                       u32 windows · i32 bos · u64 positions T · char[16] backend · char[16] numerics
//                       (NUL-padded names of what made the file: informative, never checked)
//   ids                 i32[T]: the text's tokens the run scored, in order (position t predicts ids[t])
//   T rows              i32 top-1 id · f32 ln p(ids[t]) · the row's ln softmax, encoded:
//                         f32: f32[V]                                     (8 + 4·V bytes a row)
//                         u16: f32 lo · f32 step · u16[V]; code 0 = p 0 (below max − 32 nats),
//                              code c ≥ 1 = lo + (c − 1)·step, renormalised on reading  (16 + 2·V bytes)
// The top-1 id and the true token's log-probability are stored exactly in both encodings, so the base's
// perplexity and the top-1 agreement never depend on the encoding; only the KL divergence reads the row.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace dsv4::cli {

// ln softmax of one row of logits, computed in double and rounded to float: the one form every scored position
// takes (perplexity, the saved rows and the compared rows), so two runs with the same numerics agree bit for bit.
void log_softmax(const float* logits, int64_t V, float* lp);  // [V] → [V]
int32_t argmax(const float* v, int64_t V);                    // the first maximum

enum class RowEncoding : uint32_t { kF32 = 0, kU16 = 1 };
RowEncoding parse_row_encoding(const std::string& name);  // "f32" | "u16"
const char* row_encoding_name(RowEncoding e);

struct LogitsFileInfo {
  RowEncoding encoding = RowEncoding::kF32;
  int64_t vocab = 0;
  int64_t ctx = 0;      // tokens per window, BOS included
  int64_t windows = 0;  // windows scored
  int32_t bos = 0;
  std::string backend, numerics;
  std::vector<int32_t> ids;  // [T] the scored tokens; T = positions
};

// Writes the header and ids at construction, then one row per scored position, in order.
class LogitsWriter {
 public:
  LogitsWriter(const std::string& path, const LogitsFileInfo& info);
  ~LogitsWriter();
  LogitsWriter(const LogitsWriter&) = delete;
  LogitsWriter& operator=(const LogitsWriter&) = delete;

  void write_row(const float* lp, int32_t target);  // lp [V], ln softmax; target: the token this row predicts
  void finish();                                    // every row written; flushes and closes
  int64_t bytes() const;                            // the whole file's size

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  LogitsFileInfo info_;
  int64_t rows_ = 0;
  std::vector<uint8_t> buf_;
};

struct BaseRow {
  int32_t top1 = 0;
  float lp_target = 0;  // ln p(true token), as the base run computed it
};

// Validates the header and the file's size against it at construction (one-line errors naming the file);
// rows are then read one at a time, in order.
class LogitsReader {
 public:
  explicit LogitsReader(const std::string& path);
  ~LogitsReader();
  LogitsReader(const LogitsReader&) = delete;
  LogitsReader& operator=(const LogitsReader&) = delete;

  const LogitsFileInfo& info() const { return info_; }
  const std::string& path() const { return path_; }
  BaseRow read_row(float* lp);  // lp [V]: the base's ln softmax (decoded; −inf where the base stored p 0)

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  LogitsFileInfo info_;
  std::vector<uint8_t> buf_;
};

// Per-position statistics of this run (Q) against the base, accumulated as llama.cpp's kl_divergence does.
class KlStats {
 public:
  // base_lp, lp: [V] ln softmax of the base and of this run at one position; target: the true next token.
  void add(const float* base_lp, const BaseRow& base, const float* lp, int32_t target, int64_t V);
  int64_t count() const { return count_; }
  void print(std::FILE* out) const;  // the report: perplexity, KL divergence and token probability sections

 private:
  double sum_nll_ = 0, sum_nll2_ = 0, sum_nll_base_ = 0, sum_nll_base2_ = 0, sum_nll_nll_base_ = 0;
  double sum_kld_ = 0, sum_kld2_ = 0;
  double sum_p_diff_ = 0, sum_p_diff2_ = 0, sum_p_diff4_ = 0;
  int64_t same_top_ = 0, count_ = 0;
  std::vector<float> kld_, p_diff_;  // per position, for the percentiles
};

// KL(p ‖ q) of two ln softmax rows, as Σ p·(d − 1 + e^−d) with d = ln p − ln q: equal to Σ p·ln(p/q) when both
// sum to one, and non-negative term by term, so the float rounding of the rows neither makes it negative nor
// enters it to first order. A position where p is 0 adds q.
double kl_divergence(const float* lp, const float* lq, int64_t V);

}  // namespace dsv4::cli
