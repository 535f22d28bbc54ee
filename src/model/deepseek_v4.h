// The DeepSeek-V4 forward pass, written against the Ops seam. One short function per component of the
// architecture (spec §4–§10); every intermediate is a named buffer of the activation arena. With several ranks
// (model/parallel.h) each runs the same pass on its shard.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "model/ops.h"
#include "model/state.h"

namespace dsv4 {

// Logits rows the arena holds at once (DeepseekV4's logit_rows): a step that asks for more (every row of a long
// prompt: perplexity, logits) runs the LM head in chunks of these. [rows, vocab] fp32 is half of a V4 step token's
// activations, and generation asks one row a sequence.
constexpr int64_t kLogitRows = 256;

// Activation arena: every intermediate of one step of up to max_step tokens, allocated once.
struct Activations {
  int64_t max_step = 0;
  int64_t logit_rows = 0;     // rows of logits and logits_full: min(max_step, the model's logit_rows)
  int32_t* tokens = nullptr;  // [n]
  int32_t* greedy = nullptr;  // [n] the next token of each logits row, greedy or drawn
  float* greedy_values = nullptr;  // [n] its logit (ranks that share the vocabulary compare them)
  float* X = nullptr;         // [n, hc, D] residual streams
  float* x = nullptr;         // [n, D] collapsed sub-block input
  float* xn = nullptr;        // [n, D] normed sub-block input
  E4m3Rows xnq;               // [n, D] xn act_quant'ed for its FP8 GEMMs (fast numerics; codes = nullptr otherwise)
  float* post = nullptr;      // [n, hc]
  float* comb = nullptr;      // [n, hc, hc]
  float* qr = nullptr;        // [n, r_q]
  E4m3Rows qrq;               // [n, r_q] the normed qr act_quant'ed, as xnq
  float* q = nullptr;         // [n, H, d]
  Bf16Rows qb;                // [n, H, d] the query heads in bf16, instead of q where the backend takes them (as ob)
  float* kv = nullptr;        // [n, d]
  float* o = nullptr;         // [n, H, d]
  Bf16Rows ob;                // [n, H, d] the attention's output in bf16, instead of o where the backend takes it
                              // (fast numerics, Ops::bf16_rows_pay; data = nullptr otherwise)
  float* z = nullptr;         // [n, G·r_o]
  float* sub_out = nullptr;   // [n, D] attention or MoE output
  float* index_q = nullptr;   // [n, n_I, d_I]
  float* index_w = nullptr;   // [n, n_I]
  int32_t* selected = nullptr;  // [n, k_I]
  float* y = nullptr;         // [n, D] head input
  float* y_rows = nullptr;    // [n, D] the head input rows whose logits were asked for, gathered
  float* logits = nullptr;    // [logit_rows, V] (several ranks: [logit_rows, V_r], this rank's columns)
  float* logits_full = nullptr;  // several ranks: [logit_rows, V] every rank's columns, for draws and log-probabilities
  float* mtp_e = nullptr;     // [n, D]
  float* mtp_h = nullptr;     // [n, hc, D]
};

// One sequence's share of a batched step: n ≥ 1 tokens at positions sequence->position … + n − 1.
struct StepInput {
  SequenceState* sequence = nullptr;
  const int32_t* tokens = nullptr;  // host [n]
  int64_t n = 0;
  float* logits = nullptr;  // host: [n, V] when all_rows, else the last token's [V]; nullptr = none wanted
  bool all_rows = false;
  // host: the next token, chosen on the backend from the last token's logits under `draw` (sampler.h; the
  // greedy argmax without one): only the id crosses to the host. nullptr = none wanted.
  int32_t* next_token = nullptr;
  const RowDraw* draw = nullptr;
  // host, with next_token: that token's raw log-probability and the `top_logprobs` most likely; nullptr = none.
  TokenLogprobs* logprobs = nullptr;
  int64_t top_logprobs = 0;
};

// The model over one or several ranks (model/parallel.h). Every rank runs the same forward pass on its shard,
// rank 0 on the calling thread and each other rank on a thread of its own; the public calls below return once
// every rank has finished. Rank 0 computes the logits.
class DeepseekV4 {
 public:
  // The whole model on one backend. logit_rows: the logits rows held at once (kLogitRows).
  DeepseekV4(const ModelWeights& model, Ops& ops, Numerics numerics, int64_t max_context, int64_t max_step = 64,
             int64_t logit_rows = kLogitRows);
  // `model` split over shards (shard_model), shard r run by its backend; `model` is the full model the shards view.
  DeepseekV4(const ModelWeights& model, std::span<const Shard> shards, Numerics numerics, int64_t max_context,
             int64_t max_step = 64, int64_t logit_rows = kLogitRows);
  ~DeepseekV4();

  const ModelConfig& config() const { return model_.config; }  // the full model's
  int ranks() const { return int(shards_.size()); }
  int64_t max_step() const { return max_step_; }
  int64_t position() const { return state_->position; }
  bool has_mtp() const { return !model_.mtp.empty(); }
  void reset() { state_->reset(shards_); }

  // Per-sequence state for batched steps (the model also owns one default sequence, used by the
  // single-sequence step below). Sized for max_context tokens; allocated at load, never in the decode loop.
  std::unique_ptr<SequenceState> new_sequence(int64_t max_context);
  void reset(SequenceState& sequence) { sequence.reset(shards_); }
  // Makes dst a copy of src (the same context at the same position), on every rank.
  void copy_sequence(const SequenceState& src, SequenceState& dst);

  // One forward step over several sequences: their tokens are concatenated (Σ n ≤ max_step) so every matrix
  // multiply runs once over the whole batch; attention and the compressors run per sequence on their rows, in
  // batched ops (ops.h).
  void step(std::span<const StepInput> batch);

  // The default sequence: consumes n ≤ max_step tokens at positions position() .. position()+n−1 and writes
  // logits to host memory: all n rows ([n, V]) when all_rows, otherwise only the last row ([V]).
  // The final residual streams of these tokens stay in the arena for mtp_step().
  // next_token / draw as StepInput's.
  void step(const int32_t* tokens, int64_t n, float* logits, bool all_rows, int32_t* next_token = nullptr,
            const RowDraw* draw = nullptr);

  // MTP draft logits [n, V] for the tokens of the last single-sequence step(): row i from the main model's
  // final streams at that step's token i and next_tokens[i] (the true or sampled token that follows it).
  void mtp_step(const int32_t* next_tokens, int64_t n, float* logits);

 private:
  struct Span;    // a sequence's rows in the step
  class Rank;     // one shard's forward pass (deepseek_v4.cpp)
  class Workers;  // the threads of ranks 1..N−1

  // Runs fn(rank) on every rank, in parallel; rethrows the first failure once all have stopped.
  template <class Fn>
  void on_ranks(Fn&& fn);
  // The ranks' results of the last step (each its share of the vocabulary) into the inputs' host buffers.
  void deliver(std::span<const StepInput> batch);

  const ModelWeights& model_;
  std::vector<Shard> shards_;
  Numerics numerics_;
  int64_t max_step_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::unique_ptr<Workers> workers_;
  std::unique_ptr<SequenceState> state_;
  std::vector<Span> spans_;  // the current step's sequences
};

}  // namespace dsv4
