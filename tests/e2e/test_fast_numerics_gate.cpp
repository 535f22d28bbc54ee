// The CPU gate of issue 24 on the shipped tiny model: fast numerics (DeepSeek's GPU rounding points,
// docs/design/fast-numerics.md §7) against reference numerics. On the held-out text: mean KL ≤ 5e-3, top-1
// agreement ≥ 97%, |Δperplexity| ≤ 1%, and a KL above zero (the rounding points are really there).
#include <gtest/gtest.h>

#include <cmath>

#include "harness/files.h"
#include "harness/perplexity.h"

namespace dsv4::test {
namespace {

// Windows of 256 tokens (the default --ctx) scored from the held-out text: enough for the CSA layers' indexer to
// choose among more entries than its top-k (32 of up to 63), small enough for a quick test.
constexpr int kWindows = 6;

TEST(FastNumericsGate, KlAgainstReferenceOnTinyHeldout) {
  TempDir tmp;
  const std::string text = tiny_model_dir() + "/heldout.txt", base = tmp.file("reference.lgp");
  const CliResult saved =
      perplexity(text, "reference", {"--chunks", std::to_string(kWindows), "--save-logits", base});
  ASSERT_EQ(saved.exit_code, 0) << saved.err;
  const CliResult r = perplexity(text, "fast", {"--kl-divergence", base});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const double kl = report_field(r.out, "Mean    KLD");
  EXPECT_GT(kl, 1e-6) << r.out;
  EXPECT_LE(kl, 5e-3) << r.out;
  EXPECT_GE(report_field(r.out, "Same top p"), 97.0) << r.out;
  EXPECT_LE(std::fabs(report_field(r.out, "Mean PPL(Q)/PPL(base)") - 1), 0.01) << r.out;
}

}  // namespace
}  // namespace dsv4::test
