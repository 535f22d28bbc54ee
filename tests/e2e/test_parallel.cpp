// The model split over ranks (model/parallel.h) computes what one rank computes: every fixture's logits with
// --tp 2, --ep 2 and --tp 2 --ep 2 against the fixture and against one rank, prefill and token by token, and
// greedy continuations identical. On cpu the ranks are in-process threads summing over host memory; on cuda
// one GPU each, joined by NCCL (skipped, visibly, with fewer than 2 GPUs).
//
// Tolerances: exact numerics as test_golden (1e-3 against the fixtures: fp32 end to end). Against one rank
// 1e-4: only the order of the sums changes (each rank's partial output projection and MoE, then their sum;
// observed ≤ 2e-6 on cpu).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>

#include "harness/compare.h"
#include "harness/files.h"
#include "harness/fixture.h"
#include "harness/gpu_skip.h"
#include "harness/perplexity.h"

namespace dsv4::test {
namespace {

namespace fs = std::filesystem;
using Split = std::vector<std::string>;

const std::vector<Split> kSplits = {{"--tp", "2"}, {"--ep", "2"}, {"--tp", "2", "--ep", "2"}};

std::string name_of(const Split& s) {
  std::string n;
  for (const std::string& a : s) n += (n.empty() ? "" : " ") + a;
  return n;
}

class Sharded : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  void SetUp() override {
    if (backend() == "cuda") DSV4_REQUIRE_GPUS(2);
    f_ = open_fixture(dir());
  }
  const std::string& dir() const { return std::get<0>(GetParam()); }
  const std::string& backend() const { return std::get<1>(GetParam()); }
  Fixture f_;
};

TEST_P(Sharded, ExactLogitsMatchOneRankAndTheFixture) {
  for (size_t len : f_.index["lens"].get<std::vector<size_t>>()) {
    const std::string kind = "exact_" + std::to_string(len);
    const std::vector<float> want = read_f32(f_.dir + "/logits/" + kind + ".f32");
    // Token by token for the shorter prompts (cost grows with length), as test_golden.
    for (int step : len <= 129 ? std::vector<int>{64, 1} : std::vector<int>{64}) {
      const std::vector<float> one = run_logits(backend(), f_, len, "exact", step);
      for (const Split& split : kSplits) {
        const std::string what = name_of(split) + ", " + kind + ", step " + std::to_string(step);
        const std::vector<float> got = run_logits(backend(), f_, len, "exact", step, false, split);
        EXPECT_TRUE(compare(got, want, {1e-3, 0.0}, what + " against the fixture"));
        EXPECT_TRUE(compare(got, one, {1e-4, 0.0}, what + " against one rank"));
      }
    }
  }
}

TEST_P(Sharded, GreedyContinuationIsIdentical) {
  const size_t plen = f_.index.contains("greedy_prompt_len") ? f_.index["greedy_prompt_len"].get<size_t>() : 16;
  const std::vector<int32_t> prompt(f_.prompt.begin(), f_.prompt.begin() + long(plen));
  const std::vector<int32_t> one = run_greedy(backend(), f_, prompt, 24, "exact");
  ASSERT_EQ(one.size(), 24u);
  for (const Split& split : kSplits)
    EXPECT_EQ(run_greedy(backend(), f_, prompt, 24, "exact", split), one) << name_of(split);
}

// A seeded draw over ranks that each hold part of the vocabulary (the row gathered from them on the host) is
// the one rank's (drawn where the logits are). Top-k 20 keeps the candidates few, so that the ranks' sums in
// another order (≤ 1e-6 in the logits) cannot move a boundary of the draw past its point.
TEST_P(Sharded, SampledContinuationIsIdentical) {
  const std::vector<int32_t> prompt(f_.prompt.begin(), f_.prompt.begin() + 16);
  const std::vector<std::string> sampling = {"--temperature", "0.9", "--top-k", "20", "--top-p", "0.95",
                                             "--presence-penalty", "0.5", "--seed", "7"};
  const std::vector<int32_t> one = run_sampled(backend(), f_, prompt, 24, "exact", sampling);
  ASSERT_EQ(one.size(), 24u);
  EXPECT_NE(one, run_greedy(backend(), f_, prompt, 24, "exact")) << "the draw must not be the greedy path";
  for (const Split& split : kSplits)
    EXPECT_EQ(run_sampled(backend(), f_, prompt, 24, "exact", sampling, split), one) << name_of(split);
}

std::vector<std::string> fixture_dirs() {
  std::vector<std::string> dirs = golden_dirs();
  dirs.push_back(ref_small_dir());  // FP8 and FP4 weights: slices inside and across their scale blocks
  return dirs;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Sharded,
                         ::testing::Combine(::testing::ValuesIn(fixture_dirs()), ::testing::Values("cpu", "cuda")),
                         [](const ::testing::TestParamInfo<Sharded::ParamType>& info) {
                           std::string name = fs::path(std::get<0>(info.param)).filename().string() + "_" +
                                              std::get<1>(info.param);
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

// The MTP block splits like a layer: its draft logits match one rank's.
TEST(ShardedMtp, DraftLogitsMatchOneRank) {
  const Fixture f = open_fixture(ref_small_dir());
  const size_t len = f.index["lens"].get<std::vector<size_t>>().back();
  const std::vector<float> one = run_logits("cpu", f, len, "exact", 64, /*mtp=*/true);
  ASSERT_FALSE(one.empty());
  for (const Split& split : kSplits)
    EXPECT_TRUE(compare(run_logits("cpu", f, len, "exact", 64, true, split), one, {1e-4, 0.0}, name_of(split)));
}

// Fast numerics on a trained model (models/tiny, ~500 held-out tokens): the ranks round each sub-block's sum
// once, where one rank rounds it (Ops::linear_partial, Ops::moe_partial), so against one rank (dsv4 perplexity
// --kl-divergence) whole experts per rank leave only the fp32 order of the sums — KL 0 measured over 2040
// positions for --ep 2, 4.0e-5 for --tp 2 --ep 2 (issue 25 asks ≤ 1e-4) — while experts split by width
// (--tp 2) round each rank's share of every expert's output before the sum: 4.9e-4 measured, about fast
// numerics' own distance from reference (4.8e-4); bounded at twice that (a ceiling: the old rounding passed it
// too; the whole-expert cases are the ones the change moved, from 1.3e-4 and 2.4e-4). On cuda, one GPU a rank,
// --ep 2 runs one GPU's kernels on each expert (measured 0); --tp 2 --ep 2 also changes kernel shapes (wo_b's K,
// a rank's heads), so its sums run in other orders and a flipped bf16 or e4m3 rounding spreads: held to 5e-4,
// the bound of test_fast_gate.cpp for such reorderings (one GPU against itself at --step 7: 2.0e-4 on
// models/tiny's held-out text, H200, 2026-11-29).
class ShardedFast : public ::testing::TestWithParam<std::string> {};

TEST_P(ShardedFast, RanksRoundTheirSumOnce) {
  const std::string backend = GetParam();
  if (backend == "cuda") DSV4_REQUIRE_GPUS(2);
  TempDir tmp;
  const std::string text = tmp.file("text.txt"), base = tmp.file("one.lgp");
  const std::string heldout = read_text(tiny_model_dir() + "/heldout.txt");
  write_text(text, heldout.substr(0, heldout.rfind(' ', 2400)));
  const CliResult one = perplexity_on(backend, text, "fast", {"--ctx", "128", "--save-logits", base});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const double reordered = backend == "cpu" ? 1e-4 : 5e-4;
  const std::pair<Split, double> bounds[] = {
      {{"--ep", "2"}, backend == "cpu" ? 1e-6 : 1e-4}, {{"--tp", "2", "--ep", "2"}, reordered}, {{"--tp", "2"}, 1e-3}};
  for (const auto& [split, bound] : bounds) {
    std::vector<std::string> extra = {"--kl-divergence", base};
    extra.insert(extra.end(), split.begin(), split.end());
    const CliResult r = perplexity_on(backend, text, "fast", extra);
    ASSERT_EQ(r.exit_code, 0) << name_of(split) << ": " << r.err;
    const double kl = report_field(r.out, "Mean    KLD");
    std::printf("[parallel fast] %s %-14s mean KL %.3e  same top %.3f%%\n", backend.c_str(), name_of(split).c_str(), kl,
                report_field(r.out, "Same top p"));
    EXPECT_LE(kl, bound) << name_of(split) << "\n" << r.out;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, ShardedFast, ::testing::Values("cpu", "cuda"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// `dsv4 logits` and greedy `dsv4 generate` on a synthesised model (its --synth arguments, cpu backend, exact
// numerics), one rank or a split.
struct SynthRuns {
  explicit SynthRuns(std::vector<std::string> args) : synth(std::move(args)) {}

  std::vector<std::string> synth;
  TempDir tmp;

  std::vector<float> logits(const Split& split, const std::string& tokens, const std::string& step) {
    std::vector<std::string> args = {"logits", "--tokens", tokens, "--step", step, "--out", tmp.file("l.f32")};
    args.insert(args.end(), synth.begin(), synth.end());
    args.insert(args.end(), split.begin(), split.end());
    const CliResult r = run_cli(args);
    EXPECT_EQ(r.exit_code, 0) << name_of(split) << ": " << r.err;
    return read_f32(tmp.file("l.f32"));
  }
  std::string greedy(const Split& split) {
    std::vector<std::string> args = {"generate", "--prompt-ids", "7,77,777", "--max-tokens", "8", "--ignore-eos",
                                     "--temperature", "0"};
    args.insert(args.end(), synth.begin(), synth.end());
    args.insert(args.end(), split.begin(), split.end());
    const CliResult r = run_cli(args);
    EXPECT_EQ(r.exit_code, 0) << name_of(split) << ": " << r.err;
    return r.out;
  }
};

// Four ranks (issue #28 runs V4-Flash at --tp 4 on 4 GPUs): a V4-Flash-layout synth shaped to split four ways
// (8 heads in 4 output groups, 8 experts, FP8 shared-expert rows of 128 per rank) on 4 CPU ranks, exact
// numerics, prefill and then token by token, against one rank (1e-4, as above), and greedy continuations equal.
TEST(ShardedFourRanks, TpAndEpOverFourRanksMatchOneRank) {
  SynthRuns run{{"--synth", "v4-flash", "--layers", "4", "--experts", "8", "--vocab", "1000", "--dim", "256",
                 "--inter", "512", "--set",
                 "num_attention_heads=8,q_lora_rank=64,o_groups=4,o_lora_rank=128,index_n_heads=4,index_topk=16,"
                 "num_experts_per_tok=2",
                 "--backend", "cpu", "--numerics", "exact"}};
  const std::string tokens = "3,14,159,265,358,979,323,846,264,338,327,950";
  for (const std::string step : {"64", "1"}) {
    const std::vector<float> one = run.logits({}, tokens, step);
    ASSERT_EQ(one.size(), 12u * 1000u);
    for (const Split& split : std::vector<Split>{{"--tp", "4"}, {"--ep", "4"}, {"--tp", "4", "--ep", "4"}})
      EXPECT_TRUE(compare(run.logits(split, tokens, step), one, {1e-4, 0.0}, name_of(split) + ", step " + step));
  }
  const std::string want = run.greedy({});
  EXPECT_FALSE(want.empty());
  for (const Split& split : std::vector<Split>{{"--tp", "4"}, {"--ep", "4"}})
    EXPECT_EQ(run.greedy(split), want) << name_of(split);
}

// Eight ranks (issue #27 runs V4-Pro over 8 GPUs): a synth with V4-Pro's layout and counts — 128 heads in 16
// output groups, 384 experts (top-6, the first 3 layers hash-routed), two HCA layers and then CSA / HCA — and tiny
// dimensions, on 8 CPU ranks, exact numerics, against one rank (1e-4, as above). 140 tokens in chunks of 64
// reach the compressors (35 CSA entries for a top-16 indexer, one HCA entry); 12 tokens one by one take the
// decode path; greedy continuations equal.
TEST(ShardedEightRanks, V4ProShapeOverEightRanksMatchesOneRank) {
  SynthRuns run{{"--synth", "v4-pro", "--layers", "4", "--vocab", "1000", "--dim", "256", "--inter", "256", "--set",
                 "head_dim=64,qk_rope_head_dim=32,q_lora_rank=64,o_lora_rank=64,index_n_heads=8,index_head_dim=32,"
                 "index_topk=16",
                 "--backend", "cpu", "--numerics", "exact"}};
  const auto ids = [](int count) {
    std::string s;
    for (int i = 0; i < count; ++i) {
      if (i) s += ',';
      s += std::to_string((i * 37 + 11) % 1000);
    }
    return s;
  };
  const std::vector<Split> splits = {{"--tp", "8"}, {"--ep", "8"}, {"--tp", "8", "--ep", "8"}};
  for (const auto& [count, step] : {std::pair{140, "64"}, std::pair{12, "1"}}) {
    const std::vector<float> one = run.logits({}, ids(count), step);
    ASSERT_EQ(one.size(), size_t(count) * 1000u);
    for (const Split& split : splits)
      EXPECT_TRUE(compare(run.logits(split, ids(count), step), one, {1e-4, 0.0}, name_of(split) + ", step " + step));
  }
  const std::string want = run.greedy({});
  EXPECT_FALSE(want.empty());
  for (const Split& split : splits) EXPECT_EQ(run.greedy(split), want) << name_of(split);
}

// A split the model cannot take is refused with the reason, before any weight is read.
TEST(ShardedBadInput, ImpossibleSplitsAreRefused) {
  const std::string model = ref_small_dir();  // 4 heads in 2 output groups, 8 experts
  const struct {
    Split args;
    std::string says;
  } cases[] = {
      {{"--tp", "4"}, "do not split into 4 equal parts"},
      {{"--tp", "3"}, "do not split into 3 equal parts"},
      {{"--ep", "3"}, "routed experts do not split into 3"},
      {{"--tp", "2", "--ep", "4"}, "each must be 1 or the number of ranks"},
      {{"--tp", "0"}, "--tp and --ep must be between 1 and 64"},
      {{"--ep", "1000"}, "--tp and --ep must be between 1 and 64"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = {"generate", "--model", model, "--prompt-ids", "1,2,3", "--max-tokens", "2",
                                     "--backend", "cpu"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const CliResult r = run_cli(args);
    EXPECT_NE(r.exit_code, 0) << name_of(c.args);
    EXPECT_NE(r.err.find(c.says), std::string::npos) << name_of(c.args) << ": " << r.err;
  }
}

}  // namespace
}  // namespace dsv4::test
