#include "sampler/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "sampler/draw.h"

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
  for (const auto& [id, bias] : p.logit_bias) {
    DSV4_CHECK(id >= 0, "logit_bias: token id ", id, " is negative");
    DSV4_CHECK(std::isfinite(bias) && std::fabs(bias) <= 100.0f, "logit_bias: the bias of token ", id,
               " must be in [-100, 100], got ", bias);
  }
}

void validate(const SamplingParams& p, int64_t vocab) {
  validate(p);
  for (const auto& [id, bias] : p.logit_bias)
    DSV4_CHECK(id < vocab, "logit_bias: token id ", id, " is outside the vocabulary [0, ", vocab, ")");
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

Sampler::Sampler(const SamplingParams& params, int64_t vocab)
    : params_(params), vocab_(vocab),
      penalised_(params.repetition_penalty != 1.0f || params.presence_penalty != 0.0f ||
                 params.frequency_penalty != 0.0f) {
  validate(params, vocab);
  if (penalised_) counts_.assign(size_t(vocab), 0), seen_.assign(size_t(vocab), 0);
  if (penalised_ || !params.logit_bias.empty()) edit_of_.assign(size_t(vocab), -1);
  draw_ = {params.temperature, params.top_k, params.top_p, params.min_p, params.repetition_penalty, params.seed};
}

const RowDraw& Sampler::next(std::span<const int32_t> prompt, std::span<const int32_t> generated,
                             const uint32_t* allowed) {
  DSV4_ASSERT(prompt.size() >= prompt_seen_ && generated.size() >= generated_seen_);
  const auto see = [&](int32_t t) {
    if (!seen_[size_t(t)]) seen_[size_t(t)] = 1, touched_.push_back(t);
  };
  if (penalised_) {
    for (; prompt_seen_ < prompt.size(); ++prompt_seen_) see(prompt[prompt_seen_]);
    for (; generated_seen_ < generated.size(); ++generated_seen_) {
      see(generated[generated_seen_]);
      ++counts_[size_t(generated[generated_seen_])];
    }
  }
  // One edit per token: the bias, then the penalties of the tokens seen.
  edits_.clear();
  const auto edit = [&](int32_t t) -> LogitEdit& {
    int32_t& at = edit_of_[size_t(t)];
    if (at < 0) at = int32_t(edits_.size()), edits_.push_back({t});
    return edits_[size_t(at)];
  };
  for (const auto& [t, bias] : params_.logit_bias) edit(t).bias += bias;
  const bool repetition = params_.repetition_penalty != 1.0f;
  for (int32_t t : touched_) {
    const int32_t c = counts_[size_t(t)];
    if (!repetition && c == 0) continue;  // a prompt token only the repetition penalty would touch
    LogitEdit& e = edit(t);
    e.repeated = repetition;
    if (c > 0) e.subtract = params_.presence_penalty + params_.frequency_penalty * float(c);
  }
  for (const LogitEdit& e : edits_) edit_of_[size_t(e.id)] = -1;
  draw_.step = generated.size();
  draw_.allowed = allowed;
  draw_.edits = edits_;
  return draw_;
}

int32_t sample_row(const float* logits, int64_t vocab, const RowDraw& d) {
  std::vector<float> l(logits, logits + vocab);
  for (const LogitEdit& e : d.edits) {
    float& x = l[size_t(e.id)];
    x = x + e.bias;
    if (e.repeated) x = x > 0.0f ? x / d.repetition_penalty : x * d.repetition_penalty;
    x = x - e.subtract;
  }
  if (d.allowed) apply_mask(l.data(), vocab, d.allowed);
  const int32_t top = argmax(l.data(), vocab);
  if (d.temperature < draw::kGreedyBelow) return top;

  // Weights in integer units; the tokens of weight 0 can never be drawn and rank after every other.
  std::vector<uint64_t> units(static_cast<size_t>(vocab));
  std::vector<float> w(static_cast<size_t>(vocab));
  std::vector<int32_t> order;
  const float inv_T = draw::inverse(d.temperature);
  for (int64_t i = 0; i < vocab; ++i) {
    w[size_t(i)] = draw::weight(l[size_t(i)], l[size_t(top)], inv_T);
    units[size_t(i)] = draw::units(w[size_t(i)]);
    if (units[size_t(i)] > 0) order.push_back(int32_t(i));
  }
  // The top-k candidates in rank order (ranks matter only to the top-k and the nucleus: no sort without them).
  const auto by_rank = [&](int32_t a, int32_t b) {
    return l[size_t(a)] > l[size_t(b)] || (l[size_t(a)] == l[size_t(b)] && a < b);
  };
  const size_t k = d.top_k > 0 ? std::min(size_t(d.top_k), order.size()) : order.size();
  if (k < order.size() || d.top_p < 1.0f) {
    std::partial_sort(order.begin(), order.begin() + ptrdiff_t(k), order.end(), by_rank);
    order.resize(k);
  }
  // The nucleus: a prefix of them, cut where the mass ranked before a token reaches top_p of theirs.
  if (d.top_p < 1.0f) {
    uint64_t Z = 0;
    for (int32_t t : order) Z += units[size_t(t)];
    const uint64_t threshold = draw::nucleus_threshold(d.top_p, Z);
    uint64_t before = 0;
    size_t keep = 0;
    while (keep < order.size() && before < threshold) before += units[size_t(order[keep++])];
    order.resize(keep);
  }
  // min-p, then the draw over the kept tokens in lane order.
  std::vector<uint8_t> kept(static_cast<size_t>(vocab), 0);
  uint64_t total = 0;
  for (int32_t t : order)
    if (w[size_t(t)] >= d.min_p) kept[size_t(t)] = 1, total += units[size_t(t)];
  if (total == 0) return top;  // every allowed logit -inf
  const uint64_t target = draw::target(d.seed, d.step, total);
  uint64_t run = 0;
  for (int64_t lane = 0; lane < draw::kLanes; ++lane)
    for (int64_t i = lane; i < vocab; i += draw::kLanes) {
      if (!kept[size_t(i)]) continue;
      run += units[size_t(i)];
      if (run > target) return int32_t(i);
    }
  DSV4_ASSERT(false && "the draw is past the kept mass");
  return top;
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
