// Token selection from a row of logits, as OpenAI-style servers define it: logit bias and penalties, a grammar's
// mask, then temperature, top-k, top-p and min-p filtering, then a seeded draw from what remains (RowDraw).
// Temperature 0 is greedy: the lowest id among the exact maxima after the edits.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "sampler/draw.h"

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
  std::vector<std::pair<int32_t, float>> logit_bias{};  // (token id, added to its logit before the penalties)
};

// Throws Error naming the parameter when a value is out of range; the second also checks logit_bias's ids
// against the vocabulary.
void validate(const SamplingParams& p);
void validate(const SamplingParams& p, int64_t vocab);

// One token's logit before the draw: l ← l + bias; if `repeated`, l ← l / rp when l > 0, else l · rp; then
// l ← l − subtract (presence + frequency · occurrences). Each a single rounded float operation, on both backends.
struct LogitEdit {
  int32_t id = 0;
  bool repeated = false;
  float bias = 0.0f;
  float subtract = 0.0f;
};

// One row's draw, as the backends make it (sample_row here, cuda::sample_rows on the GPU, the same token):
//   1. the edits, then the grammar's mask (the others' logits become -inf);
//   2. temperature 0 (below draw::kGreedyBelow): the lowest id among the maxima. Otherwise every token gets a
//      weight w = e^((l − max) / T) in integer units (draw.h);
//   3. the candidates are the top_k first in rank order (logit descending, id ascending), of those the nucleus
//      (the tokens whose candidates ranked before them weigh less than top_p of the candidates' weight), of
//      those the ones with w ≥ min_p;
//   4. Philox of (seed, step) picks a point of the kept weight; walking the kept tokens in draw::kLanes order
//      (by id mod 1024, then id), the token whose interval holds it is drawn.
struct RowDraw {
  float temperature = 0.0f;
  int64_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  uint64_t seed = 0;
  uint64_t step = 0;                  // which draw of the sequence: the tokens generated before it
  const uint32_t* allowed = nullptr;  // a grammar's mask, [ceil(vocab / 32)] words (bit id % 32 of word id / 32)
  std::span<const LogitEdit> edits{};  // one per token id at most
  bool greedy() const { return temperature < draw::kGreedyBelow && edits.empty() && !allowed; }
};

// The token row `logits` [vocab] gives under `d` (not modified).
int32_t sample_row(const float* logits, int64_t vocab, const RowDraw& d);

// A request's draws: the sampling parameters with the penalties' token history, one RowDraw per step.
class Sampler {
 public:
  Sampler(const SamplingParams& params, int64_t vocab);

  // The draw of the token after `generated` (prompt and generated only grow from call to call). The RowDraw
  // points into this sampler and `allowed`: valid until the next call.
  const RowDraw& next(std::span<const int32_t> prompt, std::span<const int32_t> generated,
                      const uint32_t* allowed = nullptr);
  int64_t vocab() const { return vocab_; }

 private:
  SamplingParams params_;
  int64_t vocab_;
  bool penalised_;
  // The token history, taken in as it grows: occurrences in the output, and whether a token was seen at all.
  size_t prompt_seen_ = 0, generated_seen_ = 0;
  std::vector<int32_t> counts_;    // [vocab]
  std::vector<uint8_t> seen_;      // [vocab]
  std::vector<int32_t> touched_;   // ids seen, in first-seen order
  std::vector<LogitEdit> edits_;   // this step's, one per id of touched_ or logit_bias
  std::vector<int32_t> edit_of_;   // [vocab] (with bias or penalties) index into edits_ while building it, else −1
  RowDraw draw_;
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

// The most alternatives token_logprobs gives on every backend (the CUDA kernel gathers them in shared memory).
constexpr int64_t kLogprobsLimit = 1024;

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
