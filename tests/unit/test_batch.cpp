// Batched steps: sequences stepped together (mixed prefill chunks and single-token decodes, in changing
// groupings) give the same logits as each sequence run alone: on the CPU backend in both numerics, and on
// the CUDA backend (skipped without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>

#include "engine/backend.h"
#include "engine/generator.h"
#include "harness/compare.h"
#include "harness/files.h"
#include "harness/gpu_skip.h"
#include "loader/weight_map.h"
#include "model/deepseek_v4.h"
#include "sampler/sampler.h"

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

// logit_rows below a step's rows makes the LM head run in chunks (DeepseekV4's logit_rows).
void check_batched(const std::string& backend, Numerics numerics, const Tolerance& tol,
                   int64_t logit_rows = kLogitRows) {
  const auto weights = load_model(source_path("tests/data/golden/v4-flashlike"));
  const ModelConfig& c = weights->config;
  const int64_t V = c.vocab_size;
  auto ops = make_backend(backend, *weights);
  DeepseekV4 model(*weights, *ops, numerics, /*max_context=*/300, /*max_step=*/24, logit_rows);

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
// Logits rows held five at a time: steps of up to 24 rows run the LM head in chunks, every row still in its place.
TEST(Batch, LogitsInChunksMatchSequencesRunAlone) { check_batched("cpu", Numerics::kExact, {2e-5, 1e-5}, 5); }

// CUDA, exact numerics: every path is fp32 (a batch of more than 16 rows takes the tiled GEMM where a lone
// sequence takes the GEMV), so only summation order differs: ~1e-6 relative per op, logits of magnitude ~5.
TEST(Batch, CudaMixedChunksMatchSequencesRunAlone) {
  DSV4_REQUIRE_GPU();
  check_batched("cuda", Numerics::kExact, {2e-4, 1e-4});
}

// StepInput::next_token: the backend's greedy choice from a row's logits, in steps that mix inputs asking for
// logits only (A, all rows), the token only (B), both (C: the last row of a 3-token chunk; E), neither (D) and
// logits only again (F). B / E and C / F are twins (same history, same tokens), so B's token must be E's and
// C's logits F's: a row delivered to the wrong input shows up as a mismatch.
void check_next_tokens(const std::string& backend, const Tolerance& twin_tol, int64_t logit_rows = kLogitRows) {
  const auto weights = load_model(source_path("tests/data/golden/v4-flashlike"));
  const int64_t V = weights->config.vocab_size;
  auto ops = make_backend(backend, *weights);
  DeepseekV4 model(*weights, *ops, Numerics::kExact, /*max_context=*/64, /*max_step=*/16, logit_rows);
  std::mt19937_64 rng(11);
  const auto random_tokens = [&](size_t n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = int32_t(rng() % uint64_t(V));
    return t;
  };
  const std::vector<int32_t> history = random_tokens(9);
  std::vector<std::unique_ptr<SequenceState>> seqs;
  for (int i = 0; i < 6; ++i) {
    seqs.push_back(model.new_sequence(64));
    const StepInput in{seqs.back().get(), history.data(), int64_t(history.size()), nullptr, false};
    model.step(std::span<const StepInput>(&in, 1));
  }
  enum { A, B, C, D, E, F };
  for (int round = 0; round < 3; ++round) {
    const std::vector<int32_t> ta = random_tokens(2), tb = random_tokens(1), tc = random_tokens(3), td = random_tokens(2);
    std::vector<float> la(2 * size_t(V), NAN), lc(size_t(V), NAN), le(size_t(V), NAN), lf(size_t(V), NAN);
    int32_t nb = -7, nc = -7, ne = -7;
    const std::vector<StepInput> batch = {
        {seqs[A].get(), ta.data(), 2, la.data(), true},       {seqs[B].get(), tb.data(), 1, nullptr, false, &nb},
        {seqs[C].get(), tc.data(), 3, lc.data(), false, &nc}, {seqs[D].get(), td.data(), 2, nullptr, false},
        {seqs[E].get(), tb.data(), 1, le.data(), false, &ne}, {seqs[F].get(), tc.data(), 3, lf.data(), false}};
    model.step(batch);
    const std::string where = backend + " round " + std::to_string(round);
    EXPECT_EQ(nc, argmax(lc.data(), V)) << where;
    EXPECT_EQ(ne, argmax(le.data(), V)) << where;
    EXPECT_EQ(nb, ne) << where;
    EXPECT_TRUE(compare(lc, lf, twin_tol, where + ": C's logits against its twin F's"));
    EXPECT_TRUE(std::all_of(la.begin(), la.end(), [](float x) { return std::isfinite(x); })) << where;
  }
}

TEST(Batch, NextTokensAreTheArgmaxOfTheirRows) { check_next_tokens("cpu", {0.0, 0.0}); }
// The step's 6 logits rows in chunks of 4: A, B, C's last row, E in the first; F in the second.
TEST(Batch, NextTokensAreTheArgmaxOfTheirRowsInLogitChunks) { check_next_tokens("cpu", {0.0, 0.0}, 4); }

// CUDA: the twins' rows run through the same kernels in one step; allow the fp32 order of a split reduction.
TEST(Batch, CudaNextTokensAreTheArgmaxOfTheirRows) {
  DSV4_REQUIRE_GPU();
  check_next_tokens("cuda", {1e-5, 1e-5});
}

// Tokens drawn on the backend (StepInput::draw) are sample_row's on the same rows, and log-probabilities
// computed there are token_logprobs': a step of decodes and a prompt's last chunk, each with its own draw (a
// grammar's mask, logit edits), greedy beside them, and the logits rows downloaded too so that the host can
// check. Exact on both backends: the host samples the very rows the backend drew from. Over several ranks the
// rows are gathered from the ranks' columns on the backend first.
void check_drawn_tokens(const std::string& backend, const Parallelism& parallelism, int64_t logit_rows = kLogitRows) {
  const auto weights = load_model(source_path("tests/data/golden/v4-flashlike"));
  const int64_t V = weights->config.vocab_size;
  const Ranks ranks = make_ranks(backend, *weights, parallelism);
  DeepseekV4 model(*weights, ranks.shards, Numerics::kReference, /*max_context=*/64, /*max_step=*/16, logit_rows);
  std::mt19937_64 rng(5);
  const auto random_tokens = [&](size_t n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = int32_t(rng() % uint64_t(V));
    return t;
  };
  std::vector<std::unique_ptr<SequenceState>> seqs;
  const std::vector<int32_t> history = random_tokens(7);
  for (int i = 0; i < 4; ++i) {
    seqs.push_back(model.new_sequence(64));
    const StepInput in{seqs.back().get(), history.data(), int64_t(history.size()), nullptr, false};
    model.step(std::span<const StepInput>(&in, 1));
  }
  std::vector<uint32_t> mask(size_t((V + 31) / 32), 0);
  for (int64_t i = 0; i < V; i += 3) mask[size_t(i >> 5)] |= 1u << (i & 31);
  const std::vector<LogitEdit> edits = {{5, true, 2.0f, 0.5f}, {history[0], false, -3.0f, 0.0f}, {17, true, 0.0f, 1.5f}};
  for (int round = 0; round < 3; ++round) {
    RowDraw a{.temperature = 0.8f, .top_p = 0.9f, .seed = rng(), .step = uint64_t(round)};
    RowDraw b{.temperature = 1.3f, .top_k = 30, .min_p = 0.02f, .repetition_penalty = 1.2f, .seed = rng(),
              .step = uint64_t(round)};
    b.allowed = mask.data();
    b.edits = edits;
    RowDraw c{.temperature = 0.6f, .top_p = 0.5f, .seed = rng()};
    const std::vector<int32_t> ta = random_tokens(1), tb = random_tokens(1), tc = random_tokens(3), td = random_tokens(1);
    std::vector<float> la(size_t(V), NAN), lb(size_t(V), NAN), lc(size_t(V), NAN);
    int32_t na = -7, nb = -7, nc = -7, nd = -7;
    TokenLogprobs pa, pc;
    std::vector<StepInput> batch = {{seqs[0].get(), ta.data(), 1, la.data(), false, &na, &a, &pa, 5},
                                    {seqs[1].get(), tb.data(), 1, lb.data(), false, &nb, &b},
                                    {seqs[2].get(), tc.data(), 3, lc.data(), false, &nc, &c, &pc, 0},
                                    {seqs[3].get(), td.data(), 1, nullptr, false, &nd}};
    model.step(batch);
    const std::string where = backend + " ranks " + std::to_string(parallelism.ranks()) + " round " +
                              std::to_string(round);
    EXPECT_EQ(na, sample_row(la.data(), V, a)) << where;
    EXPECT_EQ(nb, sample_row(lb.data(), V, b)) << where;
    EXPECT_EQ(nc, sample_row(lc.data(), V, c)) << where;
    EXPECT_EQ((mask[size_t(nb >> 5)] >> (nb & 31)) & 1u, 1u) << where << ": a token the mask forbids";
    EXPECT_GE(nd, 0) << where;
    for (const auto& [got, logits, token, top] :
         {std::tuple{&pa, &la, na, 5}, std::tuple{&pc, &lc, nc, 0}}) {
      const TokenLogprobs want = token_logprobs(logits->data(), V, token, top);
      EXPECT_NEAR(got->logprob, want.logprob, 1e-5) << where;
      ASSERT_EQ(got->top.size(), want.top.size()) << where;
      for (size_t j = 0; j < want.top.size(); ++j) {
        EXPECT_EQ(got->top[j].first, want.top[j].first) << where << " rank " << j;
        EXPECT_NEAR(got->top[j].second, want.top[j].second, 1e-5) << where << " rank " << j;
      }
    }
  }
}

TEST(Batch, DrawnTokensAreTheHostSamplers) {
  check_drawn_tokens("cpu", {});
  check_drawn_tokens("cpu", {.tp = 2});
  check_drawn_tokens("cpu", {.ep = 2});
}

// Logits rows two at a time: a's draw and log-probabilities in the head's first chunk, c's in its second.
TEST(Batch, DrawnTokensAreTheHostSamplersInLogitChunks) {
  check_drawn_tokens("cpu", {}, 2);
  check_drawn_tokens("cpu", {.tp = 2}, 2);
  check_drawn_tokens("cpu", {.ep = 2}, 2);
}

TEST(Batch, CudaDrawnTokensAreTheHostSamplers) {
  DSV4_REQUIRE_GPU();
  check_drawn_tokens("cuda", {});
  check_drawn_tokens("cuda", {}, 2);
}

TEST(Batch, CudaDrawnTokensOverTwoGpusAreTheHostSamplers) {
  DSV4_REQUIRE_GPUS(2);
  check_drawn_tokens("cuda", {.tp = 2});
}

// generate() takes the backend's token (no logits download); greedy, it must produce what the argmax of each
// step's downloaded logits on the host produces.
TEST(Batch, GreedyGenerateMatchesHostArgmax) {
  const auto weights = load_model(source_path("tests/data/golden/v4-flashlike"));
  const int64_t V = weights->config.vocab_size;
  auto ops = make_backend("cpu", *weights);
  const std::vector<int32_t> prompt = {3, 17, 250, 9, 41};
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  Sampler sampler(greedy, V);
  DeepseekV4 model(*weights, *ops, Numerics::kReference, 64);
  std::vector<int32_t> got;
  generate(model, prompt, 12, sampler, /*stop_at_eos=*/false, [&](int32_t t) {
    got.push_back(t);
    return true;
  });
  DeepseekV4 host(*weights, *ops, Numerics::kReference, 64);
  std::vector<float> logits(static_cast<size_t>(V));
  host.step(prompt.data(), int64_t(prompt.size()), logits.data(), false);
  std::vector<int32_t> want;
  while (want.size() < 12) {
    want.push_back(argmax(logits.data(), V));
    host.step(&want.back(), 1, logits.data(), false);
  }
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace dsv4::test
