// GPU sampling (src/cuda/sampling, CudaOps::sample_tokens / token_logprobs): every draw must be the CPU
// sampler's (sample_row: the same token from the same row, seed and step, whatever the filters, masks and
// edits); greedy the CPU argmax; over many seeded draws the frequencies must match the exact filtered softmax
// (chi-square test); the log-probabilities the CPU's.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "cuda/gpu.h"
#include "sampler/sampler.h"

namespace dsv4::test {
namespace {

// The CPU sampler's distribution after temperature, top-k, top-p and min-p (src/sampler/sampler.cpp, no
// penalties), as probabilities per token id; filtered tokens get 0.
std::vector<double> kept_distribution(const std::vector<float>& logits, float T, int64_t top_k, float top_p,
                                      float min_p) {
  const int64_t V = int64_t(logits.size());
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
  const int64_t k = top_k > 0 ? std::min(top_k, V) : V;
  std::vector<double> prob(static_cast<size_t>(k));
  const double top = logits[size_t(order[0])];
  double total = 0.0;
  for (int64_t i = 0; i < k; ++i) total += prob[size_t(i)] = std::exp((double(logits[size_t(order[size_t(i)])]) - top) / T);
  for (double& q : prob) q /= total;
  int64_t keep = k;
  if (top_p < 1.0f) {
    double mass = 0.0;
    for (int64_t i = 0; i < k; ++i) {
      mass += prob[size_t(i)];
      if (mass >= double(top_p)) {
        keep = i + 1;
        break;
      }
    }
  }
  if (min_p > 0.0f)
    while (keep > 1 && prob[size_t(keep - 1)] < double(min_p) * prob[0]) --keep;
  double kept = 0.0;
  for (int64_t i = 0; i < keep; ++i) kept += prob[size_t(i)];
  std::vector<double> out(static_cast<size_t>(V), 0.0);
  for (int64_t i = 0; i < keep; ++i) out[size_t(order[size_t(i)])] = prob[size_t(i)] / kept;
  return out;
}

// Pearson chi-square of observed counts against `expected` probabilities (N draws), bins with an expected
// count under 5 merged (smallest first) so the statistic stays chi-square distributed.
struct ChiSquare {
  double statistic = 0.0;
  int64_t dof = 0;
};

ChiSquare chi_square(const std::vector<int64_t>& counts, const std::vector<double>& expected, int64_t N) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i < expected.size(); ++i)
    if (expected[i] > 0.0) ids.push_back(int64_t(i));
  std::sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) { return expected[size_t(a)] < expected[size_t(b)]; });
  ChiSquare chi;
  int64_t bins = 0;
  double e = 0.0, o = 0.0;
  for (size_t j = 0; j < ids.size(); ++j) {
    e += double(N) * expected[size_t(ids[j])];
    o += double(counts[size_t(ids[j])]);
    if (e >= 5.0 || j + 1 == ids.size()) {
      chi.statistic += (o - e) * (o - e) / e;
      ++bins;
      e = o = 0.0;
    }
  }
  chi.dof = bins - 1;
  return chi;
}

// A false alarm needs the statistic ~7 standard deviations above its mean (probability < 1e-9).
double chi_square_bound(int64_t dof) { return double(dof) + 7.0 * std::sqrt(2.0 * double(dof)) + 10.0; }

#if DSV4_HAVE_CUDA
// The tokens CudaOps::sample_tokens draws for rows `logits` [draws.size(), V] (outputs poisoned first).
std::vector<int32_t> gpu_draws(CudaOps& ops, const std::vector<float>& logits, int64_t V,
                               const std::vector<RowDraw>& draws) {
  const size_t rows = draws.size();
  int32_t* tokens = settled(ops.alloc_i32(rows));
  poison(tokens, rows);
  settle();
  ops.sample_tokens(to_device(ops, logits), V, draws, tokens);
  return to_host(ops, tokens, rows);
}

// N draws of one row: the steps 0 .. N−1 of one seed, in batches of rows that fit 256 MB.
std::vector<int32_t> draws_of_a_row(CudaOps& ops, const std::vector<float>& row, int64_t N, RowDraw d) {
  const int64_t V = int64_t(row.size()), batch = std::max<int64_t>(1, std::min<int64_t>(N, (int64_t(64) << 20) / V));
  std::vector<int32_t> out;
  for (int64_t first = 0; first < N; first += batch) {
    const int64_t n = std::min(batch, N - first);
    std::vector<float> logits;
    std::vector<RowDraw> draws;
    for (int64_t i = 0; i < n; ++i) {
      logits.insert(logits.end(), row.begin(), row.end());
      draws.push_back(d);
      draws.back().step = uint64_t(first + i);
    }
    const auto got = gpu_draws(ops, logits, V, draws);
    out.insert(out.end(), got.begin(), got.end());
  }
  return out;
}

std::vector<float> normal_logits(int64_t V, float sigma, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(V));
  for (float& x : v) x = dist(rng);
  return v;
}
#endif

// Every draw equals the CPU's sample_row: rows of the V4 vocabulary and odd sizes, each with its own
// temperature (0 and near 0 too), top-k, top-p, min-p, seed and step, some under a grammar's mask, some with
// logit edits (bias, repetition, presence / frequency), some with logits rounded to halves (exact ties at every
// filter's boundary), sharing one maximum at several ids, topped by -0 and +0 (equal), or with every allowed
// logit -inf.
TEST(CudaSampling, EveryDrawIsTheCpuSamplers) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  CudaOps ops(ModelConfig{});
  const float temperatures[] = {0.0f, 0.3f, 0.8f, 1.0f, 1.7f};
  const float top_ps[] = {1.0f, 1.0f, 0.95f, 0.6f, 0.05f};
  const float min_ps[] = {0.0f, 0.0f, 0.01f, 0.2f};
  const float repetition[] = {1.0f, 1.3f, 0.8f};
  int64_t draws_checked = 0;
  for (const int64_t V : {int64_t(129280), int64_t(1), int64_t(19), int64_t(1000), int64_t(4099)}) {
    const int64_t rows = V > 10000 ? 24 : 64, words = (V + 31) / 32;
    std::vector<float> logits;
    std::vector<RowDraw> draws(static_cast<size_t>(rows));
    std::vector<std::vector<uint32_t>> masks(static_cast<size_t>(rows));
    std::vector<std::vector<LogitEdit>> edits(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      auto row = normal_logits(V, r % 3 == 0 ? 1.0f : 4.0f, rng);
      if (r % 5 == 1)
        for (float& l : row) l = std::round(l * 2.0f) / 2.0f;
      if (r % 7 == 2)
        for (int64_t i = V - 1; i >= 0; i -= std::max<int64_t>(1, V / 4)) row[size_t(i)] = 30.0f;
      if (r % 11 == 4) {  // the maximum is zero, of both signs
        for (float& l : row) l = -std::fabs(l) - 0.5f;
        for (int64_t i = 0; i < V; i += std::max<int64_t>(1, V / 7)) row[size_t(i)] = (i / std::max<int64_t>(1, V / 7)) % 2 ? 0.0f : -0.0f;
      }
      logits.insert(logits.end(), row.begin(), row.end());
      RowDraw& d = draws[size_t(r)];
      d.temperature = r % 17 == 6 ? 1e-7f : temperatures[rng() % 5];
      d.top_k = std::array<int64_t, 6>{0, 0, 1, 5, 40, V - 1}[rng() % 6];
      d.top_p = top_ps[rng() % 5];
      d.min_p = min_ps[rng() % 4];
      d.repetition_penalty = repetition[rng() % 3];
      d.seed = rng();
      d.step = rng() % 5000;
      if (r % 4 == 3) {  // a mask that keeps ~1/3 of the tokens, at least one
        masks[size_t(r)].assign(size_t(words), 0);
        for (int64_t i = 0; i < V; ++i)
          if (rng() % 3 == 0 || i == V / 2) masks[size_t(r)][size_t(i >> 5)] |= 1u << (i & 31);
        d.allowed = masks[size_t(r)].data();
        if (r % 5 == 2)  // and every allowed logit -inf
          for (int64_t i = 0; i < V; ++i)
            if ((masks[size_t(r)][size_t(i >> 5)] >> (i & 31)) & 1u) logits[size_t(r * V + i)] = -INFINITY;
      }
      if (r % 3 == 1) {  // edits on distinct ids
        std::vector<int32_t> ids(static_cast<size_t>(V));
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        for (int64_t j = 0; j < std::min<int64_t>(V, 50); ++j)
          edits[size_t(r)].push_back({ids[size_t(j)], rng() % 2 == 0, float(int(rng() % 41) - 20) * 0.25f,
                                      float(rng() % 9) * 0.3f});
        d.edits = edits[size_t(r)];
      }
    }
    const auto got = gpu_draws(ops, logits, V, draws);
    for (int64_t r = 0; r < rows; ++r) {
      const RowDraw& d = draws[size_t(r)];
      EXPECT_EQ(got[size_t(r)], sample_row(logits.data() + r * V, V, d))
          << "V " << V << " row " << r << ": T " << d.temperature << " top_k " << d.top_k << " top_p " << d.top_p
          << " min_p " << d.min_p << " mask " << (d.allowed != nullptr) << " edits " << d.edits.size();
      ++draws_checked;
    }
  }
  std::printf("sampling: %lld GPU draws equal to the CPU's\n", static_cast<long long>(draws_checked));
#endif
}

// The decode loop's greedy selection (CudaOps::greedy_tokens: a row spread over many blocks, the last block of
// each row reducing their winners) and download_i32 (pinned staging): vocabularies of one block, of several
// with a short last slice, of the V4 head, and past the slice cap (each block loops); ties at several ids of
// one row; run twice on the same workspace so that the arrival counters must have been left at zero.
TEST(CudaSampling, MultiBlockGreedyEqualsCpuArgmax) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  CudaOps ops(ModelConfig{});
  struct Case { int64_t rows, V; };
  for (const Case& c : {Case{2, 1}, Case{3, 2047}, Case{4, 2049}, Case{1, 4097}, Case{5, 129280}, Case{3, 300001},
                        Case{5, 129280}}) {
    for (int pass = 0; pass < 2; ++pass) {
      auto logits = random_floats(size_t(c.rows * c.V), rng, -20.0f, 20.0f);
      // Row 0: several exact copies of a new maximum, the lowest id must win; the last row: its maximum at
      // the very end (the last slice's last element).
      for (int64_t i = c.V - 1; i >= 0; i -= std::max<int64_t>(1, c.V / 5)) logits[size_t(i)] = 25.0f;
      if (c.rows > 1) logits[size_t(c.rows * c.V - 1)] = 30.0f;
      std::vector<int32_t> want(size_t(c.rows));
      for (int64_t r = 0; r < c.rows; ++r) want[size_t(r)] = argmax(logits.data() + r * c.V, c.V);
      int32_t* tokens = settled(ops.alloc_i32(size_t(c.rows)));
      float* values = settled(ops.alloc(size_t(c.rows)));
      poison(tokens, size_t(c.rows));
      poison(values, size_t(c.rows));
      settle();
      // The values are optional: every second pass asks for them (ranks that share the vocabulary do).
      ops.greedy_tokens(to_device(ops, logits), c.rows, c.V, tokens, pass == 1 ? values : nullptr);
      std::vector<int32_t> got(size_t(c.rows), -7);
      ops.download_i32(got.data(), tokens, size_t(c.rows));
      EXPECT_EQ(got, want) << "rows=" << c.rows << " V=" << c.V << " pass " << pass;
      if (pass == 1) {
        std::vector<float> got_values(size_t(c.rows));
        ops.download(got_values.data(), values, size_t(c.rows));
        for (int64_t r = 0; r < c.rows; ++r)
          EXPECT_EQ(got_values[size_t(r)], logits[size_t(r * c.V + want[size_t(r)])]) << "row " << r << " V=" << c.V;
      }
    }
  }
#endif
}

TEST(CudaSampling, StochasticModesMatchTheFilteredSoftmax) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  CudaOps ops(ModelConfig{});
  struct Case {
    const char* what;
    int64_t V, N;
    float sigma;
    bool integer_logits;  // logits rounded to integers: many exact ties at the filter boundaries
    float T;
    int64_t top_k;
    float top_p, min_p;
  };
  for (const Case& c : {
           Case{"temperature only", 50, 200000, 2.0f, false, 1.0f, 0, 1.0f, 0.0f},
           Case{"top-k", 50, 200000, 2.0f, false, 0.7f, 10, 1.0f, 0.0f},
           Case{"top-p", 50, 200000, 2.0f, false, 1.3f, 0, 0.8f, 0.0f},
           Case{"min-p", 50, 200000, 2.0f, false, 1.0f, 0, 1.0f, 0.1f},
           Case{"all filters", 50, 200000, 2.0f, false, 0.9f, 20, 0.9f, 0.02f},
           Case{"top-k through a tie", 64, 200000, 1.0f, true, 1.0f, 10, 1.0f, 0.0f},
           Case{"top-p through a tie", 64, 200000, 1.0f, true, 1.0f, 0, 0.5f, 0.0f},
           Case{"V4 vocabulary, all filters", 129280, 4000, 3.0f, false, 0.8f, 50, 0.95f, 0.001f},
       }) {
    auto logits = normal_logits(c.V, c.sigma, rng);
    if (c.integer_logits)
      for (float& l : logits) l = std::round(l);
    const std::vector<double> expected = kept_distribution(logits, c.T, c.top_k, c.top_p, c.min_p);
    const auto tokens = draws_of_a_row(ops, logits, c.N, {c.T, c.top_k, c.top_p, c.min_p, 1.0f, rng()});
    std::vector<int64_t> counts(size_t(c.V), 0);
    int64_t filtered = 0, invalid = 0;
    for (int32_t t : tokens) {
      if (t < 0 || t >= c.V) {
        ++invalid;
        continue;
      }
      ++counts[size_t(t)];
      filtered += expected[size_t(t)] == 0.0;
    }
    EXPECT_EQ(invalid, 0) << c.what;
    EXPECT_EQ(filtered, 0) << c.what << ": draws of tokens the filters drop";
    const ChiSquare chi = chi_square(counts, expected, c.N);
    const int64_t kept = std::count_if(expected.begin(), expected.end(), [](double q) { return q > 0.0; });
    std::printf("sampling '%s': %lld kept tokens, chi-square %.1f with %lld dof (bound %.1f)\n", c.what,
                static_cast<long long>(kept), chi.statistic, static_cast<long long>(chi.dof), chi_square_bound(chi.dof));
    if (chi.dof > 0) {
      EXPECT_LT(chi.statistic, chi_square_bound(chi.dof)) << c.what;
    }
  }
#endif
}

// The log-probabilities computed on the GPU (CudaOps::token_logprobs) are the CPU's token_logprobs: the chosen
// token's and the top ones, in the same order (ties: lower id first), for rows of the V4 vocabulary and odd.
TEST(CudaSampling, LogprobsAreTheCpus) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  CudaOps ops(ModelConfig{});
  for (const auto& [V, top] : {std::pair<int64_t, int64_t>{129280, 20}, {1000, 5}, {7, 7}, {129280, 0}, {33, 1}}) {
    const int64_t rows = 6;
    std::vector<float> logits;
    for (int64_t r = 0; r < rows; ++r) {
      auto row = normal_logits(V, 3.0f, rng);
      if (r % 2 == 1)
        for (float& l : row) l = std::round(l);  // ties inside the top ones
      logits.insert(logits.end(), row.begin(), row.end());
    }
    std::vector<int32_t> chosen(static_cast<size_t>(rows));
    for (auto& t : chosen) t = int32_t(rng() % uint64_t(V));
    // An odd count of rows too (the results' sections must stay aligned), and one alone.
    for (const std::vector<int64_t>& asked : {std::vector<int64_t>{0, 2, 3, 5}, {1, 2, 4}, {3}}) {
    std::vector<TokenLogprobs> got(asked.size());
    ops.token_logprobs(to_device(ops, logits), V, asked, to_device(ops, chosen), top, got);
    settle();
    for (size_t i = 0; i < asked.size(); ++i) {
      const int64_t r = asked[i];
      const TokenLogprobs want = token_logprobs(logits.data() + r * V, V, chosen[size_t(r)], top);
      EXPECT_NEAR(got[i].logprob, want.logprob, 1e-5) << "V " << V << " row " << r;
      ASSERT_EQ(got[i].top.size(), want.top.size()) << "V " << V << " row " << r;
      for (size_t j = 0; j < want.top.size(); ++j) {
        EXPECT_EQ(got[i].top[j].first, want.top[j].first) << "V " << V << " row " << r << " rank " << j;
        EXPECT_NEAR(got[i].top[j].second, want.top[j].second, 1e-5) << "V " << V << " row " << r << " rank " << j;
      }
    }
    }
  }
#endif
}

}  // namespace
}  // namespace dsv4::test
