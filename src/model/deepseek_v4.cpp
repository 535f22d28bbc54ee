#include "model/deepseek_v4.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "core/error.h"

namespace dsv4 {

namespace {

// quantised: fast numerics, whose FP8 GEMMs read xn and the normed qr act_quant'ed by their producers, and whose
// query heads and attention output may travel in bf16.
Activations plan_activations(const ModelConfig& c, Ops& ops, int64_t n, int64_t logit_rows, bool several,
                             bool quantised) {
  const auto f = [&](int64_t count) { return ops.alloc(size_t(n * count)); };
  Activations a;
  a.max_step = n;
  a.logit_rows = std::min(n, logit_rows);
  a.tokens = ops.alloc_i32(size_t(n));
  a.greedy = ops.alloc_i32(size_t(n));
  a.greedy_values = f(1);
  a.X = f(c.hc_mult * c.dim);
  a.x = f(c.dim);
  a.xn = f(c.dim);
  if (quantised && c.dim % 128 == 0) a.xnq = ops.alloc_e4m3(n, c.dim);
  if (quantised && c.q_lora_rank % 128 == 0) a.qrq = ops.alloc_e4m3(n, c.q_lora_rank);
  a.post = f(c.hc_mult);
  a.comb = f(c.hc_mult * c.hc_mult);
  a.qr = f(c.q_lora_rank);
  a.q = f(c.n_heads * c.head_dim);
  a.kv = f(c.head_dim);
  a.o = f(c.n_heads * c.head_dim);
  a.z = f(c.o_groups * c.o_lora_rank);
  a.sub_out = f(c.dim);
  a.index_q = f(std::max<int64_t>(c.index_n_heads * c.index_head_dim, 1));
  a.index_w = f(std::max<int64_t>(c.index_n_heads, 1));
  a.selected = ops.alloc_i32(size_t(n * std::max<int64_t>(c.index_topk, 1)));
  a.y = f(c.dim);
  a.y_rows = f(c.dim);
  a.logits = ops.alloc(size_t(a.logit_rows * c.vocab_size));
  if (several) a.logits_full = ops.alloc(size_t(a.logit_rows * c.vocab_size));
  a.mtp_e = f(c.dim);
  a.mtp_h = f(c.hc_mult * c.dim);
  // Last: placed among the buffers above it moved decode time by 1–2% though decode never reads it (the cause is
  // not measured; docs/design/fast-numerics.md §9).
  if (quantised) {
    a.ob = ops.alloc_bf16(n, c.n_heads * c.head_dim);
    a.qb = ops.alloc_bf16(n, c.n_heads * c.head_dim);
  }
  return a;
}

RopeKind rope_kind(AttnType t) { return t == AttnType::kSliding ? RopeKind::kPlain : RopeKind::kCompressed; }

// An activation's act_quant'ed rows where the plan made them, else nullptr (consumers quantise x themselves).
E4m3Rows* planned(E4m3Rows& q) { return q.codes ? &q : nullptr; }

}  // namespace


// ---- one rank

// A sequence's rows within the step: rows [row0, row0 + n) at positions pos0 … pos0 + n − 1.
struct DeepseekV4::Span {
  int64_t row0, n, pos0;
  SequenceState* sequence;
};

// One shard's forward pass: the architecture's components over the Ops seam, on this rank's activation arena
// and caches. With several ranks each sub-block's output is a partial sum until all_reduce (model/parallel.h).
class DeepseekV4::Rank {
 public:
  Rank(const Shard& shard, int index, int ranks, bool heads_split, int64_t vocab0, Numerics numerics,
       int64_t max_step, int64_t logit_rows)
      : model_(*shard.model),
        ops_(*shard.ops),
        index_(size_t(index)),
        reduce_attention_(heads_split),
        several_(ranks > 1),
        numerics_(numerics),
        act_(plan_activations(model_.config, ops_, max_step, logit_rows, ranks > 1, numerics == Numerics::kFast)),
        vocab0_(vocab0) {
    ops_.set_numerics(numerics);
  }

  Ops& ops() { return ops_; }

  // The main model over the step's spans, then this rank's share of the logits (head rows = vocabulary
  // columns [vocab0, vocab0 + V_r)) and greedy choices downloaded to the host, for DeepseekV4::deliver.
  void step(std::span<const StepInput> batch, std::span<const Span> spans, int64_t n);
  // The MTP block over the default sequence's last step; `batch` asks for all rows' logits.
  void mtp_step(SequenceState& sequence, std::span<const StepInput> batch, int64_t n);

  // What the last step left on the host: its logits rows ([rows, V_r], when asked) and greedy ids with their
  // logits (this rank's columns only).
  struct Results {
    std::vector<float> logits;
    std::vector<int32_t> tokens;  // ids within this rank's columns
    std::vector<float> values;    // the logit of each, when several ranks share the vocabulary
    std::vector<TokenLogprobs> logprobs;  // rank 0: those of the inputs that asked, in batch order
    bool whole_rows = true;  // the tokens were chosen over whole rows (ids of the vocabulary, not of the columns)
  };
  const Results& results() const { return results_; }
  int64_t vocab0() const { return vocab0_; }
  int64_t vocab_share() const { return model_.head.rows; }

 private:
  void block(const LayerWeights& l, size_t layer, bool mtp, int64_t n);
  void hc_pre(const HcWeights& hc, const std::vector<float>& norm, int64_t n);
  void hc_post(int64_t n);
  void attention(const LayerWeights& l, size_t layer, bool mtp, int64_t n);
  void query(const AttentionWeights& w, int64_t n);
  void finish_query_key_value(const AttentionWeights& w, size_t layer, bool mtp, RopeKind rope, int64_t n);
  void compress(const CompressorWeights& w, size_t layer, bool mtp, CompressorState LayerState::*which, EntrySim sim);
  void indexer_query(const IndexerWeights& w, int64_t n);
  void indexer(const IndexerWeights& w, size_t layer, bool mtp);
  void output_projection(const AttentionWeights& w, int64_t n);
  // Whether a step of n rows hands the query heads and the attention's output on as bf16 rows (Activations::qb,
  // ::ob).
  bool attention_bf16(int64_t n) const { return act_.ob.data && ops_.bf16_rows_pay(n); }
  void moe(const LayerWeights& l, int64_t n);
  // Logits of the rows the batch asked for, on the device (returns how many rows).
  int64_t head(const HcHeadWeights& hc, const std::vector<float>& norm, std::span<const StepInput> batch, int64_t n);
  void collect(std::span<const StepInput> batch, int64_t rows);

  // `layer` indexes RankCaches::layers (mtp = false) or ::mtp (mtp = true).
  LayerState& layer_state(const Span& s, size_t layer, bool mtp) const {
    RankCaches& caches = s.sequence->ranks[index_];
    return mtp ? caches.mtp[layer] : caches.layers[layer];
  }

  const ModelWeights& model_;  // this rank's shard
  Ops& ops_;
  size_t index_;
  bool reduce_attention_;  // heads split: the output projection's result is a partial sum
  // Several ranks: the MoE's result is a partial sum (experts split), and the ranks share the vocabulary (greedy
  // ids need their logits to pick the best rank).
  bool several_;
  Numerics numerics_;
  Activations act_;
  std::span<const Span> spans_;  // the current step's sequences
  // The per-sequence ops' batches of the current layer, one entry per sequence (kept: no allocation per step).
  std::vector<QueryKvParams> query_kv_batch_;
  std::vector<RopeSpan> rope_batch_;
  std::vector<CompressorParams> compressor_batch_;
  std::vector<IndexerParams> indexer_batch_;
  std::vector<AttentionParams> attention_batch_;
  std::vector<std::pair<int64_t, int64_t>> head_runs_;  // head(): the rows that need logits, as (first, count) runs of y
  int64_t vocab0_;   // this rank's first vocabulary column (its head rows, model/parallel.h)
  Results results_;
  std::vector<RowDraw> draws_;          // collect(): each logits row's draw (greedy where none was asked)
  std::vector<int64_t> logprob_rows_;   // collect(): the rows whose log-probabilities were asked
  std::vector<int64_t> logprob_tops_;   // collect(): how many of the most likely each asked for
  std::vector<int64_t> chunk_logprob_rows_;  // collect(): those of one chunk of the head, from its first row
  std::vector<Span> mtp_span_;  // mtp_step()'s one sequence
};

// ---- the threads of ranks 1..N−1: each waits for a job, runs it for its rank, reports back.

class DeepseekV4::Workers {
 public:
  explicit Workers(std::span<const Shard> shards) : errors_(shards.size()) {
    for (size_t r = 1; r < shards.size(); ++r)
      threads_.emplace_back([this, r, ops = shards[r].ops] {
        ops->bind_thread();
        loop(r);
      });
  }
  ~Workers() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  // Runs job(r) for r ≥ 1 on the workers and job(0) here; rethrows the first failure once all have finished.
  void run(const std::function<void(size_t)>& job) {
    {
      std::lock_guard lock(mutex_);
      job_ = &job;
      pending_ = threads_.size();
      ++generation_;
    }
    wake_.notify_all();
    try {
      job(0);
    } catch (...) {
      errors_[0] = std::current_exception();
    }
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    for (std::exception_ptr& e : errors_)
      if (e) std::rethrow_exception(std::exchange(e, nullptr));
  }

 private:
  void loop(size_t r) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(size_t)>* job;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      try {
        (*job)(r);
      } catch (...) {
        errors_[r] = std::current_exception();
      }
      std::lock_guard lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> threads_;
  std::vector<std::exception_ptr> errors_;  // per rank, of the current job
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(size_t)>* job_ = nullptr;
  uint64_t generation_ = 0;
  size_t pending_ = 0;
  bool stop_ = false;
};

// ---- the model over its ranks

DeepseekV4::DeepseekV4(const ModelWeights& model, Ops& ops, Numerics numerics, int64_t max_context,
                       int64_t max_step, int64_t logit_rows)
    : DeepseekV4(model, std::span<const Shard>(std::array{Shard{&model, &ops}}), numerics, max_context, max_step,
                 logit_rows) {}

DeepseekV4::DeepseekV4(const ModelWeights& model, std::span<const Shard> shards, Numerics numerics,
                       int64_t max_context, int64_t max_step, int64_t logit_rows)
    : model_(model), shards_(shards.begin(), shards.end()), numerics_(numerics), max_step_(max_step) {
  DSV4_ASSERT(!shards_.empty());
  DSV4_CHECK(logit_rows >= 1, "logit_rows must be at least 1, got ", logit_rows);
  const bool heads_split = shards_.front().model->config.n_heads != model.config.n_heads;
  int64_t vocab0 = 0;  // the ranks' head rows tile the vocabulary in rank order
  for (size_t r = 0; r < shards_.size(); ++r) {
    shards_[r].ops->bind_thread();  // each rank's arena on its own device
    ranks_.push_back(
        std::make_unique<Rank>(shards_[r], int(r), ranks(), heads_split, vocab0, numerics, max_step, logit_rows));
    vocab0 += shards_[r].model->head.rows;
  }
  DSV4_ASSERT(vocab0 == model.config.vocab_size);
  if (shards_.size() > 1) workers_ = std::make_unique<Workers>(shards_);
  state_ = new_sequence(max_context);  // ends bound to rank 0: the caller's thread runs it
}

DeepseekV4::~DeepseekV4() = default;

template <class Fn>
void DeepseekV4::on_ranks(Fn&& fn) {
  // A rank that fails tells its group, so that the others' collectives fail instead of waiting for it.
  const std::function<void(size_t)> job = [&](size_t r) {
    try {
      fn(*ranks_[r]);
    } catch (...) {
      ranks_[r]->ops().abort_group();
      throw;
    }
  };
  if (!workers_) return job(0);
  shards_.front().ops->bind_thread();  // the caller's thread runs rank 0
  workers_->run(job);
}

std::unique_ptr<SequenceState> DeepseekV4::new_sequence(int64_t max_context) {
  return std::make_unique<SequenceState>(shards_, max_context, max_step_, numerics_ != Numerics::kExact);
}

void DeepseekV4::copy_sequence(const SequenceState& src, SequenceState& dst) {
  dsv4::copy_sequence(shards_, src, dst);
}

void DeepseekV4::step(const int32_t* tokens, int64_t n, float* logits, bool all_rows, int32_t* next_token,
                      const RowDraw* draw) {
  const StepInput input{state_.get(), tokens, n, logits, all_rows, next_token, draw};
  step(std::span<const StepInput>(&input, 1));
}

void DeepseekV4::step(std::span<const StepInput> batch) {
  const ModelConfig& c = model_.config;
  DSV4_ASSERT(!batch.empty());
  std::vector<Span>& spans = spans_;
  spans.clear();
  int64_t n = 0;
  for (const StepInput& in : batch) {
    SequenceState& seq = *in.sequence;
    DSV4_ASSERT(in.n >= 1);
    DSV4_ASSERT(seq.ring_slots >= c.window + in.n);  // the ring must keep the window of the step's first token
    DSV4_CHECK(seq.position + in.n <= seq.max_context, "sequence of ", seq.position + in.n,
               " tokens exceeds the context limit of ", seq.max_context);
    for (int64_t i = 0; i < in.n; ++i)
      DSV4_CHECK(in.tokens[i] >= 0 && in.tokens[i] < c.vocab_size, "token id ", in.tokens[i],
                 " is outside the vocabulary [0, ", c.vocab_size, ")");
    spans.push_back({n, in.n, seq.position, &seq});
    n += in.n;
  }
  DSV4_CHECK(n <= max_step_, "a step of ", n, " tokens exceeds the step capacity of ", max_step_);
  on_ranks([&](Rank& r) { r.step(batch, spans, n); });
  for (const Span& s : spans) s.sequence->position += s.n;
  deliver(batch);
}

void DeepseekV4::mtp_step(const int32_t* next_tokens, int64_t n, float* logits) {
  DSV4_CHECK(has_mtp(), "this checkpoint has no MTP module (mtp.0.* tensors)");
  DSV4_ASSERT(n >= 1 && n <= max_step_);
  const StepInput all{state_.get(), next_tokens, n, logits, /*all_rows=*/true};
  const std::span<const StepInput> batch(&all, 1);
  on_ranks([&](Rank& r) { r.mtp_step(*state_, batch, n); });
  state_->mtp_position += n;
  deliver(batch);
}

// Rows in head() order; each rank holds its columns of them. The tokens (and log-probabilities) are rank 0's
// when it chose them over whole rows (one rank, or several that gathered the rows for a draw); otherwise each
// rank chose a greedy id among its columns and the best of those wins: the largest logit, and among equal ones
// the lowest id (the first rank's), as argmax() in sampler.h.
void DeepseekV4::deliver(std::span<const StepInput> batch) {
  const int64_t V = model_.config.vocab_size;
  const Rank::Results& first = ranks_[0]->results();
  int64_t row = 0;
  size_t logprobs = 0;  // the next of rank 0's log-probability results
  for (const StepInput& in : batch) {
    if (!in.logits && !in.next_token) continue;
    const int64_t count = in.logits && in.all_rows ? in.n : 1;
    for (const auto& rank : ranks_) {
      const Rank::Results& res = rank->results();
      const int64_t share = rank->vocab_share();
      if (in.logits)
        for (int64_t r = 0; r < count; ++r)
          std::copy_n(res.logits.data() + (row + r) * share, share, in.logits + r * V + rank->vocab0());
    }
    if (in.next_token) {
      const size_t last = size_t(row + count - 1);
      if (first.whole_rows) {
        *in.next_token = first.tokens[last];
        if (in.logprobs) *in.logprobs = first.logprobs[logprobs++];
      } else {
        int32_t best = -1;
        float best_value = 0.0f;
        for (const auto& rank : ranks_) {
          const Rank::Results& res = rank->results();
          if (best < 0 || res.values[last] > best_value)
            best = int32_t(rank->vocab0()) + res.tokens[last], best_value = res.values[last];
        }
        *in.next_token = best;
      }
    }
    row += count;
  }
}

// ---- one rank's forward pass

void DeepseekV4::Rank::step(std::span<const StepInput> batch, std::span<const Span> spans, int64_t n) {
  const ModelConfig& c = model_.config;
  spans_ = spans;
  for (size_t i = 0; i < batch.size(); ++i) ops_.upload_i32(act_.tokens + spans_[i].row0, batch[i].tokens, size_t(batch[i].n));
  ops_.embed(model_.embed, act_.tokens, n, act_.x);
  ops_.broadcast_streams(act_.x, n, c.hc_mult, c.dim, act_.X);
  for (size_t i = 0; i < model_.layers.size(); ++i) block(model_.layers[i], i, /*mtp=*/false, n);
  collect(batch, head(model_.hc_head, model_.norm, batch, n));
}

void DeepseekV4::Rank::mtp_step(SequenceState& sequence, std::span<const StepInput> batch, int64_t n) {
  const ModelConfig& c = model_.config;
  const MtpWeights& m = model_.mtp[0];
  const int64_t hc = c.hc_mult, D = c.dim;
  // h = h_proj · hnorm(streams) per stream; e = e_proj · enorm(embed(next token)), added to every stream.
  ops_.rms_norm(act_.X, &m.hnorm, n * hc, D, act_.X);
  ops_.linear(act_.X, D, m.h_proj, n * hc, act_.mtp_h, D);
  ops_.upload_i32(act_.tokens, batch.front().tokens, size_t(n));
  ops_.embed(model_.embed, act_.tokens, n, act_.x);
  ops_.rms_norm(act_.x, &m.enorm, n, D, act_.x);
  ops_.linear(act_.x, D, m.e_proj, n, act_.mtp_e, D);
  ops_.broadcast_streams(act_.mtp_e, n, hc, D, act_.X);
  ops_.add(act_.X, act_.mtp_h, size_t(n * hc * D), act_.X);
  mtp_span_.assign(1, Span{0, n, sequence.mtp_position, &sequence});
  spans_ = mtp_span_;
  block(m.block, 0, /*mtp=*/true, n);
  collect(batch, head(m.hc_head, m.norm, batch, n));
}

// One decoder layer (spec §4–§5): attention then MoE, each between an mHC pre-mix and post-mix. A backend may
// run a post-mix fused with the pre-mix (or head collapse) that follows it (ops.h, hc_post).
void DeepseekV4::Rank::block(const LayerWeights& l, size_t layer, bool mtp, int64_t n) {
  hc_pre(l.hc_attn, l.attn_norm, n);
  attention(l, layer, mtp, n);
  hc_post(n);
  hc_pre(l.hc_ffn, l.ffn_norm, n);
  moe(l, n);
  hc_post(n);
}

// The streams X collapsed into the sub-block input and normed: xn, and the post / comb coefficients of the
// sub-block's own post-mix.
void DeepseekV4::Rank::hc_pre(const HcWeights& hc, const std::vector<float>& norm, int64_t n) {
  ops_.hc_pre_norm(act_.X, hc, norm, n, model_.config.dim, act_.x, act_.xn, act_.post, act_.comb, planned(act_.xnq));
}

// The sub-block's output sub_out mixed back into the streams X with the coefficients of its pre-mix.
void DeepseekV4::Rank::hc_post(int64_t n) { ops_.hc_post(act_.sub_out, act_.post, act_.comb, n, act_.X); }

// Attention sub-block (spec §6): xn → sub_out. Projections run over the whole batch; the KV cache, the
// compressors, the indexer and the attention itself run per sequence on its rows, each as one batched op.
void DeepseekV4::Rank::attention(const LayerWeights& l, size_t layer, bool mtp, int64_t n) {
  const ModelConfig& c = model_.config;
  const AttentionWeights& w = l.attn;
  const RopeKind rope = rope_kind(l.attn_type);
  const bool reference = numerics_ != Numerics::kExact;  // kFast keeps the simulation points
  const int64_t H = c.n_heads, d = c.head_dim;
  ops_.linear_pair(act_.xn, c.dim, n, w.wq_a, act_.qr, c.q_lora_rank, w.wkv, act_.kv, d,  // qr and kv of xn
                   planned(act_.xnq));
  query(w, n);
  finish_query_key_value(w, layer, mtp, rope, n);
  if (l.attn_type != AttnType::kSliding)
    compress(w.compressor, layer, mtp, &LayerState::compressor, reference ? EntrySim::kFp8NoPe : EntrySim::kNone);
  if (l.attn_type == AttnType::kCsa) {
    indexer_query(w.indexer, n);
    indexer(w.indexer, layer, mtp);
  }
  attention_batch_.clear();
  const bool bf16_o = attention_bf16(n);
  for (const Span& s : spans_) {
    AttentionParams p;
    if (bf16_o) p.q_bf16 = act_.qb.data + s.row0 * H * d;
    else p.q = act_.q + s.row0 * H * d;
    p.window = layer_state(s, layer, mtp).window;
    p.ring_slots = s.sequence->ring_slots;
    p.window_size = c.window;
    p.entries = l.attn_type == AttnType::kSliding ? nullptr : layer_state(s, layer, mtp).compressor.entries;
    p.selected = l.attn_type == AttnType::kCsa ? act_.selected + s.row0 * c.index_topk : nullptr;
    p.top_k = c.index_topk;
    p.ratio = int64_t(l.attn_type);
    p.sinks = w.sinks.data();
    p.pos0 = s.pos0;
    p.n = s.n;
    p.heads = H;
    p.head_dim = d;
    p.scale = float(1.0 / std::sqrt(double(d)));
    if (bf16_o) p.out_bf16 = act_.ob.data + s.row0 * H * d;
    else p.out = act_.o + s.row0 * H * d;
    p.derotate = true;  // K = V carries RoPE: the output's rope channels turn back at the query position (§6.5)
    p.rope = rope;
    attention_batch_.push_back(p);
  }
  ops_.attention(attention_batch_);
  output_projection(w, n);
}

// q = wq_b · RMSNorm(qr), qr = wq_a · x (attention()); the normed qr is kept for the indexer.
void DeepseekV4::Rank::query(const AttentionWeights& w, int64_t n) {
  const ModelConfig& c = model_.config;
  ops_.rms_norm(act_.qr, &w.q_norm, n, c.q_lora_rank, act_.qr, planned(act_.qrq));
  const bool bf16_q = attention_bf16(n);
  ops_.linear(act_.qr, c.q_lora_rank, w.wq_b, n, bf16_q ? nullptr : act_.q, c.n_heads * c.head_dim, planned(act_.qrq),
              bf16_q ? &act_.qb : nullptr);
}

// Per sequence: the query heads' RMS norm and RoPE on the last rope_dim channels, and the single shared K = V
// head (kv = wkv · x, attention()) normed, rotated and stored in the sequence's sliding-window ring.
void DeepseekV4::Rank::finish_query_key_value(const AttentionWeights& w, size_t layer, bool mtp, RopeKind rope,
                                               int64_t n) {
  const ModelConfig& c = model_.config;
  const int64_t H = c.n_heads, d = c.head_dim;
  const bool bf16_q = attention_bf16(n);
  query_kv_batch_.clear();
  for (const Span& s : spans_) {
    QueryKvParams p{act_.q + s.row0 * H * d, H, act_.kv + s.row0 * d, &w.kv_norm, s.n, d, c.nope_dim(),
                    s.pos0, rope, /*simulate=*/numerics_ != Numerics::kExact, s.sequence->ring_slots,
                    layer_state(s, layer, mtp).window};
    if (bf16_q) {
      p.q = nullptr;
      p.q_bf16 = act_.qb.data + s.row0 * H * d;
    }
    query_kv_batch_.push_back(p);
  }
  ops_.query_kv_finish(query_kv_batch_);
}

// Per sequence: its tokens through one of its compressors (spec §7), the attention's (its entries are the CSA /
// HCA keys) or the indexer's (its entries are the indexer keys).
void DeepseekV4::Rank::compress(const CompressorWeights& w, size_t layer, bool mtp, CompressorState LayerState::*which,
                          EntrySim sim) {
  compressor_batch_.clear();
  for (const Span& s : spans_)
    compressor_batch_.push_back(
        {&w, &(layer_state(s, layer, mtp).*which), act_.xn + s.row0 * model_.config.dim, s.pos0, s.n, sim});
  ops_.compressor(compressor_batch_);
}

// Lightning indexer queries and head weights (spec §8) for the whole batch, from qr and xn.
void DeepseekV4::Rank::indexer_query(const IndexerWeights& w, int64_t n) {
  const ModelConfig& c = model_.config;
  const int64_t nI = c.index_n_heads, dI = c.index_head_dim;
  ops_.linear(act_.qr, c.q_lora_rank, w.wq_b, n, act_.index_q, nI * dI, planned(act_.qrq));
  rope_batch_.clear();
  for (const Span& s : spans_) rope_batch_.push_back({act_.index_q + s.row0 * nI * dI, s.n * nI, s.pos0});
  ops_.rope_spans(rope_batch_, dI, dI - c.rope_dim, nI, RopeKind::kCompressed);
  if (numerics_ != Numerics::kExact) ops_.hadamard_sim_fp4(act_.index_q, n * nI, dI);
  ops_.linear(act_.xn, c.dim, w.weights_proj, n, act_.index_w, nI);
  ops_.scale(act_.index_w, size_t(n * nI), float(1.0 / std::sqrt(double(dI) * double(nI))));
}

// Lightning indexer (spec §8): feeds each sequence's keys compressor, then scores every visible compressed entry
// and keeps the top k per query.
void DeepseekV4::Rank::indexer(const IndexerWeights& w, size_t layer, bool mtp) {
  const ModelConfig& c = model_.config;
  const bool reference = numerics_ != Numerics::kExact;  // kFast keeps the simulation points
  const int64_t nI = c.index_n_heads, dI = c.index_head_dim;
  compress(w.compressor, layer, mtp, &LayerState::indexer, reference ? EntrySim::kHadamardFp4 : EntrySim::kNone);
  indexer_batch_.clear();
  for (const Span& s : spans_) {
    IndexerParams p;
    p.q = act_.index_q + s.row0 * nI * dI;
    p.weights = act_.index_w + s.row0 * nI;
    p.keys = layer_state(s, layer, mtp).indexer.entries;
    p.pos0 = s.pos0;
    p.n = s.n;
    p.heads = nI;
    p.head_dim = dI;
    p.ratio = 4;
    p.top_k = c.index_topk;
    p.selected = act_.selected + s.row0 * c.index_topk;
    indexer_batch_.push_back(p);
  }
  ops_.indexer_topk(indexer_batch_);
}

// Grouped low-rank output projection (spec §6.6): o [n, H·d] → z [n, G·r_o] → sub_out [n, D].
void DeepseekV4::Rank::output_projection(const AttentionWeights& w, int64_t n) {
  const ModelConfig& c = model_.config;
  const bool bf16_o = attention_bf16(n);
  ops_.linear_grouped(bf16_o ? nullptr : act_.o, w.wo_a, c.o_groups, n, act_.z, bf16_o ? &act_.ob : nullptr);
  if (reduce_attention_) {  // each rank's heads' share, summed unrounded (Ops::linear_partial)
    ops_.linear_partial(act_.z, c.o_groups * c.o_lora_rank, w.wo_b, n, act_.sub_out, c.dim);
    ops_.all_reduce(act_.sub_out, size_t(n * c.dim));
  } else {
    ops_.linear(act_.z, c.o_groups * c.o_lora_rank, w.wo_b, n, act_.sub_out, c.dim);
  }
}

void DeepseekV4::Rank::moe(const LayerWeights& l, int64_t n) {
  if (several_) {  // each rank's experts' share, its combined sum unrounded (Ops::moe_partial)
    ops_.moe_partial(l.moe, act_.xn, act_.tokens, n, act_.sub_out);
    ops_.all_reduce(act_.sub_out, size_t(n * model_.config.dim));
  } else {
    ops_.moe(l.moe, act_.xn, act_.tokens, n, act_.sub_out);
  }
}

// Final hyper-connection collapse and norm (spec §5.4), only for the rows whose logits or greedy token the batch
// asked for: they are gathered into y_rows for collect()'s LM head. Returns the number of those rows.
int64_t DeepseekV4::Rank::head(const HcHeadWeights& hc, const std::vector<float>& norm, std::span<const StepInput> batch,
                         int64_t n) {
  const ModelConfig& c = model_.config;
  const int64_t D = c.dim;
  ops_.hc_head(act_.X, hc, n, act_.y);
  // The rows that need logits, in batch order, as runs of y (first row, count).
  head_runs_.clear();
  int64_t rows = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!batch[i].logits && !batch[i].next_token) continue;
    const int64_t first = batch[i].logits && batch[i].all_rows ? 0 : batch[i].n - 1, count = batch[i].n - first;
    head_runs_.push_back({spans_[i].row0 + first, count});
    rows += count;
  }
  if (rows == 0) return 0;
  // One run (a decode step: every sequence's only row, in order) is normalised straight out of y; otherwise
  // the runs are gathered into y_rows first. The copy would sit between two kernels every token.
  const bool one_run = head_runs_.back().first + head_runs_.back().second - head_runs_.front().first == rows;
  if (one_run) {
    ops_.rms_norm(act_.y + head_runs_.front().first * D, &norm, rows, D, act_.y_rows);
  } else {
    int64_t row = 0;
    for (const auto& [first, count] : head_runs_) {
      ops_.copy(act_.y + first * D, size_t(count * D), act_.y_rows + row * D);
      row += count;
    }
    ops_.rms_norm(act_.y_rows, &norm, rows, D, act_.y_rows);
  }
  return rows;
}

// The LM head (spec §4) over head()'s rows and this rank's results to the host, in that order: the tokens chosen on
// the backend, if any input asked for one, their log-probabilities (rank 0), and the logits rows if any input asked
// for them. The head runs in chunks of act_.logit_rows rows (a step asking for every row of a long prompt holds
// only a chunk's logits at once). A draw or log-probabilities need whole rows: with several ranks each one's
// columns are summed into zeroed rows of the whole vocabulary (all_reduce: x + 0 + … is exact), and every rank
// draws the same tokens from them. Greedy alone, each rank picks among its own columns and hands its best logit to
// deliver().
void DeepseekV4::Rank::collect(std::span<const StepInput> batch, int64_t rows) {
  if (rows == 0) return;
  const int64_t V = model_.head.rows, D = model_.config.dim;  // V: this rank's columns
  draws_.assign(size_t(rows), RowDraw{});
  logprob_rows_.clear();
  logprob_tops_.clear();
  bool want_tokens = false, want_logits = false, drawn = false;
  int64_t top = 0, row = 0;
  for (const StepInput& in : batch) {
    if (!in.logits && !in.next_token) continue;
    const int64_t count = in.logits && in.all_rows ? in.n : 1, last = row + count - 1;
    row += count;
    want_logits |= in.logits != nullptr;
    if (!in.next_token) continue;
    want_tokens = true;
    if (in.draw) draws_[size_t(last)] = *in.draw;
    drawn |= in.draw && !in.draw->greedy();
    if (in.logprobs) {
      logprob_rows_.push_back(last);
      logprob_tops_.push_back(in.top_logprobs);
      top = std::max(top, in.top_logprobs);
    }
  }
  results_.whole_rows = !several_ || drawn || !logprob_rows_.empty();
  results_.logprobs.resize(want_tokens && index_ == 0 ? logprob_rows_.size() : 0);
  if (want_logits) results_.logits.resize(size_t(rows * V));
  size_t logprob = 0;  // logprob_rows_ ascend: a chunk's are the next ones
  for (int64_t first = 0; first < rows; first += act_.logit_rows) {
    const int64_t count = std::min(act_.logit_rows, rows - first);
    ops_.lm_head(act_.y_rows + first * D, model_.head, count, act_.logits);
    if (want_tokens) {
      const float* logits = act_.logits;
      int64_t vocab = V;
      if (several_ && results_.whole_rows) {
        vocab = model_.config.vocab_size;
        ops_.fill(act_.logits_full, size_t(count * vocab), 0.0f);
        ops_.copy_rows(act_.logits, count, V, act_.logits_full + vocab0_, vocab);
        ops_.all_reduce(act_.logits_full, size_t(count * vocab));
        logits = act_.logits_full;
      }
      int32_t* const tokens = act_.greedy + first;
      if (results_.whole_rows && (drawn || several_))
        ops_.sample_tokens(logits, vocab, std::span<const RowDraw>(draws_).subspan(size_t(first), size_t(count)), tokens);
      else
        ops_.greedy_tokens(act_.logits, count, V, tokens, several_ ? act_.greedy_values + first : nullptr);
      if (index_ == 0) {
        chunk_logprob_rows_.clear();
        const size_t begin = logprob;
        for (; logprob < logprob_rows_.size() && logprob_rows_[logprob] < first + count; ++logprob)
          chunk_logprob_rows_.push_back(logprob_rows_[logprob] - first);
        if (logprob > begin)
          ops_.token_logprobs(logits, vocab, chunk_logprob_rows_, tokens, top,
                              std::span<TokenLogprobs>(results_.logprobs).subspan(begin, logprob - begin));
      }
    }
    if (want_logits) ops_.download(results_.logits.data() + first * V, act_.logits, size_t(count * V));
  }
  if (want_tokens) {
    for (size_t i = 0; i < results_.logprobs.size(); ++i) results_.logprobs[i].top.resize(size_t(logprob_tops_[i]));
    results_.tokens.resize(size_t(rows));
    ops_.download_i32(results_.tokens.data(), act_.greedy, size_t(rows));
    if (!results_.whole_rows) {
      results_.values.resize(size_t(rows));
      ops_.download(results_.values.data(), act_.greedy_values, size_t(rows));
    }
  }
}

}  // namespace dsv4
