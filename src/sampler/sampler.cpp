#include "sampler/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace dsv4 {

void validate(const SamplingParams& p) {
  DSV4_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.0f, "temperature must be >= 0, got ", p.temperature);
  DSV4_CHECK(p.top_k >= 0, "top_k must be >= 0, got ", p.top_k);
  DSV4_CHECK(p.top_p > 0.0f && p.top_p <= 1.0f, "top_p must be in (0, 1], got ", p.top_p);
  DSV4_CHECK(p.min_p >= 0.0f && p.min_p <= 1.0f, "min_p must be in [0, 1], got ", p.min_p);
  DSV4_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f,
             "repetition_penalty must be > 0, got ", p.repetition_penalty);
  DSV4_CHECK(std::isfinite(p.presence_penalty) && std::fabs(p.presence_penalty) <= 2.0f,
             "presence_penalty must be in [-2, 2], got ", p.presence_penalty);
  DSV4_CHECK(std::isfinite(p.frequency_penalty) && std::fabs(p.frequency_penalty) <= 2.0f,
             "frequency_penalty must be in [-2, 2], got ", p.frequency_penalty);
}

int32_t argmax(const float* logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best]) best = i;
  return int32_t(best);
}

int64_t apply_mask(float* logits, int64_t vocab, const uint32_t* allowed, int32_t* ids) {
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  int64_t kept = 0;
  // A word at a time: most words of a grammar's mask are all clear (structure) or all set (inside a string).
  for (int64_t base = 0; base < vocab; base += 32) {
    const int64_t end = std::min<int64_t>(base + 32, vocab);
    const uint32_t word = allowed[base >> 5];
    if (word == 0) {
      std::fill(logits + base, logits + end, kMasked);
      continue;
    }
    if (word == ~0u && end - base == 32) {
      if (ids) std::iota(ids + kept, ids + kept + 32, int32_t(base));
      kept += 32;
      continue;
    }
    for (int64_t i = base; i < end; ++i) {
      if ((word >> (i - base)) & 1) {
        if (ids) ids[kept] = int32_t(i);
        ++kept;
      } else {
        logits[i] = kMasked;
      }
    }
  }
  return kept;
}

bool Sampler::plain_greedy() const {
  return params_.temperature == 0.0f && params_.repetition_penalty == 1.0f && params_.presence_penalty == 0.0f &&
         params_.frequency_penalty == 0.0f;
}

Sampler::Sampler(const SamplingParams& params, int64_t vocab)
    : params_(params), vocab_(vocab), rng_(params.seed), work_(size_t(vocab)), order_(size_t(vocab)),
      counts_(size_t(vocab), 0), seen_(size_t(vocab), 0), prob_(size_t(vocab)) {
  validate(params);
}

int32_t Sampler::sample(const float* logits, std::span<const int32_t> prompt, std::span<const int32_t> generated,
                        const uint32_t* allowed) {
  const SamplingParams& p = params_;
  std::copy(logits, logits + vocab_, work_.begin());
  // The candidates: every token, or the ones a grammar allows (listed in order_; the others' logits become -inf).
  const int64_t n = allowed ? apply_mask(work_.data(), vocab_, allowed, order_.data()) : vocab_;

  // Penalties: repetition over prompt + output (each token once), presence / frequency over the output.
  if (p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::fill(counts_.begin(), counts_.end(), 0);
    for (int32_t t : generated) ++counts_[size_t(t)];
    std::fill(seen_.begin(), seen_.end(), 0);
    for (int32_t t : prompt) seen_[size_t(t)] = 1;
    for (int32_t t : generated) seen_[size_t(t)] = 1;
    for (int64_t i = 0; i < vocab_; ++i) {
      float& l = work_[size_t(i)];
      if (seen_[size_t(i)] && p.repetition_penalty != 1.0f) l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
      const int32_t c = counts_[size_t(i)];
      if (c > 0) l -= p.presence_penalty + p.frequency_penalty * float(c);
    }
  }
  if (p.temperature == 0.0f) return argmax(work_.data(), vocab_);

  // Candidates sorted by logit (ties: lower id first), truncated by top-k.
  if (!allowed) std::iota(order_.begin(), order_.end(), 0);
  const int64_t k = p.top_k > 0 ? std::min(p.top_k, n) : n;
  const auto by_logit = [&](int32_t a, int32_t b) {
    return work_[size_t(a)] > work_[size_t(b)] || (work_[size_t(a)] == work_[size_t(b)] && a < b);
  };
  std::partial_sort(order_.begin(), order_.begin() + k, order_.begin() + n, by_logit);

  // Softmax at the temperature over the k candidates (double for the normalisation).
  std::vector<double>& prob = prob_;
  prob.resize(size_t(k));
  const double top = work_[size_t(order_[0])];
  double total = 0.0;
  for (int64_t i = 0; i < k; ++i)
    total += prob[size_t(i)] = std::exp((double(work_[size_t(order_[size_t(i)])]) - top) / p.temperature);
  for (double& q : prob) q /= total;
  // Tokens of probability 0 (logits of -inf: masked) are never drawn, whatever the rounding of the draw below.
  int64_t keep = k;
  while (keep > 1 && prob[size_t(keep - 1)] == 0.0) --keep;

  // top-p keeps the smallest prefix whose mass reaches top_p; min-p drops tokens below min_p · p(top).
  if (p.top_p < 1.0f) {
    double mass = 0.0;
    for (int64_t i = 0; i < keep; ++i) {
      mass += prob[size_t(i)];
      if (mass >= double(p.top_p)) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f)
    while (keep > 1 && prob[size_t(keep - 1)] < double(p.min_p) * prob[0]) --keep;

  double kept = 0.0;
  for (int64_t i = 0; i < keep; ++i) kept += prob[size_t(i)];
  double u = std::uniform_real_distribution<double>(0.0, kept)(rng_);
  for (int64_t i = 0; i < keep; ++i) {
    u -= prob[size_t(i)];
    if (u < 0.0) return order_[size_t(i)];
  }
  return order_[size_t(keep - 1)];
}

TokenLogprobs token_logprobs(const float* logits, int64_t vocab, int32_t token, int64_t top) {
  DSV4_ASSERT(token >= 0 && token < vocab && top >= 0 && top <= vocab);
  const float most = logits[argmax(logits, vocab)];
  double total = 0.0;
  for (int64_t i = 0; i < vocab; ++i) total += std::exp(double(logits[i]) - double(most));
  const double log_z = double(most) + std::log(total);
  const auto logprob = [&](int64_t i) { return float(double(logits[i]) - log_z); };

  TokenLogprobs out;
  out.logprob = logprob(token);
  // The `top` best ids by one pass, kept sorted (top ≤ 20 in the APIs: an insertion is rare and short).
  std::vector<int32_t> best;
  const auto before = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  for (int32_t i = 0; i < int32_t(vocab) && top > 0; ++i) {
    if (int64_t(best.size()) == top && !before(i, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), i, before), i);
    if (int64_t(best.size()) > top) best.pop_back();
  }
  for (int32_t id : best) out.top.emplace_back(id, logprob(id));
  return out;
}

std::string StopMatcher::feed(const std::string& text) {
  if (stopped_) return "";
  pending_ += text;
  size_t first = std::string::npos;
  for (const auto& s : stops_) {
    const size_t at = s.empty() ? std::string::npos : pending_.find(s);
    if (at < first) first = at, matched_ = s;
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_)
    for (size_t n = std::min(s.size() - (s.empty() ? 0 : 1), pending_.size()); n > hold; --n)
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::flush() {
  std::string out = stopped_ ? "" : pending_;
  pending_.clear();
  return out;
}

}  // namespace dsv4
