#include "kl_divergence.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/error.h"

namespace dsv4::cli {

static_assert(std::endian::native == std::endian::little, "the log-prob file is written in host byte order");

namespace {

constexpr char kMagic[8] = {'D', 'S', 'V', '4', 'L', 'O', 'G', 'P'};
constexpr uint32_t kVersion = 1;
constexpr size_t kNameBytes = 16;
constexpr int64_t kHeaderBytes = 8 + 6 * 4 + 8 + 2 * kNameBytes;
// u16 rows: codes span the row's range, at most its top kU16Range nats; below that, p is stored as 0. llama.cpp
// keeps 16 nats, but the tokens cut off then add ~1e-5 to the KL (their mass under Q counts in full); at 32 the
// cut-off mass is below V·e^−32 ≈ 2e-9 even at V4's vocab, and the 16-bit steps (≤ 4.9e-4 nats) add ≈ 1e-8 at most
// (2.4e-9 on models/tiny, whose rows span under 28 nats).
constexpr double kU16Range = 32.0;
constexpr uint32_t kU16Codes = 65535;  // codes 1 … 65535 on the grid, 0 for p = 0

int64_t row_bytes(RowEncoding e, int64_t V) { return e == RowEncoding::kF32 ? 8 + 4 * V : 16 + 2 * V; }

template <class T>
void put(std::vector<uint8_t>& out, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof v);
}

template <class T>
T take(const uint8_t*& p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  p += sizeof v;
  return v;
}

void put_name(std::vector<uint8_t>& out, const std::string& name) {
  char field[kNameBytes] = {};
  std::memcpy(field, name.data(), std::min(name.size(), kNameBytes - 1));
  out.insert(out.end(), field, field + kNameBytes);
}

std::string take_name(const uint8_t*& p) {
  const char* s = reinterpret_cast<const char*>(p);
  p += kNameBytes;
  return std::string(s, strnlen(s, kNameBytes));
}

// u16 rows: lo = max(min ln p, max ln p − kU16Range), step = (max − lo) / (kU16Codes − 1).
void encode_u16(const float* lp, int64_t V, uint8_t* out) {
  const float mx = *std::max_element(lp, lp + V);
  float lo = mx;
  for (int64_t i = 0; i < V; ++i)
    if (lp[i] >= mx - kU16Range) lo = std::min(lo, lp[i]);
  const float step = (mx - lo) / float(kU16Codes - 1);
  std::memcpy(out, &lo, 4);
  std::memcpy(out + 4, &step, 4);
  for (int64_t i = 0; i < V; ++i) {
    uint16_t c = 0;
    if (lp[i] >= lo) {
      const double x = step > 0 ? std::nearbyint((double(lp[i]) - lo) / step) : 0.0;
      c = uint16_t(1 + std::min(x, double(kU16Codes - 1)));
    }
    std::memcpy(out + 8 + 2 * i, &c, 2);
  }
}

void decode_u16(const uint8_t* in, int64_t V, float* lp) {
  float lo, step;
  std::memcpy(&lo, in, 4);
  std::memcpy(&step, in + 4, 4);
  std::vector<double> x(static_cast<size_t>(V));
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < V; ++i) {
    uint16_t c;
    std::memcpy(&c, in + 8 + 2 * i, 2);
    x[size_t(i)] = c == 0 ? -std::numeric_limits<double>::infinity() : double(lo) + double(c - 1) * step;
    mx = std::max(mx, x[size_t(i)]);
  }
  double sum = 0;
  for (const double v : x) sum += std::exp(v - mx);
  const double lse = mx + std::log(sum);
  for (int64_t i = 0; i < V; ++i) lp[i] = float(x[size_t(i)] - lse);
}

// Mean and its standard error from Σx and Σx² (llama.cpp's mean_and_uncertainty).
struct Mean {
  double value, error;
};
Mean mean_of(double sum, double sum2, int64_t n) {
  if (n < 1) return {0, 0};
  const double f = sum / double(n), var = sum2 / double(n) - f * f;
  return {f, var > 0 && n > 1 ? std::sqrt(var / double(n - 1)) : 0.0};
}

// Covariance of the two means, from Σa, Σb and Σab.
double covariance(double sa, double sb, double sab, int64_t n) {
  if (n < 2) return 0;
  return (sab / double(n) - (sa / double(n)) * (sb / double(n))) / double(n - 1);
}

// Linear interpolation between the sorted values around fraction·(n − 1).
float percentile(const std::vector<float>& sorted, double fraction) {
  const double x = fraction * double(sorted.size() - 1);
  const size_t i = size_t(x);
  const double t = x - double(i);
  return float((1 - t) * sorted[i] + t * sorted[std::min(i + 1, sorted.size() - 1)]);
}

}  // namespace

void log_softmax(const float* logits, int64_t V, float* lp) {
  double mx = logits[0], sum = 0;
  for (int64_t i = 1; i < V; ++i) mx = std::max(mx, double(logits[i]));
  for (int64_t i = 0; i < V; ++i) sum += std::exp(double(logits[i]) - mx);
  const double lse = mx + std::log(sum);
  for (int64_t i = 0; i < V; ++i) lp[i] = float(double(logits[i]) - lse);
}

int32_t argmax(const float* v, int64_t V) { return int32_t(std::max_element(v, v + V) - v); }

RowEncoding parse_row_encoding(const std::string& name) {
  if (name == "f32") return RowEncoding::kF32;
  if (name == "u16") return RowEncoding::kU16;
  fail(cat("--logits-format: unknown format '", name, "' (expected f32 or u16)"));
}

const char* row_encoding_name(RowEncoding e) { return e == RowEncoding::kF32 ? "f32" : "u16"; }

double kl_divergence(const float* lp, const float* lq, int64_t V) {
  double kl = 0;
  for (int64_t i = 0; i < V; ++i) {
    const double q = std::exp(double(lq[i]));
    if (lp[i] == -std::numeric_limits<float>::infinity()) {
      kl += q;
      continue;
    }
    const double p = std::exp(double(lp[i])), d = double(lp[i]) - double(lq[i]);
    kl += std::fabs(d) < 1 ? p * (d + std::expm1(-d)) : p * (d - 1) + q;
  }
  return kl;
}

// ---- writer

LogitsWriter::LogitsWriter(const std::string& path, const LogitsFileInfo& info) : path_(path), info_(info) {
  DSV4_ASSERT(info.vocab > 0 && !info.ids.empty());
  std::vector<uint8_t> head;
  head.insert(head.end(), kMagic, kMagic + 8);
  put<uint32_t>(head, kVersion);
  put<uint32_t>(head, uint32_t(info.encoding));
  put<uint32_t>(head, uint32_t(info.vocab));
  put<uint32_t>(head, uint32_t(info.ctx));
  put<uint32_t>(head, uint32_t(info.windows));
  put<int32_t>(head, info.bos);
  put<uint64_t>(head, uint64_t(info.ids.size()));
  put_name(head, info.backend);
  put_name(head, info.numerics);
  DSV4_ASSERT(int64_t(head.size()) == kHeaderBytes);
  for (const int32_t id : info.ids) put<int32_t>(head, id);
  f_ = std::fopen(path.c_str(), "wb");
  DSV4_CHECK(f_ != nullptr, path, ": cannot open for writing");
  DSV4_CHECK(std::fwrite(head.data(), 1, head.size(), f_) == head.size(), path, ": write failed");
  buf_.resize(size_t(row_bytes(info.encoding, info.vocab)));
}

LogitsWriter::~LogitsWriter() {
  if (f_) std::fclose(f_);
}

void LogitsWriter::write_row(const float* lp, int32_t target) {
  DSV4_ASSERT(rows_ < int64_t(info_.ids.size()) && info_.ids[size_t(rows_)] == target);
  const int64_t V = info_.vocab;
  const int32_t top1 = argmax(lp, V);
  std::memcpy(buf_.data(), &top1, 4);
  std::memcpy(buf_.data() + 4, &lp[target], 4);
  if (info_.encoding == RowEncoding::kF32)
    std::memcpy(buf_.data() + 8, lp, size_t(4 * V));
  else
    encode_u16(lp, V, buf_.data() + 8);
  DSV4_CHECK(std::fwrite(buf_.data(), 1, buf_.size(), f_) == buf_.size(), path_, ": write failed");
  ++rows_;
}

void LogitsWriter::finish() {
  DSV4_ASSERT(rows_ == int64_t(info_.ids.size()));
  const int closed = std::fclose(f_);
  f_ = nullptr;
  DSV4_CHECK(closed == 0, path_, ": write failed");
}

int64_t LogitsWriter::bytes() const {
  const int64_t T = int64_t(info_.ids.size());
  return kHeaderBytes + 4 * T + T * row_bytes(info_.encoding, info_.vocab);
}

// ---- reader

LogitsReader::LogitsReader(const std::string& path) : path_(path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  DSV4_CHECK(!ec, path, ": cannot open (", ec.message(), ")");
  f_ = std::fopen(path.c_str(), "rb");
  DSV4_CHECK(f_ != nullptr, path, ": cannot open");
  const char* const kNotOurs = ": not a log-prob file of dsv4 perplexity --save-logits";
  uint8_t head[kHeaderBytes];
  DSV4_CHECK(size >= 8 && std::fread(head, 1, 8, f_) == 8 && std::memcmp(head, kMagic, 8) == 0, path, kNotOurs,
             " (no DSV4LOGP magic)");
  DSV4_CHECK(size >= uint64_t(kHeaderBytes), path, ": truncated: ", size, " bytes, shorter than the ", kHeaderBytes,
             "-byte header");
  DSV4_CHECK(std::fread(head + 8, 1, kHeaderBytes - 8, f_) == size_t(kHeaderBytes - 8), path, ": read failed");
  const uint8_t* p = head + 8;
  const uint32_t version = take<uint32_t>(p), encoding = take<uint32_t>(p);
  DSV4_CHECK(version == kVersion, path, ": format version ", version, ", this dsv4 reads version ", kVersion);
  DSV4_CHECK(encoding <= uint32_t(RowEncoding::kU16), path, kNotOurs, " (row encoding ", encoding, ")");
  info_.encoding = RowEncoding(encoding);
  info_.vocab = take<uint32_t>(p);
  info_.ctx = take<uint32_t>(p);
  info_.windows = take<uint32_t>(p);
  info_.bos = take<int32_t>(p);
  const uint64_t T = take<uint64_t>(p);
  info_.backend = take_name(p);
  info_.numerics = take_name(p);
  DSV4_CHECK(info_.vocab > 0 && info_.ctx >= 3 && info_.windows > 0 && T > 0, path, kNotOurs, " (vocab ", info_.vocab,
             ", ctx ", info_.ctx, ", ", info_.windows, " windows, ", T, " positions)");
  const uint64_t per_position = 4 + uint64_t(row_bytes(info_.encoding, info_.vocab));
  const uint64_t body = size - uint64_t(kHeaderBytes);
  DSV4_CHECK(T <= body / per_position && body == T * per_position, path, ": ",
             T <= body / per_position ? "has trailing bytes" : "truncated", ": ", size, " bytes where ", T,
             " positions of vocab ", info_.vocab, " (", row_encoding_name(info_.encoding), " rows) take ",
             uint64_t(kHeaderBytes) + T * per_position);
  info_.ids.resize(T);
  DSV4_CHECK(std::fread(info_.ids.data(), 4, T, f_) == T, path, ": read failed");
  buf_.resize(size_t(row_bytes(info_.encoding, info_.vocab)));
}

LogitsReader::~LogitsReader() {
  if (f_) std::fclose(f_);
}

BaseRow LogitsReader::read_row(float* lp) {
  DSV4_CHECK(std::fread(buf_.data(), 1, buf_.size(), f_) == buf_.size(), path_, ": read failed");
  BaseRow row;
  std::memcpy(&row.top1, buf_.data(), 4);
  std::memcpy(&row.lp_target, buf_.data() + 4, 4);
  if (info_.encoding == RowEncoding::kF32)
    std::memcpy(lp, buf_.data() + 8, size_t(4 * info_.vocab));
  else
    decode_u16(buf_.data() + 8, info_.vocab, lp);
  return row;
}

// ---- statistics

void KlStats::add(const float* base_lp, const BaseRow& base, const float* lp, int32_t target, int64_t V) {
  const double nll = -double(lp[target]), nll_base = -double(base.lp_target);
  sum_nll_ += nll;
  sum_nll2_ += nll * nll;
  sum_nll_base_ += nll_base;
  sum_nll_base2_ += nll_base * nll_base;
  sum_nll_nll_base_ += nll * nll_base;
  const double kld = kl_divergence(base_lp, lp, V);
  sum_kld_ += kld;
  sum_kld2_ += kld * kld;
  kld_.push_back(float(kld));
  const double p_diff = std::exp(-nll) - std::exp(-nll_base);
  sum_p_diff_ += p_diff;
  sum_p_diff2_ += p_diff * p_diff;
  sum_p_diff4_ += p_diff * p_diff * p_diff * p_diff;
  p_diff_.push_back(float(p_diff));
  same_top_ += argmax(lp, V) == base.top1;
  ++count_;
}

void KlStats::print(std::FILE* out) const {
  DSV4_ASSERT(count_ > 0);
  const int64_t n = count_;
  const Mean ln_ppl = mean_of(sum_nll_, sum_nll2_, n), ln_ppl_base = mean_of(sum_nll_base_, sum_nll_base2_, n);
  const double ppl = std::exp(ln_ppl.value), ppl_err = ppl * ln_ppl.error;
  const double ppl_base = std::exp(ln_ppl_base.value), ppl_base_err = ppl_base * ln_ppl_base.error;
  const double cov = covariance(sum_nll_, sum_nll_base_, sum_nll_nll_base_, n);
  const double ratio = ln_ppl.value - ln_ppl_base.value;
  const double ratio_err =
      std::sqrt(std::max(0.0, ln_ppl.error * ln_ppl.error + ln_ppl_base.error * ln_ppl_base.error - 2 * cov));
  const double diff_err =
      std::sqrt(std::max(0.0, ppl_err * ppl_err + ppl_base_err * ppl_base_err - 2 * ppl * ppl_base * cov));
  std::fprintf(out, "\n====== Perplexity statistics ======\n");
  std::fprintf(out, "Mean PPL(Q)                   : %10.6f ± %10.6f\n", ppl, ppl_err);
  std::fprintf(out, "Mean PPL(base)                : %10.6f ± %10.6f\n", ppl_base, ppl_base_err);
  if (ln_ppl.error > 0 && ln_ppl_base.error > 0)
    std::fprintf(out, "Cor(ln(PPL(Q)), ln(PPL(base))): %9.5f%%\n", 100 * cov / (ln_ppl.error * ln_ppl_base.error));
  std::fprintf(out, "Mean ln(PPL(Q)/PPL(base))     : %+.6e ± %.6e\n", ratio, ratio_err);
  std::fprintf(out, "Mean PPL(Q)/PPL(base)         : %10.6f ± %10.6f\n", std::exp(ratio), std::exp(ratio) * ratio_err);
  std::fprintf(out, "Mean PPL(Q)-PPL(base)         : %+10.6f ± %10.6f  (%+.4f%%)\n", ppl - ppl_base, diff_err,
               100 * (ppl / ppl_base - 1));

  std::vector<float> kld = kld_, p_diff = p_diff_;
  std::sort(kld.begin(), kld.end());
  std::sort(p_diff.begin(), p_diff.end());
  const Mean kl = mean_of(sum_kld_, sum_kld2_, n);
  std::fprintf(out, "\n====== KL divergence statistics ======\n");
  std::fprintf(out, "Mean    KLD: %.6e ± %.6e\n", kl.value, kl.error);
  std::fprintf(out, "Maximum KLD: %.6e\n", double(kld.back()));
  for (const double f : {0.999, 0.99, 0.95, 0.90})
    std::fprintf(out, "%4.1f%%   KLD: %.6e\n", 100 * f, double(percentile(kld, f)));
  std::fprintf(out, "Median  KLD: %.6e\n", double(percentile(kld, 0.5)));
  for (const double f : {0.10, 0.05, 0.01, 0.001})
    std::fprintf(out, "%4.1f%%   KLD: %.6e\n", 100 * f, double(percentile(kld, f)));
  std::fprintf(out, "Minimum KLD: %.6e\n", double(kld.front()));

  const Mean dp = mean_of(sum_p_diff_, sum_p_diff2_, n), dp2 = mean_of(sum_p_diff2_, sum_p_diff4_, n);
  const double rms = std::sqrt(dp2.value), rms_err = rms > 0 ? 0.5 / rms * dp2.error : 0.0;
  std::fprintf(out, "\n====== Token probability statistics ======\n");
  std::fprintf(out, "Mean    Δp: %+.5f ± %.5f %%\n", 100 * dp.value, 100 * dp.error);
  std::fprintf(out, "Maximum Δp: %+.5f %%\n", 100 * double(p_diff.back()));
  for (const double f : {0.999, 0.99, 0.95, 0.90, 0.75})
    std::fprintf(out, "%4.1f%%   Δp: %+.5f %%\n", 100 * f, 100 * double(percentile(p_diff, f)));
  std::fprintf(out, "Median  Δp: %+.5f %%\n", 100 * double(percentile(p_diff, 0.5)));
  for (const double f : {0.25, 0.10, 0.05, 0.01, 0.001})
    std::fprintf(out, "%4.1f%%   Δp: %+.5f %%\n", 100 * f, 100 * double(percentile(p_diff, f)));
  std::fprintf(out, "Minimum Δp: %+.5f %%\n", 100 * double(p_diff.front()));
  std::fprintf(out, "RMS Δp    : %.5f ± %.5f %%\n", 100 * rms, 100 * rms_err);
  const double top = double(same_top_) / double(n);
  const double top_err = n > 1 ? std::sqrt(top * (1 - top) / double(n - 1)) : 0.0;
  std::fprintf(out, "Same top p: %.3f ± %.3f %%\n", 100 * top, 100 * top_err);
}

}  // namespace dsv4::cli
