#include "sampler/sampler.h"

#include <cmath>
#include <vector>

namespace dsv4 {

int32_t argmax(const float* logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best]) best = i;
  return int32_t(best);
}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  if (params_.temperature <= 0.0f) return argmax(logits, vocab);
  const float mx = logits[argmax(logits, vocab)];
  std::vector<double> p(static_cast<size_t>(vocab));
  double total = 0.0;
  for (int64_t i = 0; i < vocab; ++i) total += (p[size_t(i)] = std::exp(double(logits[i] - mx) / params_.temperature));
  double u = std::uniform_real_distribution<double>(0.0, total)(rng_);
  for (int64_t i = 0; i < vocab; ++i) {
    u -= p[size_t(i)];
    if (u < 0.0) return int32_t(i);
  }
  return int32_t(vocab - 1);
}

}  // namespace dsv4
