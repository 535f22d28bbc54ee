// Token selection from a row of logits, as OpenAI-style servers define it: a grammar's mask, penalties, then
// temperature, then top-k, top-p and min-p filtering, then a draw from the remaining distribution (seeded,
// reproducible).
// Temperature 0 is greedy: the lowest id among the exact maxima after penalties.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dsv4 {

struct SamplingParams {
  float temperature = 1.0f;         // 0 = greedy
  int64_t top_k = 0;                // 0 = off
  float top_p = 1.0f;               // nucleus mass kept, (0, 1]
  float min_p = 0.0f;               // drop tokens below min_p · p(max), [0, 1]
  float repetition_penalty = 1.0f;  // > 0; tokens seen in prompt or output: logit / rp if > 0, else · rp
  float presence_penalty = 0.0f;    // subtracted once from every token already generated
  float frequency_penalty = 0.0f;   // subtracted per occurrence in the generated tokens
  uint64_t seed = 0;
};

// Throws Error naming the parameter when a value is out of range.
void validate(const SamplingParams& p);

class Sampler {
 public:
  Sampler(const SamplingParams& params, int64_t vocab);

  // logits [vocab] (not modified); prompt / generated: token history for the penalties. allowed: a bit set of
  // the tokens that may be drawn ([ceil(vocab / 32)] words, bit id % 32 of word id / 32; a grammar's mask, at
  // least one bit set); the others count as logits of -inf. Null: all of them.
  int32_t sample(const float* logits, std::span<const int32_t> prompt, std::span<const int32_t> generated,
                 const uint32_t* allowed = nullptr);
  // Temperature 0 without penalties: sample() is argmax(logits), which the backend can choose itself
  // (StepInput::next_token) so that the logits never cross to the host.
  bool plain_greedy() const;

 private:
  SamplingParams params_;
  int64_t vocab_;
  std::mt19937_64 rng_;
  std::vector<float> work_;      // [vocab] penalised logits
  std::vector<int32_t> order_;   // [vocab] candidate ids
  std::vector<int32_t> counts_;  // [vocab] occurrences in the generated tokens
  std::vector<uint8_t> seen_;    // [vocab] token occurs in prompt or output
  std::vector<double> prob_;     // [≤ vocab] candidate probabilities
};

int32_t argmax(const float* logits, int64_t vocab);

// Sets logits [vocab] to -inf where `allowed` ([ceil(vocab / 32)] words, bit id % 32 of word id / 32) is clear; returns
// how many stay. Token ids of the allowed ones go to `ids` when it is not null ([vocab] room).
int64_t apply_mask(float* logits, int64_t vocab, const uint32_t* allowed, int32_t* ids = nullptr);

// A sampled token's log-probability and the most likely tokens', under the model's raw distribution: the
// log-softmax of the logits row, before penalties, temperature and top-k / top-p / min-p (what vLLM reports by
// default, its "raw_logprobs" mode). Under greedy decoding the chosen token is top[0].
struct TokenLogprobs {
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // (id, logprob), most likely first; equal logits: lower id first
};

// The log-softmax of logits [vocab] at `token`, and its `top` (≤ vocab) most likely entries. Stable for any
// finite logits: the maximum is subtracted and the normaliser summed in double.
TokenLogprobs token_logprobs(const float* logits, int64_t vocab, int32_t token, int64_t top);

// Finds stop strings in streamed text. feed() returns the text that is safe to emit now: it holds back any
// suffix that could still grow into a stop string, and cuts the output at the first stop string found.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  std::string feed(const std::string& text);
  std::string flush();  // end of generation: release what was held back (nothing once stopped)
  bool stopped() const { return stopped_; }
  // The stop string that ended the text (the one found earliest; empty while not stopped).
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace dsv4
