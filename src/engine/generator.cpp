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
  const int64_t n = int64_t(prompt.size());
  DSV4_CHECK(n >= 1, "the prompt is empty");
  stats.prompt_tokens = n;
  std::vector<int32_t> generated;
  // Each token is chosen on the backend (the last step of the prompt chooses the first): only its id crosses to
  // the host.
  int32_t next = -1;
  const auto t0 = clock::now();
  for (int64_t p = 0; p < n; p += model.max_step()) {
    const int64_t rows = std::min(model.max_step(), n - p);
    const bool last = p + rows == n;
    model.step(prompt.data() + p, rows, nullptr, false, last ? &next : nullptr,
               last ? &sampler.next(prompt, generated) : nullptr);
  }
  const auto t1 = clock::now();
  while (int64_t(generated.size()) < max_tokens) {
    generated.push_back(next);
    const bool keep_going = on_token(next);
    if (!keep_going || (stop_at_eos && next == model.config().eos_token_id)) break;
    if (int64_t(generated.size()) == max_tokens) break;
    const int32_t input = next;
    model.step(&input, 1, nullptr, /*all_rows=*/false, &next, &sampler.next(prompt, generated));
  }
  stats.generated_tokens = int64_t(generated.size());
  stats.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  stats.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return stats;
}

}  // namespace dsv4
