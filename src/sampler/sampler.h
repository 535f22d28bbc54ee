// Token selection from a row of logits. Greedy (temperature 0) picks the lowest id among exact maxima.
#pragma once

#include <cstdint>
#include <random>

namespace dsv4 {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}
  int32_t sample(const float* logits, int64_t vocab);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

int32_t argmax(const float* logits, int64_t vocab);

}  // namespace dsv4
