// End-to-end numerics of the CPU reference against golden logits:
//  * tests/data/reference/ref-small, computed by DeepSeek's own inference code (both numerics, MTP);
//  * tests/data/golden/*, computed by transformers' DeepseekV4ForCausalLM (exact numerics).
// Every check runs through the dsv4 CLI (logits / generate), for whole-prompt prefill, token-by-token
// decode (--step 1) and odd chunkings (--step 7), so the incremental state is exercised against the oracle.
// Every test runs on each backend: cpu, and cuda (reported skipped without a GPU), with the same tolerances.
//
// Tolerances: exact numerics 1e-3 absolute on logits (fp32 end to end, observed ~2e-5; the slack covers
// summation-order differences across compilers; on CUDA an isolated row may flip a top-k near-tie, see
// expect_exact_agreement). Reference numerics as the fixture README states: FP8/FP4
// rounding-boundary flips are legitimate, so prompts ≤ 33 tokens agree within 1e-2 and longer prompts must
// keep the same top-1 token at ≥ 90% of positions (an engine without the simulation gets ~0% within 1e-2).
//
// CUDA in reference numerics meets a rounding tie that the CPU does not: every CUDA op matches the CPU within
// 1.3e-6 from equal inputs and the simulations are bit-exact (tests/cuda/test_conformance.cpp), but this
// prompt has one e4m3 midpoint among its simulated values — layer 0, position 24, KV channel 54: q =
// 151.999985 on the CPU (as in DeepSeek's run) rounds to 144, q = 152.0 on CUDA (one ulp of summation order
// away) rounds to 160 (measured on an H200, 2026-11-21). From there CUDA follows another, equally valid,
// rounding path, so for CUDA the 1e-2 bound covers the positions before the tie and the long-prompt top-1
// bound is 85% (measured: 89.7% over 300 positions).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "harness/compare.h"
#include "harness/fixture.h"
#include "harness/files.h"
#include "harness/gpu_skip.h"

namespace dsv4::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::vector<std::string> kBackends = {"cpu", "cuda"};

size_t argmax_row(const std::vector<float>& v, size_t row, int64_t vocab) {
  size_t best = 0;
  for (size_t i = 1; i < size_t(vocab); ++i)
    if (v[row * vocab + i] > v[row * vocab + best]) best = i;
  return best;
}

// Fraction of rows whose argmax agrees.
double top1_agreement(const std::vector<float>& got, const std::vector<float>& want, int64_t vocab) {
  const size_t rows = want.size() / size_t(vocab);
  size_t same = 0;
  for (size_t r = 0; r < rows; ++r) same += argmax_row(got, r, vocab) == argmax_row(want, r, vocab);
  return double(same) / double(rows);
}

// ref-small's first simulated value on a rounding midpoint, where CUDA rounds the other way (header).
constexpr size_t kCudaTieFreeRows = 24;

std::vector<float> first_rows(const std::vector<float>& v, size_t rows, int64_t vocab) {
  return std::vector<float>(v.begin(), v.begin() + long(std::min(v.size(), rows * size_t(vocab))));
}

void expect_reference_agreement(const std::vector<float>& got, const std::vector<float>& want, size_t len,
                                int64_t vocab, const std::string& what, bool cuda = false) {
  ASSERT_EQ(got.size(), want.size()) << what;
  if (cuda) {
    EXPECT_TRUE(compare(first_rows(got, kCudaTieFreeRows, vocab), first_rows(want, kCudaTieFreeRows, vocab),
                        {1e-2, 0.0}, what + ", positions before the tie"));
    if (len > 33) EXPECT_GE(top1_agreement(got, want, vocab), 0.85) << what;
  } else if (len <= 33) {
    EXPECT_TRUE(compare(got, want, {1e-2, 0.0}, what));
  } else {
    EXPECT_GE(top1_agreement(got, want, vocab), 0.90) << what;
  }
}

// ---------------------------------------------------------------- ref-small (DeepSeek's own code)

class RefSmall : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (backend() == "cuda") DSV4_REQUIRE_GPU();
    ASSERT_TRUE(fs::exists(ref_small_dir())) << "missing fixture " << ref_small_dir();
    f_ = open_fixture(ref_small_dir());
    lens_ = f_.index["lens"].get<std::vector<size_t>>();
  }
  std::vector<float> want(const std::string& kind, size_t len) const {
    return read_f32(f_.dir + "/logits/" + kind + "_" + std::to_string(len) + ".f32");
  }
  const std::string& backend() const { return GetParam(); }
  std::vector<float> logits(size_t len, const std::string& numerics, int step, bool mtp = false) const {
    return run_logits(backend(), f_, len, numerics, step, mtp);
  }
  Fixture f_;
  std::vector<size_t> lens_;
};

TEST_P(RefSmall, ExactPrefillMatches) {
  for (size_t len : lens_)
    EXPECT_TRUE(compare(logits(len, "exact", 64), want("exact", len), {1e-3, 0.0}, "exact_" + std::to_string(len)));
}

TEST_P(RefSmall, ExactTokenByTokenMatches) {
  for (size_t len : lens_)
    EXPECT_TRUE(compare(logits(len, "exact", 1), want("exact", len), {1e-3, 0.0}, "exact_" + std::to_string(len)));
}

TEST_P(RefSmall, ReferencePrefillMatches) {
  for (size_t len : lens_)
    expect_reference_agreement(logits(len, "reference", 64), want("reference", len), len, f_.vocab,
                               "reference_" + std::to_string(len), backend() == "cuda");
}

TEST_P(RefSmall, ReferenceOddChunksMatch) {
  for (size_t len : lens_)
    expect_reference_agreement(logits(len, "reference", 7), want("reference", len), len, f_.vocab,
                               "reference_" + std::to_string(len) + " in steps of 7", backend() == "cuda");
}

TEST_P(RefSmall, DecodeEqualsPrefill) {
  // The same sequence consumed one token at a time and in one step must give the same logits. CPU: the same
  // fp32 loops. CUDA: fp32 GEMV (decode) vs fp32 tiles (prefill) differ in summation order, which in reference
  // numerics may flip a rounding tie (header), so the fixture's reference-numerics rule applies.
  const size_t len = lens_.back();
  const bool cuda = backend() == "cuda";
  EXPECT_TRUE(compare(logits(len, "exact", 1), logits(len, "exact", 64), {cuda ? 2e-4 : 1e-5, 0.0}, "exact"));
  if (cuda)
    expect_reference_agreement(logits(len, "reference", 1), logits(len, "reference", 64), len, f_.vocab, "reference",
                               cuda);
  else
    EXPECT_TRUE(compare(logits(len, "reference", 1), logits(len, "reference", 64), {1e-5, 0.0}, "reference"));
}

TEST_P(RefSmall, MtpDraftLogitsMatch) {
  const size_t len = lens_.back();
  const std::vector<float> got = logits(len, "reference", 64, /*mtp=*/true);
  const std::vector<float> want_mtp = read_f32(f_.dir + "/logits/mtp_reference.f32");
  ASSERT_EQ(got.size(), want_mtp.size());
  // Row j reads the main model at positions ≤ j + 1: on CUDA the rows before the tie (header).
  const bool cuda = backend() == "cuda";
  const size_t short_rows = cuda ? kCudaTieFreeRows - 1 : 32;
  EXPECT_TRUE(compare(first_rows(got, short_rows, f_.vocab), first_rows(want_mtp, short_rows, f_.vocab), {1e-2, 0.0},
                      "mtp"));
  EXPECT_GE(top1_agreement(got, want_mtp, f_.vocab), cuda ? 0.85 : 0.90);
}

TEST_P(RefSmall, GreedyContinuationMatches) {
  const size_t plen = f_.index["greedy_prompt_len"].get<size_t>();
  for (const char* numerics : {"exact", "reference"}) {
    const auto seq = f_.index[std::string("greedy_sequence_") + numerics].get<std::vector<int32_t>>();
    const std::vector<int32_t> prompt(seq.begin(), seq.begin() + long(plen));
    const std::vector<int32_t> expected(seq.begin() + long(plen), seq.end());
    std::vector<int32_t> got = run_greedy(backend(), f_, prompt, expected.size(), numerics);
    // CUDA, reference: the prompt crosses the tie at position 24 (header); the continuation must start as
    // DeepSeek's (measured: the first 14 tokens agree) and may then follow its own rounding path.
    const bool diverges = backend() == "cuda" && std::string(numerics) == "reference";
    const size_t checked = diverges ? 8 : expected.size();
    ASSERT_GE(got.size(), checked) << numerics;
    EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + long(checked)),
              std::vector<int32_t>(expected.begin(), expected.begin() + long(checked)))
        << numerics;
    if (!diverges) EXPECT_EQ(got.size(), expected.size()) << numerics;
  }
}

// ---------------------------------------------------------------- tests/data/golden (transformers)

TEST(GoldenSet, FixturesArePresent) { EXPECT_GE(golden_dirs().size(), 3u) << "tests/data/golden has too few fixtures"; }

INSTANTIATE_TEST_SUITE_P(Backends, RefSmall, ::testing::ValuesIn(kBackends));

class Golden : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  void SetUp() override {
    if (backend() == "cuda") DSV4_REQUIRE_GPU();
  }
  const std::string& dir() const { return std::get<0>(GetParam()); }
  const std::string& backend() const { return std::get<1>(GetParam()); }
};

// Exact numerics against transformers: every row within 1e-3 — except, on CUDA, isolated rows of a flipped
// discrete choice. CUDA's fp32 sums run in other orders than the CPU's, and a top-k whose k-th and
// (k+1)-th candidates score within those orders' last bits (the indexer's top-k, the router's) can pick the
// other one: that query's row then moves by O(0.1) while the rows around it still agree to ~1e-5. Measured
// on an H200 (2026-11-21), v4-hd512-w128, 700 tokens in steps of 7: only row 385 of 700 beyond 1e-4, by
// 0.066 (the CPU agrees with transformers there to 2e-5; an unrelated change of GEMM summation order flipped
// the same row before). So on CUDA at most one row in 500 (at least one) may exceed 1e-3, by at most 0.2;
// every other row keeps 1e-3.
void expect_exact_agreement(const std::vector<float>& got, const std::vector<float>& want, int64_t vocab,
                            bool cuda, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  if (!cuda) {
    EXPECT_TRUE(compare(got, want, {1e-3, 0.0}, what));
    return;
  }
  const size_t rows = want.size() / size_t(vocab);
  std::vector<float> kept_got, kept_want;
  std::vector<size_t> flipped;
  for (size_t r = 0; r < rows; ++r) {
    const auto g = got.begin() + long(r * size_t(vocab)), w = want.begin() + long(r * size_t(vocab));
    double worst = 0.0;
    for (int64_t i = 0; i < vocab; ++i) worst = std::max(worst, double(std::fabs(g[i] - w[i])));
    if (worst > 1e-3 && worst <= 0.2) {
      flipped.push_back(r);
      continue;
    }
    kept_got.insert(kept_got.end(), g, g + vocab);
    kept_want.insert(kept_want.end(), w, w + vocab);
  }
  EXPECT_LE(flipped.size(), std::max<size_t>(1, rows / 500)) << what << ": too many rows beyond 1e-3";
  for (size_t r : flipped) std::printf("%s: row %zu beyond 1e-3 (a flipped top-k near-tie)\n", what.c_str(), r);
  EXPECT_TRUE(compare(kept_got, kept_want, {1e-3, 0.0}, what + ", rows other than the flipped ones"));
}

TEST_P(Golden, ExactLogitsMatchTransformers) {
  const Fixture f = open_fixture(dir());
  const bool cuda = backend() == "cuda";
  for (size_t len : f.index["lens"].get<std::vector<size_t>>()) {
    const std::vector<float> want = read_f32(f.dir + "/logits/exact_" + std::to_string(len) + ".f32");
    const std::string name = "exact_" + std::to_string(len);
    expect_exact_agreement(run_logits(backend(), f, len, "exact", 64), want, f.vocab, cuda, "prefill " + name);
    // Token by token for the shorter prompts (cost grows with length), odd chunks for all.
    if (len <= 129) expect_exact_agreement(run_logits(backend(), f, len, "exact", 1), want, f.vocab, cuda, "decode " + name);
    expect_exact_agreement(run_logits(backend(), f, len, "exact", 7), want, f.vocab, cuda, "steps of 7 " + name);
  }
}

TEST_P(Golden, GreedyContinuationMatchesTransformers) {
  const Fixture f = open_fixture(dir());
  // "greedy" from a 40-token prompt; "greedy_long" decodes across the 128-token HCA boundary.
  for (const std::string kind : {"greedy", "greedy_long"}) {
    if (!f.index.contains(kind + "_prompt_len")) continue;
    const size_t plen = f.index[kind + "_prompt_len"].get<size_t>();
    const auto seq = f.index[kind + "_sequence_exact"].get<std::vector<int32_t>>();
    const std::vector<int32_t> prompt(seq.begin(), seq.begin() + long(plen));
    const std::vector<int32_t> expected(seq.begin() + long(plen), seq.end());
    EXPECT_EQ(run_greedy(backend(), f, prompt, expected.size(), "exact"), expected) << kind;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Golden, ::testing::Combine(::testing::ValuesIn(golden_dirs()), ::testing::ValuesIn(kBackends)),
                         [](const ::testing::TestParamInfo<Golden::ParamType>& info) {
                           std::string name = fs::path(std::get<0>(info.param)).filename().string() + "_" +
                                              std::get<1>(info.param);
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Golden);

}  // namespace
}  // namespace dsv4::test
