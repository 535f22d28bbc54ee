// Batched steps: sequences stepped together (mixed prefill chunks and single-token decodes, in changing
// groupings) give the same logits as each sequence run alone: on the CPU backend in both numerics, and on
// the CUDA backend (skipped without a GPU).
#include <gtest/gtest.h>

#include <random>

#include "engine/backend.h"
#include "harness/compare.h"
#include "harness/files.h"
#include "harness/gpu_skip.h"
#include "loader/weight_map.h"
#include "model/deepseek_v4.h"

namespace dsv4::test {
namespace {

// Logits of every token of `tokens` run alone, one step per token.
std::vector<float> alone(DeepseekV4& model, const std::vector<int32_t>& tokens) {
  const int64_t V = model.config().vocab_size;
  std::vector<float> out(tokens.size() * size_t(V));
  auto seq = model.new_sequence(int64_t(tokens.size()));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const StepInput in{seq.get(), &tokens[i], 1, out.data() + i * size_t(V), false};
    model.step(std::span<const StepInput>(&in, 1));
  }
  return out;
}

void check_batched(const std::string& backend, Numerics numerics, const Tolerance& tol) {
  const auto weights = load_model(source_path("tests/data/golden/v4-flashlike"));
  const ModelConfig& c = weights->config;
  const int64_t V = c.vocab_size;
  auto ops = make_backend(backend, *weights);
  DeepseekV4 model(*weights, *ops, numerics, /*max_context=*/300, /*max_step=*/24);

  std::mt19937_64 rng(7);
  const std::vector<size_t> lengths = {150, 37, 1, 90};  // crosses CSA (4) and HCA (128) boundaries
  std::vector<std::vector<int32_t>> prompts;
  for (size_t len : lengths) {
    std::vector<int32_t> p(len);
    for (auto& t : p) t = int32_t(rng() % uint64_t(V));
    prompts.push_back(p);
  }
  std::vector<std::unique_ptr<SequenceState>> seqs;
  std::vector<std::vector<float>> got(prompts.size());
  std::vector<size_t> done(prompts.size(), 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    seqs.push_back(model.new_sequence(300));
    got[i].assign(prompts[i].size() * size_t(V), NAN);
  }
  // Each step: every unfinished sequence takes a chunk of 1..9 tokens while the batch has room for it.
  for (int step = 0; ; ++step) {
    std::vector<StepInput> batch;
    int64_t rows = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const size_t left = prompts[i].size() - done[i];
      if (left == 0) continue;
      const int64_t n = std::min<int64_t>(int64_t(left), 1 + int64_t(rng() % 9));
      if (rows + n > model.max_step()) continue;
      batch.push_back({seqs[i].get(), prompts[i].data() + done[i], n, got[i].data() + done[i] * size_t(V), true});
      done[i] += size_t(n);
      rows += n;
    }
    if (batch.empty()) break;
    model.step(batch);
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<float> want = alone(model, prompts[i]);
    EXPECT_TRUE(compare(got[i], want, tol, backend + " sequence " + std::to_string(i)));
  }
}

// CPU: rows are independent and every op is fp32 in a fixed order, so only the OpenMP split of a few
// reductions can move the last bits.
TEST(Batch, MixedChunksMatchSequencesRunAloneExact) { check_batched("cpu", Numerics::kExact, {2e-5, 1e-5}); }
TEST(Batch, MixedChunksMatchSequencesRunAloneReference) { check_batched("cpu", Numerics::kReference, {2e-5, 1e-5}); }

// CUDA, exact numerics: every path is fp32 (a batch of more than 16 rows takes the tiled GEMM where a lone
// sequence takes the GEMV), so only summation order differs: ~1e-6 relative per op, logits of magnitude ~5.
TEST(Batch, CudaMixedChunksMatchSequencesRunAlone) {
  DSV4_REQUIRE_GPU();
  check_batched("cuda", Numerics::kExact, {2e-4, 1e-4});
}

}  // namespace
}  // namespace dsv4::test
