// Continuous batching over a fixed pool of sequence slots. One engine thread owns the model; every step it
// admits waiting requests into free slots (FIFO), then runs one batched forward step made of a single-token
// decode for every running request plus prefill chunks of the requests still reading their prompt, up to the
// model's step capacity. A long prompt is therefore read a chunk at a time while the other requests keep
// decoding. Requests join and leave the batch at every step; a cancelled or finished request frees its slot
// (the state is reset) before the next step.
//
// Memory is planned once: the slots are allocated at start (max_seqs sequences of max_context tokens), so
// admission is "a slot is free" and nothing is allocated while serving. Requests beyond the slots wait in a
// bounded queue; beyond that, submit() refuses them (the caller answers 429).
//
// Knows tokens only: text, stop strings and the API live with the caller, which cancels a request when it has
// seen enough (a stop string, a client that went away).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "grammar/token_mask.h"
#include "model/deepseek_v4.h"
#include "sampler/sampler.h"

namespace dsv4 {

struct GenerationRequest {
  std::vector<int32_t> prompt;  // ≥ 1 token
  int64_t max_tokens = 16;      // ≥ 1; prompt + max_tokens ≤ the slots' context (checked by submit)
  SamplingParams sampling;
  bool stop_at_eos = true;
  // Set: each token's event carries its log-probability and this many most likely alternatives (≤ the vocab),
  // computed on the backend (only they cross to the host).
  std::optional<int64_t> logprobs;
  // Set: constrained decoding. Every token is drawn from those the grammar allows next (its mask is made on the
  // host before the step that computes the logits, then applied to them where the draw is made). The
  // end-of-sentence token comes only where the answer may end.
  std::shared_ptr<grammar::TokenConstraint> constraint;
};

enum class FinishReason { kLength, kEos, kCancelled, kError };

// Reported by the engine thread, in order, for one request: one event per generated token, then a final one.
struct GenerationEvent {
  std::optional<int32_t> token;             // a new token (absent in the final event)
  std::optional<FinishReason> finished;     // set in the last event of the request
  std::string error;                        // kError: what went wrong
  bool admitted = false;                    // the request left the queue for a slot (an event of its own)
  std::optional<TokenLogprobs> logprobs{};  // with a token, when the request asked for them
};

struct SchedulerOptions {
  int64_t max_seqs = 8;       // sequence slots (concurrently running requests), ≤ the model's step capacity
  int64_t max_context = 2048;  // tokens per slot (prompt + generated)
  int64_t max_waiting = 256;   // queued requests beyond the slots before submit() refuses
};

struct SchedulerStats {
  int64_t running = 0;      // requests holding a slot (prefilling or decoding)
  int64_t waiting = 0;      // requests queued for a slot
  int64_t slots = 0;
  int64_t tokens_in_slots = 0;  // Σ positions of the running sequences (state actually filled)
  int64_t steps = 0;            // forward steps run so far
  int64_t step_tokens = 0;      // rows of those steps (prompt chunk tokens + decode tokens)
  double step_seconds = 0;      // time in those steps, sampling included: the engine's busy time
};

class Scheduler {
 public:
  using RequestId = uint64_t;
  // Called on the engine thread; must be quick (hand the event to another thread) and must not throw.
  using EventSink = std::function<void(const GenerationEvent&)>;

  // Allocates the slots and starts the engine thread. The model outlives the scheduler.
  Scheduler(DeepseekV4& model, const SchedulerOptions& options);
  ~Scheduler();  // stops the engine thread; requests still pending get a kCancelled event
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request; std::nullopt when the waiting queue is full. Throws Error on an invalid request
  // (empty prompt, max_tokens < 1, context exceeded, bad sampling parameters).
  std::optional<RequestId> submit(GenerationRequest request, EventSink sink);
  // Stops a request wherever it is (waiting, prefilling, decoding); its slot is freed before the next step
  // and its sink receives a final kCancelled event. Unknown or finished ids are ignored.
  void cancel(RequestId id);

  SchedulerStats stats() const;
  const SchedulerOptions& options() const { return options_; }
  const ModelConfig& model_config() const { return model_.config(); }

 private:
  struct Active;
  void run();
  void admit_locked();
  int64_t step(std::vector<Active*>& batch_members);  // returns the rows stepped
  // Frees the slot; the final event waits in finals_ until the stats are updated.
  void retire(Active& a, FinishReason reason, const std::string& error = {});
  void update_stats_locked();
  void deliver_finals();

  DeepseekV4& model_;
  SchedulerOptions options_;
  std::vector<std::unique_ptr<SequenceState>> slots_;
  std::vector<size_t> free_slots_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  RequestId next_id_ = 1;
  std::deque<std::unique_ptr<Active>> waiting_;  // guarded by mutex_
  std::vector<RequestId> cancelled_;             // guarded by mutex_
  SchedulerStats stats_;                         // guarded by mutex_

  std::vector<std::unique_ptr<Active>> running_;  // engine thread only, in admission order
  std::vector<std::pair<EventSink, GenerationEvent>> finals_;  // engine thread only
  std::vector<Active*> admitted_;  // admitted since the last delivery (in running_); engine thread only
  std::thread thread_;
};

const char* finish_reason_name(FinishReason reason);  // "length", "stop" (EOS), "cancelled", "error"

}  // namespace dsv4
