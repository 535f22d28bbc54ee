// The DeepSeek-V4 forward pass, written against the Ops seam. One short function per component of the
// architecture (spec §4–§10); every intermediate is a named buffer of the activation arena.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "model/ops.h"
#include "model/state.h"

namespace dsv4 {

// Activation arena: every intermediate of one step of up to max_step tokens, allocated once.
struct Activations {
  int64_t max_step = 0;
  int32_t* tokens = nullptr;  // [n]
  int32_t* greedy = nullptr;  // [n] the greedy next token of each logits row
  float* X = nullptr;         // [n, hc, D] residual streams
  float* x = nullptr;         // [n, D] collapsed sub-block input
  float* xn = nullptr;        // [n, D] normed sub-block input
  float* post = nullptr;      // [n, hc]
  float* comb = nullptr;      // [n, hc, hc]
  float* qr = nullptr;        // [n, r_q]
  float* q = nullptr;         // [n, H, d]
  float* kv = nullptr;        // [n, d]
  float* o = nullptr;         // [n, H, d]
  float* z = nullptr;         // [n, G·r_o]
  float* sub_out = nullptr;   // [n, D] attention or MoE output
  float* index_q = nullptr;   // [n, n_I, d_I]
  float* index_w = nullptr;   // [n, n_I]
  int32_t* selected = nullptr;  // [n, k_I]
  float* y = nullptr;         // [n, D] head input
  float* y_rows = nullptr;    // [n, D] the head input rows whose logits were asked for, gathered
  float* logits = nullptr;    // [n, V]
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
  // host: the greedy next token (argmax of the last token's logits, chosen on the backend: only the id crosses
  // to the host when no input of the step asks for logits); nullptr = none wanted.
  int32_t* next_token = nullptr;
};

class DeepseekV4 {
 public:
  DeepseekV4(const ModelWeights& model, Ops& ops, Numerics numerics, int64_t max_context, int64_t max_step = 64);

  const ModelConfig& config() const { return model_.config; }
  int64_t max_step() const { return act_.max_step; }
  int64_t position() const { return state_.position; }
  bool has_mtp() const { return !model_.mtp.empty(); }
  void reset() { state_.reset(model_, ops_); }

  // Per-sequence state for batched steps (the model also owns one default sequence, used by the
  // single-sequence step below). Sized for max_context tokens; allocated at load, never in the decode loop.
  std::unique_ptr<SequenceState> new_sequence(int64_t max_context);
  void reset(SequenceState& sequence) { sequence.reset(model_, ops_); }

  // One forward step over several sequences: their tokens are concatenated (Σ n ≤ max_step) so every matrix
  // multiply runs once over the whole batch; attention and the compressors run per sequence on their rows, in
  // batched ops (ops.h).
  void step(std::span<const StepInput> batch);

  // The default sequence: consumes n ≤ max_step tokens at positions position() .. position()+n−1 and writes
  // logits to host memory: all n rows ([n, V]) when all_rows, otherwise only the last row ([V]).
  // The final residual streams of these tokens stay in the arena for mtp_step().
  void step(const int32_t* tokens, int64_t n, float* logits, bool all_rows, int32_t* next_token = nullptr);

  // MTP draft logits [n, V] for the tokens of the last single-sequence step(): row i from the main model's
  // final streams at that step's token i and next_tokens[i] (the true or sampled token that follows it).
  void mtp_step(const int32_t* next_tokens, int64_t n, float* logits);

 private:
  // A sequence's rows within the step: rows [row0, row0 + n) at positions pos0 … pos0 + n − 1.
  struct Span {
    int64_t row0, n, pos0;
    SequenceState* sequence;
  };
  // `layer` indexes SequenceState::layers (mtp = false) or ::mtp (mtp = true).
  void block(const LayerWeights& l, size_t layer, bool mtp, int64_t n);
  void hc_pre(const HcWeights& hc, const std::vector<float>& norm, int64_t n);
  void hc_post(int64_t n);
  void attention(const LayerWeights& l, size_t layer, bool mtp, int64_t n);
  void query(const AttentionWeights& w, int64_t n);
  void finish_query_key_value(const AttentionWeights& w, size_t layer, bool mtp, RopeKind rope);
  void compress(const CompressorWeights& w, size_t layer, bool mtp, CompressorState LayerState::*which, EntrySim sim);
  void indexer_query(const IndexerWeights& w, int64_t n);
  void indexer(const IndexerWeights& w, size_t layer, bool mtp);
  void output_projection(const AttentionWeights& w, int64_t n);
  void moe(const LayerWeights& l, int64_t n);
  // Logits of the rows the batch asked for, on the device (returns how many rows), then to each input's buffer.
  int64_t head(const HcHeadWeights& hc, const std::vector<float>& norm, std::span<const StepInput> batch, int64_t n);
  void deliver(std::span<const StepInput> batch, int64_t rows);

  LayerState& layer_state(const Span& s, size_t layer, bool mtp) const {
    return mtp ? s.sequence->mtp[layer] : s.sequence->layers[layer];
  }

  const ModelWeights& model_;
  Ops& ops_;
  Numerics numerics_;
  SequenceState state_;
  Activations act_;
  std::vector<Span> spans_;        // the current step's sequences
  // The per-sequence ops' batches of the current layer, one entry per sequence (kept: no allocation per step).
  std::vector<QueryKvParams> query_kv_batch_;
  std::vector<CompressorParams> compressor_batch_;
  std::vector<IndexerParams> indexer_batch_;
  std::vector<AttentionParams> attention_batch_;
  std::vector<std::pair<int64_t, int64_t>> head_runs_;  // head(): the rows that need logits, as (first, count) runs of y
  std::vector<float> host_logits_;  // gathered logits rows of one step, before scattering
  std::vector<int32_t> host_tokens_;  // greedy ids of those rows

};

}  // namespace dsv4
