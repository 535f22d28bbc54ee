// GPU sampling (src/cuda/sampling): greedy must equal the CPU argmax exactly; the stochastic modes must never
// pick a token the CPU sampler's filters drop, and over many seeded draws their frequencies must match the
// exact filtered softmax (chi-square test).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "cuda/gpu.h"
#include "sampler/sampler.h"
#if DSV4_HAVE_CUDA
#include "cuda/common/check.h"
#include "cuda/sampling/sampling.h"
#endif

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
// N draws from one row of logits (ld 0: every row reads row 0), row r keyed by seed base + r.
std::vector<int32_t> draw(CudaOps& ops, const std::vector<float>& logits, int64_t N, float T, int64_t top_k,
                          float top_p, float min_p, uint64_t seed_base, uint64_t offset) {
  std::vector<uint64_t> seeds(static_cast<size_t>(N));
  for (int64_t r = 0; r < N; ++r) seeds[size_t(r)] = seed_base + uint64_t(r) * 0x9E3779B97F4A7C15ull;
  auto* dseeds = reinterpret_cast<uint64_t*>(settled(ops.alloc_i32(size_t(2 * N))));
  DSV4_CUDA_CHECK(cudaMemcpy(dseeds, seeds.data(), seeds.size() * 8, cudaMemcpyHostToDevice));
  settle();
  int32_t* tokens = settled(ops.alloc_i32(size_t(N)));
  poison(tokens, size_t(N));
  settle();
  cuda::SampleParams p;
  p.logits = to_device(ops, logits);
  p.rows = N;
  p.vocab = int64_t(logits.size());
  p.ld = 0;
  p.temperature = T;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.seeds = dseeds;
  p.offset = offset;
  p.tokens = tokens;
  cuda::sample_tokens(p, ops.stream());
  return to_host(ops, tokens, size_t(N));
}

std::vector<float> normal_logits(int64_t V, float sigma, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(V));
  for (float& x : v) x = dist(rng);
  return v;
}
#endif

TEST(CudaSampling, GreedyEqualsCpuArgmax) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  CudaOps ops(ModelConfig{});
  struct Case { int64_t rows, V, ld; };
  for (const Case& c : {Case{5, 129280, 129280}, Case{3, 19, 23}, Case{2, 1, 1}, Case{4, 1000, 1003}}) {
    auto logits = random_floats(size_t(c.rows * c.ld), rng, -20.0f, 20.0f);
    // Row 0 gets several exact copies of a new maximum: the lowest of those ids must win.
    const float top = 25.0f;
    for (int64_t i = c.V - 1; i >= 0; i -= std::max<int64_t>(1, c.V / 5)) logits[size_t(i)] = top;
    std::vector<int32_t> want(size_t(c.rows));
    for (int64_t r = 0; r < c.rows; ++r) want[size_t(r)] = argmax(logits.data() + r * c.ld, c.V);
    int32_t* tokens = settled(ops.alloc_i32(size_t(c.rows)));
    poison(tokens, size_t(c.rows));
    settle();
    cuda::SampleParams p;
    p.logits = to_device(ops, logits);
    p.rows = c.rows;
    p.vocab = c.V;
    p.ld = c.ld;
    p.temperature = 0.0f;
    p.tokens = tokens;
    cuda::sample_tokens(p, ops.stream());
    EXPECT_EQ(to_host(ops, tokens, size_t(c.rows)), want) << "V=" << c.V << " ld=" << c.ld;
  }
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
           Case{"V4 vocabulary, all filters", 129280, 20000, 3.0f, false, 0.8f, 50, 0.95f, 0.001f},
       }) {
    auto logits = normal_logits(c.V, c.sigma, rng);
    if (c.integer_logits)
      for (float& l : logits) l = std::round(l);
    const std::vector<double> expected = kept_distribution(logits, c.T, c.top_k, c.top_p, c.min_p);
    const auto tokens = draw(ops, logits, c.N, c.T, c.top_k, c.top_p, c.min_p, rng(), 7);
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

TEST(CudaSampling, DrawsAreReproducibleAndAdvanceWithTheOffset) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  CudaOps ops(ModelConfig{});
  const auto logits = normal_logits(1000, 1.0f, rng);
  const uint64_t base = rng();
  const auto a = draw(ops, logits, 256, 1.0f, 0, 0.95f, 0.0f, base, 3);
  const auto b = draw(ops, logits, 256, 1.0f, 0, 0.95f, 0.0f, base, 3);
  const auto c = draw(ops, logits, 256, 1.0f, 0, 0.95f, 0.0f, base, 4);
  EXPECT_EQ(a, b);
  int64_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == c[i];
  EXPECT_LT(same, 64) << "a new offset must give fresh draws";
#endif
}

}  // namespace
}  // namespace dsv4::test
