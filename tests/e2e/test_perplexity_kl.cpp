// dsv4 perplexity --save-logits / --kl-divergence on the shipped tiny model, CPU backend: the same numerics
// compare at KL 0; exact against reference gives a small KL and the perplexities plain runs print; the mean KL
// equals one computed here from `dsv4 logits`; broken or mismatched files end in a one-line error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>

#include "harness/files.h"
#include "harness/perplexity.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::test {
namespace {

constexpr int64_t kVocab = 4096;         // models/tiny
constexpr size_t kHeaderBytes = 72;      // the file format of tools/dsv4/kl_divergence.h
constexpr size_t kVocabOffset = 16;      // u32 vocab after magic, version, encoding
constexpr size_t kPositionsOffset = 32;  // u64 positions


// The first `bytes` bytes of the held-out text, cut at a space.
std::string heldout_prefix(size_t bytes) {
  const std::string text = read_text(tiny_model_dir() + "/heldout.txt");
  return text.substr(0, text.rfind(' ', bytes));
}

template <class T>
T at(const std::string& bytes, size_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof v);
  return v;
}

TEST(PerplexityKl, SameNumericsCompareAtZero) {
  TempDir tmp;
  const std::string text = tmp.file("text.txt"), base = tmp.file("base.lgp");
  write_text(text, heldout_prefix(400));
  const CliResult saved = perplexity(text, "exact", {"--ctx", "64", "--save-logits", base});
  ASSERT_EQ(saved.exit_code, 0) << saved.err;
  const CliResult r = perplexity(text, "exact", {"--kl-divergence", base});  // --ctx 64 comes from the file
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ppl_line(r.out), ppl_line(saved.out));
  EXPECT_EQ(report_field(r.out, "Mean    KLD"), 0.0) << r.out;
  EXPECT_EQ(report_field(r.out, "Maximum KLD"), 0.0) << r.out;
  EXPECT_EQ(report_field(r.out, "Same top p"), 100.0) << r.out;
  EXPECT_EQ(report_field(r.out, "Mean PPL(Q)-PPL(base)"), 0.0) << r.out;
  EXPECT_EQ(report_field(r.out, "Mean ln(PPL(Q)/PPL(base))"), 0.0) << r.out;
  EXPECT_EQ(report_field(r.out, "RMS Δp"), 0.0) << r.out;

  // The header as documented: magic, version 1, f32 rows, vocab, ctx, T positions; then ids and T rows.
  const std::string bytes = read_text(base);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(saved.out, m, std::regex(R"(over ([0-9]+) tokens)")));
  const uint64_t T = std::stoull(m[1]);
  EXPECT_EQ(bytes.substr(0, 8), "DSV4LOGP");
  EXPECT_EQ(at<uint32_t>(bytes, 8), 1u);
  EXPECT_EQ(at<uint32_t>(bytes, 12), 0u);
  EXPECT_EQ(at<uint32_t>(bytes, kVocabOffset), uint32_t(kVocab));
  EXPECT_EQ(at<uint32_t>(bytes, 20), 64u);
  EXPECT_EQ(at<uint64_t>(bytes, kPositionsOffset), T);
  EXPECT_EQ(bytes.size(), kHeaderBytes + 4 * T + T * (8 + 4 * kVocab));
}

// u16 rows: half the size; the base perplexity and top-1 stay exact, the KL is only the 16-bit rounding's.
TEST(PerplexityKl, U16RowsAddOnlyTheirRounding) {
  TempDir tmp;
  const std::string text = tmp.file("text.txt"), base16 = tmp.file("base16.lgp");
  write_text(text, heldout_prefix(400));
  const CliResult saved16 =
      perplexity(text, "exact", {"--ctx", "64", "--save-logits", base16, "--logits-format", "u16"});
  ASSERT_EQ(saved16.exit_code, 0) << saved16.err;
  const uint64_t T = at<uint64_t>(read_text(base16), kPositionsOffset);
  EXPECT_EQ(read_text(base16).size(), kHeaderBytes + 4 * T + T * (16 + 2 * kVocab));
  const CliResult r16 = perplexity(text, "exact", {"--kl-divergence", base16});
  ASSERT_EQ(r16.exit_code, 0) << r16.err;
  EXPECT_EQ(report_field(r16.out, "Mean PPL(Q)-PPL(base)"), 0.0) << r16.out;
  EXPECT_EQ(report_field(r16.out, "Same top p"), 100.0) << r16.out;
  EXPECT_GT(report_field(r16.out, "Mean    KLD"), 0.0) << r16.out;
  EXPECT_LT(report_field(r16.out, "Maximum KLD"), 1e-7) << r16.out;
}

TEST(PerplexityKl, ExactAgainstReferenceReportsBothPlainPerplexities) {
  TempDir tmp;
  const std::string text = tmp.file("text.txt"), base = tmp.file("exact.lgp");
  write_text(text, heldout_prefix(500));
  const CliResult exact = perplexity(text, "exact", {"--ctx", "96"});
  const CliResult reference = perplexity(text, "reference", {"--ctx", "96"});
  ASSERT_EQ(exact.exit_code, 0) << exact.err;
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  ASSERT_EQ(perplexity(text, "exact", {"--ctx", "96", "--save-logits", base}).exit_code, 0);
  const CliResult r = perplexity(text, "reference", {"--kl-divergence", base});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ppl_line(r.out), ppl_line(reference.out));
  // Plain runs print 4 decimals; the report 6.
  EXPECT_NEAR(report_field(r.out, "Mean PPL(Q)"), ppl_of(reference.out), 0.5e-4 + 1e-9) << r.out;
  EXPECT_NEAR(report_field(r.out, "Mean PPL(base)"), ppl_of(exact.out), 0.5e-4 + 1e-9) << r.out;
  const double kl = report_field(r.out, "Mean    KLD");
  EXPECT_GT(kl, 1e-7) << r.out;
  EXPECT_LT(kl, 5e-3) << r.out;
  EXPECT_GE(report_field(r.out, "Same top p"), 97.0) << r.out;
  EXPECT_LT(std::fabs(report_field(r.out, "Mean PPL(Q)/PPL(base)") - 1), 0.01) << r.out;
  EXPECT_GE(report_field(r.out, "99.0%   KLD"), report_field(r.out, "Median  KLD")) << r.out;
  EXPECT_GE(report_field(r.out, "Maximum KLD"), report_field(r.out, "99.0%   KLD")) << r.out;
}

// KL(exact ‖ reference), both perplexities and top-1 agreement from `dsv4 logits` of [BOS] + the text's ids.
TEST(PerplexityKl, MeanKlMatchesOneComputedFromLogits) {
  TempDir tmp;
  const std::string text = tmp.file("text.txt"), base = tmp.file("exact.lgp");
  const std::string prefix = heldout_prefix(240);
  write_text(text, prefix);
  const Tokenizer tok = Tokenizer::from_file(tiny_model_dir());
  std::vector<int32_t> window = {*tok.bos_id()};
  const std::vector<int32_t> ids = tok.encode(prefix);
  window.insert(window.end(), ids.begin(), ids.end());
  ASSERT_GE(ids.size(), 20u);
  ASSERT_LT(window.size(), 256u);  // one window at the default --ctx
  std::vector<std::vector<float>> logits;
  for (const std::string numerics : {"exact", "reference"}) {
    const std::string out = tmp.file(numerics + ".f32");
    const CliResult r = run_cli({"logits", "--tokens", join_ids(window, window.size()), "--out", out, "--backend",
                                 "cpu", "--numerics", numerics});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    logits.push_back(read_f32(out));
    ASSERT_EQ(logits.back().size(), window.size() * kVocab);
  }
  double kl_sum = 0, nll_p = 0, nll_q = 0;
  size_t same_top = 0;
  const size_t n = ids.size();
  for (size_t j = 0; j < n; ++j) {  // row j predicts window[j + 1]
    std::vector<double> lp(kVocab), lq(kVocab);
    for (int side = 0; side < 2; ++side) {
      const float* row = logits[size_t(side)].data() + j * kVocab;
      std::vector<double>& l = side == 0 ? lp : lq;
      const double mx = *std::max_element(row, row + kVocab);
      double sum = 0;
      for (int64_t i = 0; i < kVocab; ++i) sum += std::exp(row[i] - mx);
      for (int64_t i = 0; i < kVocab; ++i) l[size_t(i)] = row[i] - mx - std::log(sum);
    }
    for (int64_t i = 0; i < kVocab; ++i) kl_sum += std::exp(lp[size_t(i)]) * (lp[size_t(i)] - lq[size_t(i)]);
    nll_p -= lp[size_t(window[j + 1])];
    nll_q -= lq[size_t(window[j + 1])];
    same_top +=
        std::max_element(lp.begin(), lp.end()) - lp.begin() == std::max_element(lq.begin(), lq.end()) - lq.begin();
  }
  ASSERT_EQ(perplexity(text, "exact", {"--save-logits", base}).exit_code, 0);
  const CliResult r = perplexity(text, "reference", {"--kl-divergence", base});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The file holds the text's ids.
  const std::string bytes = read_text(base);
  ASSERT_EQ(at<uint64_t>(bytes, kPositionsOffset), n);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(at<int32_t>(bytes, kHeaderBytes + 4 * i), ids[i]) << i;

  const double kl = kl_sum / double(n);
  EXPECT_GT(kl, 0);
  EXPECT_NEAR(report_field(r.out, "Mean    KLD"), kl, 1e-5 * kl) << r.out;  // 7 digits printed
  EXPECT_NEAR(report_field(r.out, "Mean PPL(base)"), std::exp(nll_p / double(n)), 1e-5) << r.out;
  EXPECT_NEAR(report_field(r.out, "Mean PPL(Q)"), std::exp(nll_q / double(n)), 1e-5) << r.out;
  EXPECT_NEAR(report_field(r.out, "Same top p"), 100.0 * double(same_top) / double(n), 1e-3) << r.out;
}

void expect_error(const CliResult& r, const std::string& words) {
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_EQ(r.signal, 0);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;  // one line
  EXPECT_NE(r.err.find(words), std::string::npos) << "expected '" << words << "' in: " << r.err;
}

TEST(PerplexityKl, BrokenOrMismatchedFilesEndInOneLineErrors) {
  TempDir tmp;
  const std::string text = tmp.file("text.txt"), other = tmp.file("other.txt"), shorter = tmp.file("shorter.txt");
  const std::string base = tmp.file("base.lgp"), bad = tmp.file("bad.lgp");
  write_text(text, heldout_prefix(400));
  write_text(shorter, heldout_prefix(300));
  write_text(other, "It was the best of times, it was the worst of times, it was the age of wisdom.");
  ASSERT_EQ(perplexity(text, "exact", {"--ctx", "32", "--save-logits", base}).exit_code, 0);
  const std::string good = read_text(base);

  write_text(bad, good.substr(0, good.size() - 100));
  expect_error(perplexity(text, "exact", {"--kl-divergence", bad}), "truncated");
  write_text(bad, good.substr(0, 40));
  expect_error(perplexity(text, "exact", {"--kl-divergence", bad}), "truncated");
  write_text(bad, good + "x");
  expect_error(perplexity(text, "exact", {"--kl-divergence", bad}), "trailing bytes");
  write_text(bad, "ELF and then some bytes that are not a log-prob file at all");
  expect_error(perplexity(text, "exact", {"--kl-divergence", bad}), "not a log-prob file");
  expect_error(perplexity(text, "exact", {"--kl-divergence", tmp.file("missing.lgp")}), "cannot open");

  // Another vocabulary: the same header and ids, vocab 4000, rows sized for it.
  {
    std::string v = good.substr(0, kHeaderBytes);
    const uint32_t vocab = 4000;
    std::memcpy(v.data() + kVocabOffset, &vocab, 4);
    const uint64_t T = at<uint64_t>(good, kPositionsOffset);
    v += good.substr(kHeaderBytes, 4 * T) + std::string(T * (8 + 4 * vocab), '\0');
    write_text(bad, v);
    expect_error(perplexity(text, "exact", {"--kl-divergence", bad}), "saved with vocab 4000");
  }

  expect_error(perplexity(other, "exact", {"--kl-divergence", base}), "the text (or tokenizer) differs");
  expect_error(perplexity(shorter, "exact", {"--kl-divergence", base}), "this run scores");
  expect_error(perplexity(text, "exact", {"--kl-divergence", base, "--ctx", "64"}), "saved with --ctx 32");
  expect_error(perplexity(text, "exact", {"--kl-divergence", base, "--save-logits", bad}), "choose one");
}

}  // namespace
}  // namespace dsv4::test
