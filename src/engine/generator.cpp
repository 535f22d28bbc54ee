#include "engine/generator.h"

#include <chrono>

#include "core/error.h"

namespace dsv4 {

double GenerationStats::decode_tokens_per_second() const {
  return generated_tokens > 1 && decode_seconds > 0 ? double(generated_tokens - 1) / decode_seconds : 0.0;
}

void prefill(DeepseekV4& model, const int32_t* tokens, int64_t n, float* logits, bool all_rows) {
  DSV4_CHECK(n >= 1, "the prompt is empty");
  const int64_t V = model.config().vocab_size;
  for (int64_t p = 0; p < n; p += model.max_step()) {
    const int64_t rows = std::min(model.max_step(), n - p);
    model.step(tokens + p, rows, all_rows ? logits + p * V : logits, all_rows);
  }
}

GenerationStats generate(DeepseekV4& model, const std::vector<int32_t>& prompt, int64_t max_tokens, Sampler& sampler,
                         bool stop_at_eos, const std::function<bool(int32_t)>& on_token) {
  using clock = std::chrono::steady_clock;
  GenerationStats stats;
  stats.prompt_tokens = int64_t(prompt.size());
  std::vector<float> logits(size_t(model.config().vocab_size));  // the row the next token is sampled from
  const auto t0 = clock::now();
  prefill(model, prompt.data(), int64_t(prompt.size()), logits.data(), /*all_rows=*/false);
  const auto t1 = clock::now();
  std::vector<int32_t> generated;
  // Plain greedy decoding lets the backend choose each next token: only its id crosses to the host.
  const bool on_backend = sampler.plain_greedy();
  int32_t next = sampler.sample(logits.data(), prompt, generated);
  while (int64_t(generated.size()) < max_tokens) {
    generated.push_back(next);
    const bool keep_going = on_token(next);
    if (!keep_going || (stop_at_eos && next == model.config().eos_token_id)) break;
    if (int64_t(generated.size()) == max_tokens) break;
    const int32_t input = next;
    if (on_backend) {
      model.step(&input, 1, nullptr, /*all_rows=*/false, &next);
    } else {
      model.step(&input, 1, logits.data(), /*all_rows=*/false);
      next = sampler.sample(logits.data(), prompt, generated);
    }
  }
  stats.generated_tokens = int64_t(generated.size());
  stats.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  stats.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return stats;
}

}  // namespace dsv4
