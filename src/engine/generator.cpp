#include "engine/generator.h"

#include <chrono>

#include "core/error.h"

namespace dsv4 {

double GenerationStats::decode_tokens_per_second() const {
  return generated_tokens > 1 && decode_seconds > 0 ? double(generated_tokens - 1) / decode_seconds : 0.0;
}

void prefill(DeepseekV4& model, const std::vector<int32_t>& tokens, std::vector<float>* last) {
  DSV4_CHECK(!tokens.empty(), "the prompt is empty");
  last->resize(size_t(model.config().vocab_size));
  for (size_t p = 0; p < tokens.size(); p += size_t(model.max_step())) {
    const int64_t n = std::min<int64_t>(model.max_step(), int64_t(tokens.size() - p));
    model.step(tokens.data() + p, n, last->data(), /*all_rows=*/false);
  }
}

GenerationStats generate(DeepseekV4& model, const std::vector<int32_t>& prompt, int64_t max_tokens, Sampler& sampler,
                         bool stop_at_eos, const std::function<bool(int32_t)>& on_token) {
  using clock = std::chrono::steady_clock;
  GenerationStats stats;
  stats.prompt_tokens = int64_t(prompt.size());
  std::vector<float> logits;
  const auto t0 = clock::now();
  prefill(model, prompt, &logits);
  const auto t1 = clock::now();
  std::vector<int32_t> generated;
  while (int64_t(generated.size()) < max_tokens) {
    const int32_t next = sampler.sample(logits.data(), prompt, generated);
    generated.push_back(next);
    const bool keep_going = on_token(next);
    if (!keep_going || (stop_at_eos && next == model.config().eos_token_id)) break;
    if (int64_t(generated.size()) == max_tokens) break;
    model.step(&next, 1, logits.data(), /*all_rows=*/false);
  }
  stats.generated_tokens = int64_t(generated.size());
  stats.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  stats.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return stats;
}

}  // namespace dsv4
