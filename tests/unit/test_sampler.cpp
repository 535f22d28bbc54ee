// Sampling: greedy, temperature (empirical frequencies vs the softmax), top-k / top-p / min-p supports,
// penalties, seed reproducibility, parameter validation, grammar masks, logprobs, and stop strings across chunk
// boundaries.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "core/error.h"
#include "sampler/draw.h"
#include "sampler/sampler.h"

namespace dsv4 {
namespace {

std::vector<float> random_logits(int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 2.0f);
  std::vector<float> v(static_cast<size_t>(vocab));
  for (float& x : v) x = n(rng);
  return v;
}

// A sampler's next token on the host: Sampler::next, then sample_row.
int32_t host_draw(Sampler& s, const float* logits, std::span<const int32_t> prompt,
                  std::span<const int32_t> generated, const uint32_t* allowed = nullptr) {
  return sample_row(logits, s.vocab(), s.next(prompt, generated, allowed));
}
int32_t host_draw(Sampler&& s, const float* logits, std::span<const int32_t> prompt,
                  std::span<const int32_t> generated, const uint32_t* allowed = nullptr) {
  return host_draw(s, logits, prompt, generated, allowed);
}

RowDraw row_draw(const SamplingParams& p, uint64_t step) {
  return {p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty, p.seed, step};
}

// The tokens of `draws` steps of one sequence on the same row.
std::map<int32_t, int> histogram(const SamplingParams& p, const std::vector<float>& logits, int draws) {
  std::map<int32_t, int> h;
  for (int i = 0; i < draws; ++i) ++h[sample_row(logits.data(), int64_t(logits.size()), row_draw(p, uint64_t(i)))];
  return h;
}

std::vector<double> softmax(const std::vector<float>& l, double t) {
  std::vector<double> p(l.size());
  double mx = *std::max_element(l.begin(), l.end()), sum = 0;
  for (size_t i = 0; i < l.size(); ++i) sum += p[i] = std::exp((l[i] - mx) / t);
  for (double& x : p) x /= sum;
  return p;
}

TEST(Sampler, GreedyIsArgmaxWithLowestIdOnTies) {
  std::vector<float> l = random_logits(101, 1);
  l[37] = 50.0f;
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler s(p, 101);
  EXPECT_EQ(host_draw(s, l.data(), {}, {}), 37);
  l[12] = 50.0f;
  EXPECT_EQ(host_draw(s, l.data(), {}, {}), 12);
}

TEST(Sampler, TemperatureMatchesSoftmaxFrequencies) {
  const std::vector<float> l = random_logits(13, 2);
  for (float t : {0.7f, 1.0f, 1.6f}) {
    SamplingParams p;
    p.temperature = t;
    p.seed = 11;
    const int draws = 40000;
    const auto h = histogram(p, l, draws);
    const auto want = softmax(l, t);
    for (size_t i = 0; i < l.size(); ++i) {
      const double f = double(h.count(int32_t(i)) ? h.at(int32_t(i)) : 0) / draws;
      const double sd = std::sqrt(want[i] * (1 - want[i]) / draws);
      EXPECT_NEAR(f, want[i], 5 * sd + 1e-4) << "token " << i << " temperature " << t;
    }
  }
}

TEST(Sampler, TopKTopPMinPRestrictTheSupport) {
  const std::vector<float> l = random_logits(50, 3);
  std::vector<int32_t> order(50);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  const auto probs = softmax(l, 1.0);

  SamplingParams k;
  k.top_k = 3;
  for (const auto& [tok, n] : histogram(k, l, 3000))
    EXPECT_TRUE(tok == order[0] || tok == order[1] || tok == order[2]) << tok;

  SamplingParams tp;
  tp.top_p = 0.6f;
  double mass = 0;
  std::set<int32_t> nucleus;
  for (int32_t t : order) {
    nucleus.insert(t);
    if ((mass += probs[size_t(t)]) >= 0.6) break;
  }
  const auto hp = histogram(tp, l, 3000);
  for (const auto& [tok, n] : hp) EXPECT_TRUE(nucleus.count(tok)) << tok;
  EXPECT_EQ(hp.size(), nucleus.size());  // and every nucleus token shows up

  SamplingParams mp;
  mp.min_p = 0.2f;
  for (const auto& [tok, n] : histogram(mp, l, 3000)) EXPECT_GE(probs[size_t(tok)], 0.2 * probs[size_t(order[0])]) << tok;
}

TEST(Sampler, PenaltiesChangeTheChoice) {
  std::vector<float> l(8, 0.0f);
  l[2] = 3.0f;
  l[5] = 2.5f;
  SamplingParams p;
  p.temperature = 0.0f;
  const std::vector<int32_t> gen = {2, 2};
  p.presence_penalty = 1.0f;
  EXPECT_EQ(host_draw(Sampler(p, 8), l.data(), {}, gen), 5);  // 3 − 1 < 2.5
  p.presence_penalty = 0.0f;
  p.frequency_penalty = 0.2f;
  EXPECT_EQ(host_draw(Sampler(p, 8), l.data(), {}, gen), 2);  // 3 − 0.4 > 2.5
  p.frequency_penalty = 0.3f;
  EXPECT_EQ(host_draw(Sampler(p, 8), l.data(), {}, gen), 5);  // 3 − 0.6 < 2.5
  p.frequency_penalty = 0.0f;
  p.repetition_penalty = 1.3f;
  const std::vector<int32_t> prompt = {2};
  EXPECT_EQ(host_draw(Sampler(p, 8), l.data(), prompt, {}), 5);  // 3 / 1.3 < 2.5: the prompt counts too
}

// A draw is a function of the row, the seed and the step (the tokens generated before it): two samplers of one
// seed agree token for token, another seed does not, and the steps of one sequence differ.
TEST(Sampler, SeedAndStepMakeSamplingReproducible) {
  const std::vector<float> l = random_logits(1000, 4);
  SamplingParams p;
  p.seed = 42;
  Sampler a(p, 1000), b(p, 1000);
  p.seed = 43;
  Sampler c(p, 1000);
  std::vector<int32_t> sa, sb, sc;
  for (int i = 0; i < 64; ++i) {
    sa.push_back(host_draw(a, l.data(), {}, sa));
    sb.push_back(host_draw(b, l.data(), {}, sb));
    sc.push_back(host_draw(c, l.data(), {}, sc));
  }
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
  EXPECT_GT(std::set<int32_t>(sa.begin(), sa.end()).size(), 16u);
  EXPECT_EQ(sample_row(l.data(), 1000, row_draw(p, 5)), sc[5]);
}

// Edge cases both backends decide the same way: a temperature below draw::kGreedyBelow is greedy (1 / T would
// overflow); -0 and +0 are equal logits (the lower id ranks first); every allowed logit -inf gives the greedy
// answer instead of a draw from nothing.
TEST(Sampler, NearZeroTemperatureSignedZerosAndNothingToDraw) {
  const std::vector<float> l = random_logits(500, 12);
  const int32_t best = argmax(l.data(), 500);
  for (const float T : {1e-7f, 1e-30f, 1e-40f})
    EXPECT_EQ(sample_row(l.data(), 500, {.temperature = T, .seed = 3, .step = 9}), best) << T;
  std::vector<float> zeros(8, -3.0f);
  zeros[2] = -0.0f;
  zeros[5] = 0.0f;
  EXPECT_EQ(sample_row(zeros.data(), 8, {.temperature = 1.0f, .top_k = 1, .seed = 1}), 2);
  std::vector<uint32_t> mask = {1u << 6};
  std::vector<float> none(8, 0.5f);
  none[6] = -INFINITY;
  EXPECT_EQ(sample_row(none.data(), 8, {.temperature = 1.0f, .seed = 1, .allowed = mask.data()}), 0);
}

// The edits a step's draw carries: one per biased or penalised token, none for a prompt token that only the
// repetition penalty would change when it is off (a long prompt would otherwise upload thousands of no-ops).
TEST(Sampler, EditsAreOnePerTokenTheyChange) {
  const std::vector<int32_t> prompt = {4, 5, 6, 7, 4};
  const std::vector<int32_t> generated = {9, 4, 9};
  SamplingParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  p.logit_bias = {{11, 3.0f}, {9, -1.0f}};
  Sampler s(p, 20);
  const RowDraw& d = s.next(prompt, generated);
  std::map<int32_t, LogitEdit> by_id;
  for (const LogitEdit& e : d.edits) EXPECT_TRUE(by_id.emplace(e.id, e).second) << "token " << e.id << " twice";
  ASSERT_EQ(by_id.size(), 3u);  // 9 (bias and output), 11 (bias), 4 (output); not 5, 6, 7
  EXPECT_EQ(by_id.at(9).bias, -1.0f);
  EXPECT_EQ(by_id.at(9).subtract, 0.5f + 0.25f * 2.0f);
  EXPECT_EQ(by_id.at(11).subtract, 0.0f);
  EXPECT_EQ(by_id.at(4).subtract, 0.5f + 0.25f);
  EXPECT_FALSE(by_id.at(4).repeated);
  EXPECT_EQ(d.step, 3u);
  p.repetition_penalty = 1.2f;
  Sampler r(p, 20);
  EXPECT_EQ(r.next(prompt, generated).edits.size(), 6u);  // the prompt's 5, 6, 7 too, repeated
}

// The weights' exponential (draw.h: single rounded operations, the same bits on the GPU) against libm: within
// 3·10^-7 relative over its range, exactly 1 at 0, 0 below the cutoff; and weights are whole units of 2^-40.
TEST(Draw, ExponentialAndUnits) {
  double worst = 0.0;
  for (int i = 0; i <= 100000; ++i) {
    const float x = draw::kCutoff * float(i) / 100000.0f;
    const double want = std::exp(double(x));
    worst = std::max(worst, std::fabs(double(draw::exp_nonpositive(x)) - want) / want);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(draw::exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(draw::exp_nonpositive(-28.0f), 0.0f);
  EXPECT_EQ(draw::exp_nonpositive(-INFINITY), 0.0f);
  EXPECT_EQ(draw::units(1.0f), uint64_t(1) << 40);
  EXPECT_GE(draw::units(draw::exp_nonpositive(draw::kCutoff)), 1u);
  EXPECT_EQ(draw::weight(2.5f, 2.5f, draw::inverse(0.3f)), 1.0f);
}

// logit_bias: +100 makes a token the greedy choice, −100 keeps it out; out-of-range ids and biases are refused.
TEST(Sampler, LogitBiasShiftsTheLogits) {
  const std::vector<float> l = random_logits(300, 9);
  const int32_t best = argmax(l.data(), 300);
  SamplingParams p;
  p.temperature = 0.0f;
  p.logit_bias = {{17, 100.0f}};
  EXPECT_EQ(host_draw(Sampler(p, 300), l.data(), {}, {}), 17);
  p.logit_bias = {{best, -100.0f}};
  const int32_t second = host_draw(Sampler(p, 300), l.data(), {}, {});
  EXPECT_NE(second, best);
  std::vector<float> without = l;
  without[size_t(best)] = -INFINITY;
  EXPECT_EQ(second, argmax(without.data(), 300));
  p.temperature = 1.0f;
  Sampler s(p, 300);
  std::vector<int32_t> generated;
  for (int i = 0; i < 200; ++i) {
    generated.push_back(host_draw(s, l.data(), {}, generated));
    EXPECT_NE(generated.back(), best);
  }
  p.logit_bias = {{300, 1.0f}};
  EXPECT_THROW(validate(p, 300), Error);
  p.logit_bias = {{3, 101.0f}};
  EXPECT_THROW(validate(p, 300), Error);
  p.logit_bias = {{3, NAN}};
  EXPECT_THROW(validate(p, 300), Error);
}

TEST(Sampler, RejectsOutOfRangeParameters) {
  SamplingParams p;
  p.top_p = 0.0f;
  EXPECT_THROW(validate(p, 1000), Error);
  p = {};
  p.temperature = -1.0f;
  EXPECT_THROW(validate(p, 1000), Error);
  p = {};
  p.min_p = 1.5f;
  EXPECT_THROW(validate(p, 1000), Error);
  p = {};
  p.repetition_penalty = 0.0f;
  EXPECT_THROW(validate(p, 1000), Error);
  p = {};
  p.top_k = -2;
  EXPECT_THROW(validate(p, 1000), Error);
}

TEST(TokenLogprobs, LogSoftmaxOfTheRawRowAndItsMostLikelyTokens) {
  const int64_t vocab = 997;
  for (const float offset : {0.0f, 3000.0f, -3000.0f}) {  // exp() of these alone would overflow or vanish
    std::vector<float> l = random_logits(vocab, 7);
    for (float& x : l) x += offset;
    l[400] = l[3] = offset + 9.0f;  // a tie at the top: the lower id first, as greedy picks it
    const std::vector<double> p = softmax(l, 1.0);
    const TokenLogprobs r = token_logprobs(l.data(), vocab, 400, 20);
    EXPECT_NEAR(r.logprob, std::log(p[400]), 1e-5) << offset;
    ASSERT_EQ(r.top.size(), 20u);
    EXPECT_EQ(r.top[0].first, 3);
    EXPECT_EQ(r.top[1].first, 400);
    EXPECT_EQ(r.top[1].second, r.logprob);
    std::vector<int32_t> order(size_t(vocab), 0);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[size_t(a)] > l[size_t(b)]; });
    for (size_t k = 0; k < r.top.size(); ++k) {
      EXPECT_EQ(r.top[k].first, order[k]) << k;
      EXPECT_NEAR(r.top[k].second, std::log(p[size_t(order[k])]), 1e-5);
      EXPECT_LE(r.top[k].second, 0.0f);
    }
  }
  // The whole row: a distribution (its probabilities sum to 1), in order; none asked: none computed.
  const std::vector<float> l = random_logits(50, 8);
  const TokenLogprobs all = token_logprobs(l.data(), 50, 0, 50);
  double total = 0.0;
  for (size_t k = 0; k < all.top.size(); ++k) {
    total += std::exp(double(all.top[k].second));
    if (k > 0) {
      EXPECT_LE(all.top[k].second, all.top[k - 1].second);
    }
  }
  EXPECT_NEAR(total, 1.0, 1e-5);
  EXPECT_TRUE(token_logprobs(l.data(), 50, 0, 0).top.empty());
  EXPECT_EQ(token_logprobs(l.data(), 50, 0, 1).top[0].first, argmax(l.data(), 50));
}

TEST(Sampler, AGrammarMaskKeepsOutEveryOtherToken) {
  const int64_t vocab = 1000;  // not a multiple of 32
  const std::vector<float> l = random_logits(vocab, 21);
  std::vector<uint32_t> mask(size_t((vocab + 31) / 32), 0);
  std::set<int32_t> allowed;
  for (int32_t id : {3, 64, 65, 95, 500, 999}) {
    mask[size_t(id >> 5)] |= 1u << (id & 31);
    allowed.insert(id);
  }
  for (int32_t id = 128; id < 160; ++id) mask[4] |= 1u << (id & 31), allowed.insert(id);  // a whole word
  std::vector<float> row = l;
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  ASSERT_EQ(apply_mask(row.data(), vocab, mask.data(), ids.data()), int64_t(allowed.size()));
  EXPECT_EQ(std::set<int32_t>(ids.begin(), ids.begin() + int64_t(allowed.size())), allowed);
  for (int32_t id = 0; id < vocab; ++id) EXPECT_EQ(row[size_t(id)] == l[size_t(id)], allowed.count(id) == 1) << id;

  // Greedy takes the best allowed token; sampling (with penalties, top-k, top-p) draws allowed tokens only.
  int32_t best = *allowed.begin();
  for (int32_t id : allowed) best = l[size_t(id)] > l[size_t(best)] ? id : best;
  Sampler greedy({.temperature = 0}, vocab);
  EXPECT_EQ(host_draw(greedy, l.data(), {}, {}, mask.data()), best);
  for (const SamplingParams& p : {SamplingParams{.temperature = 2.0f, .seed = 1},
                                  SamplingParams{.temperature = 0.7f, .top_k = 500, .top_p = 0.99f, .seed = 2},
                                  SamplingParams{.temperature = 1.0f, .presence_penalty = 2.0f, .seed = 3}}) {
    Sampler s(p, vocab);
    const std::vector<int32_t> prompt = {3, 64, 999};
    std::vector<int32_t> generated = prompt;
    for (int i = 0; i < 500; ++i) {
      generated.push_back(host_draw(s, l.data(), prompt, generated, mask.data()));
      EXPECT_EQ(allowed.count(generated.back()), 1u);
    }
  }
  // A single allowed token is always the one.
  std::vector<uint32_t> one(mask.size(), 0);
  one[15] = 1u << 7;  // id 487
  Sampler s({.temperature = 1.5f, .seed = 4}, vocab);
  std::vector<int32_t> generated;
  for (int i = 0; i < 50; ++i) {
    generated.push_back(host_draw(s, l.data(), {}, generated, one.data()));
    EXPECT_EQ(generated.back(), 487);
  }
}

TEST(StopMatcher, HoldsBackPartialStopsAndCutsAtTheFirst) {
  StopMatcher m({"</end>", "STOP"});
  EXPECT_EQ(m.feed("Hello </e"), "Hello ");  // "</e" may become "</end>"
  EXPECT_EQ(m.feed("xtra S"), "</extra ");   // not a stop after all; "S" may start STOP
  EXPECT_EQ(m.feed("TO"), "");
  EXPECT_EQ(m.matched(), "");
  EXPECT_EQ(m.feed("P and more"), "");       // stopped at STOP
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "STOP");
  EXPECT_EQ(m.feed("ignored"), "");
  StopMatcher n({"##"});
  EXPECT_EQ(n.feed("a#"), "a");
  EXPECT_EQ(n.flush(), "#");  // end of generation releases the held-back text
  StopMatcher both({"cd", "bc"});
  EXPECT_EQ(both.feed("abcd"), "a");  // the stop that starts first ends the text and is the one reported
  EXPECT_EQ(both.matched(), "bc");
}

}  // namespace
}  // namespace dsv4
