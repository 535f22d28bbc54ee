#include "engine/scheduler.h"

#include <algorithm>
#include <exception>

#include "core/error.h"

namespace dsv4 {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength: return "length";
    case FinishReason::kEos: return "stop";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "error";
}

// A request from submit() to its final event. Once admitted it owns a slot and is touched by the engine
// thread only.
struct Scheduler::Active {
  RequestId id = 0;
  GenerationRequest request;
  EventSink sink;
  Sampler sampler;
  size_t slot = 0;
  int64_t prefilled = 0;           // prompt tokens consumed so far
  std::vector<int32_t> generated;  // the last one is the input of the next decode step
  bool choosing = false;           // this step chooses the next token (a decode, or the prompt's last chunk)
  int32_t token = -1;              // the token it chose, on the backend
  TokenLogprobs logprobs;          // with request.logprobs: that token's
  std::vector<uint32_t> mask;      // [ceil(V / 32)] with a grammar: the tokens it allows in this step's row
  int64_t allowed = 0;             // how many

  Active(RequestId id_, GenerationRequest r, EventSink s, int64_t vocab)
      : id(id_), request(std::move(r)), sink(std::move(s)), sampler(request.sampling, vocab),
        mask(request.constraint ? size_t((vocab + 31) / 32) : 0) {}
  bool decoding() const { return prefilled == int64_t(request.prompt.size()); }
  // The StepInput fields that choose the next token on the backend (the draw is valid until the next call).
  void choose(StepInput& in) {
    in.next_token = &token;
    in.draw = &sampler.next(request.prompt, generated, request.constraint ? mask.data() : nullptr);
    if (request.logprobs) in.logprobs = &logprobs, in.top_logprobs = *request.logprobs;
  }
};

Scheduler::Scheduler(DeepseekV4& model, const SchedulerOptions& options) : model_(model), options_(options) {
  // Every running request needs at least one row per step, so a step always has room for all of them plus
  // at least one prompt token for each request still prefilling: no request can starve.
  DSV4_CHECK(options.max_seqs >= 1 && options.max_seqs <= model.max_step(), "--max-seqs (", options.max_seqs,
             ") must be between 1 and the step capacity --step (", model.max_step(), ")");
  DSV4_CHECK(options.max_context >= 2, "--max-context must be at least 2");
  DSV4_CHECK(options.max_waiting >= 0, "--max-waiting must not be negative");
  for (int64_t i = 0; i < options.max_seqs; ++i) {
    slots_.push_back(model.new_sequence(options.max_context));
    free_slots_.push_back(size_t(options.max_seqs - 1 - i));  // pop_back hands out slot 0 first
  }
  stats_.slots = options.max_seqs;
  thread_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
  for (auto& a : waiting_) a->sink({std::nullopt, FinishReason::kCancelled, {}});
  for (auto& a : running_) a->sink({std::nullopt, FinishReason::kCancelled, {}});
}

std::optional<Scheduler::RequestId> Scheduler::submit(GenerationRequest request, EventSink sink) {
  const ModelConfig& c = model_.config();
  const int64_t prompt = int64_t(request.prompt.size());
  DSV4_CHECK(prompt >= 1, "the prompt is empty");
  DSV4_CHECK(request.max_tokens >= 1, "max_tokens must be at least 1");
  DSV4_CHECK(prompt + request.max_tokens <= options_.max_context, "the context is limited to ", options_.max_context,
             " tokens, but ", prompt + request.max_tokens, " were requested (", prompt, " in the prompt, ",
             request.max_tokens, " to generate)");
  for (int32_t t : request.prompt)
    DSV4_CHECK(t >= 0 && t < c.vocab_size, "token id ", t, " is outside the vocabulary [0, ", c.vocab_size, ")");
  validate(request.sampling, c.vocab_size);
  if (request.logprobs)
    DSV4_CHECK(*request.logprobs >= 0 && *request.logprobs <= std::min(c.vocab_size, kLogprobsLimit),
               "logprobs must be between 0 and ", std::min(c.vocab_size, kLogprobsLimit), ", got ", *request.logprobs);
  if (request.constraint)
    DSV4_CHECK(request.constraint->vocabulary().size() == c.vocab_size, "the grammar's vocabulary has ",
               request.constraint->vocabulary().size(), " tokens, the model ", c.vocab_size);
  auto active = std::make_unique<Active>(0, std::move(request), std::move(sink), c.vocab_size);  // allocates
  std::unique_lock lock(mutex_);
  // Room for the free slots (admitted at the next step) plus max_waiting queued behind the running ones.
  const int64_t free_slots = options_.max_seqs - stats_.running;
  if (int64_t(waiting_.size()) >= options_.max_waiting + free_slots) return std::nullopt;
  const RequestId id = active->id = next_id_++;
  waiting_.push_back(std::move(active));
  stats_.waiting = int64_t(waiting_.size());
  lock.unlock();
  wake_.notify_all();
  return id;
}

void Scheduler::cancel(RequestId id) {
  {
    std::lock_guard lock(mutex_);
    cancelled_.push_back(id);
  }
  wake_.notify_all();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void Scheduler::admit_locked() {
  while (!waiting_.empty() && !free_slots_.empty()) {
    std::unique_ptr<Active> a = std::move(waiting_.front());
    waiting_.pop_front();
    a->slot = free_slots_.back();
    free_slots_.pop_back();
    admitted_.push_back(a.get());
    running_.push_back(std::move(a));
  }
}

void Scheduler::retire(Active& a, FinishReason reason, const std::string& error) {
  finals_.push_back({std::move(a.sink), {std::nullopt, reason, error}});
  model_.reset(*slots_[a.slot]);
  free_slots_.push_back(a.slot);
}

void Scheduler::update_stats_locked() {
  stats_.running = int64_t(running_.size());
  stats_.waiting = int64_t(waiting_.size());
  stats_.tokens_in_slots = 0;
  for (auto& a : running_) stats_.tokens_in_slots += slots_[a->slot]->position;
}

void Scheduler::deliver_finals() {
  for (auto& [sink, event] : finals_) sink(event);
  finals_.clear();
  for (Active* a : admitted_) a->sink({std::nullopt, std::nullopt, {}, /*admitted=*/true});
  admitted_.clear();
}

void Scheduler::run() {
  std::vector<Active*> members;
  while (true) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !waiting_.empty() || !running_.empty() || !cancelled_.empty(); });
      if (stopping_) return;
      for (RequestId id : cancelled_) {
        const auto waiting = std::find_if(waiting_.begin(), waiting_.end(), [&](auto& a) { return a->id == id; });
        if (waiting != waiting_.end()) {
          finals_.push_back({std::move((*waiting)->sink), {std::nullopt, FinishReason::kCancelled, {}}});
          waiting_.erase(waiting);
        }
        const auto running = std::find_if(running_.begin(), running_.end(), [&](auto& a) { return a->id == id; });
        if (running != running_.end()) {
          retire(**running, FinishReason::kCancelled);
          running_.erase(running);
        }
      }
      cancelled_.clear();
      admit_locked();
      update_stats_locked();
    }
    deliver_finals();
    if (running_.empty()) continue;
    const auto start = std::chrono::steady_clock::now();
    const int64_t rows = step(members);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    {
      std::lock_guard lock(mutex_);
      update_stats_locked();
      ++stats_.steps;
      stats_.step_tokens += rows;
      stats_.step_seconds += seconds;
    }
    // Final events go out once the stats no longer count their requests.
    deliver_finals();
  }
}

int64_t Scheduler::step(std::vector<Active*>& members) {
  members.clear();
  std::vector<StepInput> batch;
  int64_t budget = model_.max_step();
  // Decodes first (one row each), then prompt chunks in admission order with the rows left.
  for (auto& a : running_) {
    if (!a->decoding()) continue;
    batch.push_back({slots_[a->slot].get(), &a->generated.back(), 1});
    members.push_back(a.get());
    --budget;
  }
  for (auto& a : running_) {
    if (a->decoding() || budget == 0) continue;
    const int64_t n = std::min(budget, int64_t(a->request.prompt.size()) - a->prefilled);
    batch.push_back({slots_[a->slot].get(), a->request.prompt.data() + a->prefilled, n});
    members.push_back(a.get());
    budget -= n;
  }
  // A decode, or the prompt's last chunk, chooses the request's next token.
  for (size_t i = 0; i < members.size(); ++i)
    members[i]->choosing =
        members[i]->decoding() || members[i]->prefilled + batch[i].n == int64_t(members[i]->request.prompt.size());
  // The grammars' masks depend only on the tokens so far: they are made before the step (on a GPU backend this
  // is where they can overlap the forward pass). Rows are independent.
  std::vector<Active*> constrained;
  for (Active* a : members)
    if (a->choosing && a->request.constraint) constrained.push_back(a);
#pragma omp parallel for schedule(dynamic, 1) if (constrained.size() > 1)
  for (size_t i = 0; i < constrained.size(); ++i)
    constrained[i]->allowed = constrained[i]->request.constraint->allowed(constrained[i]->mask);
  // A grammar that allows nothing (past its nesting limit) ends its request after the step: no token is drawn.
  for (size_t i = 0; i < members.size(); ++i) {
    Active& a = *members[i];
    if (a.choosing && !(a.request.constraint && a.allowed == 0)) a.choose(batch[i]);
  }
  try {
    model_.step(batch);
  } catch (const std::exception& e) {
    // A failed step leaves its sequences in an unknown state: end those requests, keep serving the others.
    const std::string error = e.what();
    std::erase_if(running_, [&](auto& a) {
      if (std::find(members.begin(), members.end(), a.get()) == members.end()) return false;
      retire(*a, FinishReason::kError, error);
      return true;
    });
    return model_.max_step() - budget;
  }
  const int32_t eos = int32_t(model_.config().eos_token_id);
  for (size_t i = 0; i < members.size(); ++i)
    if (!members[i]->decoding()) members[i]->prefilled += batch[i].n;
  std::erase_if(running_, [&](auto& ap) {
    Active& a = *ap;
    if (!a.choosing) return false;
    a.choosing = false;
    grammar::TokenConstraint* constraint = a.request.constraint.get();
    if (constraint && a.allowed == 0) {
      retire(a, FinishReason::kError, "the grammar allows no token here (nested deeper than it supports)");
      return true;
    }
    const int32_t token = a.token;
    if (constraint) DSV4_ASSERT(constraint->accept(token));
    a.generated.push_back(token);
    GenerationEvent event;
    event.token = token;
    if (a.request.logprobs) event.logprobs = std::move(a.logprobs);
    a.sink(event);
    std::optional<FinishReason> done;
    if (a.request.stop_at_eos && token == eos) done = FinishReason::kEos;
    else if (int64_t(a.generated.size()) >= a.request.max_tokens) done = FinishReason::kLength;
    if (!done) return false;
    retire(a, *done);
    return true;
  });
  return model_.max_step() - budget;
}

}  // namespace dsv4
