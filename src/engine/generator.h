// One sequence through the model: prefill a prompt in steps, then decode token by token, reporting each new
// token to a callback. Shared by the generate, chat and perplexity commands.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/deepseek_v4.h"
#include "sampler/sampler.h"

namespace dsv4 {

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;  // = time to first token (the first token is sampled from the prefill logits)
  double decode_seconds = 0;   // from the first token to the last
  double decode_tokens_per_second() const;
};

// Feeds tokens[0, n) (n ≥ 1) at the model's current position in steps of max_step. logits (host): [n, V] when
// all_rows, else the last token's [V].
void prefill(DeepseekV4& model, const int32_t* tokens, int64_t n, float* logits, bool all_rows);

// Continues from the logits of the last consumed token. on_token returns false to stop early.
// Stops at max_tokens, or after EOS when stop_at_eos.
GenerationStats generate(DeepseekV4& model, const std::vector<int32_t>& prompt, int64_t max_tokens, Sampler& sampler,
                         bool stop_at_eos, const std::function<bool(int32_t)>& on_token);

}  // namespace dsv4
