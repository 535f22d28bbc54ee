// Between the APIs and the engine queue: turns a parsed request (OpenAI's chat or text completions, Anthropic's
// messages) into prompt tokens and scheduler requests (one per choice), and the scheduler's token events back
// into that API's responses or stream events. Knows nothing of HTTP: the transport hands it a body and gets back
// JSON, or SSE events to send as they come.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/scheduler.h"
#include "server/anthropic_api.h"
#include "server/metrics.h"
#include "server/openai_api.h"
#include "server/output_decoder.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::server {

// The vocabulary as constrained decoding sees it: the tokenizer's bytes per id, for the `vocab_size` ids of the
// model's logits rows (ids beyond the tokenizer: no bytes, never allowed), its special tokens, and `eos`.
std::shared_ptr<const grammar::Vocabulary> grammar_vocabulary(const Tokenizer& tokenizer, int64_t vocab_size,
                                                              int32_t eos);

struct ServiceOptions {
  std::string model_name;   // what /v1/models lists and requests must name
  SamplingParams defaults;  // sampling for fields a request leaves out (the model's generation_config.json)
};

class CompletionJob;

// One server-sent event of a stream.
struct SseEvent {
  std::string event;  // the `event:` line's name; empty for OpenAI's streams, which send `data:` lines only
  std::string data;
};

class CompletionService {
 public:
  CompletionService(Scheduler& scheduler, const Tokenizer& tokenizer, Metrics& metrics, ServiceOptions options);

  // Parses and validates a request body of the endpoint's API and queues its choices. Throws ApiError: 400 for a
  // bad request or a prompt that does not fit the context, 404 for an unknown model, 429 when the queue is full.
  std::unique_ptr<CompletionJob> start(Endpoint endpoint, const std::string& body);

  // POST /tokenize and /detokenize (vLLM's shapes): the ids this server would feed the model for a prompt or a
  // chat, and the text of ids. Throw ApiError: 400, 404 for an unknown model.
  Json tokenize(const std::string& body) const;
  Json detokenize(const std::string& body) const;

  Json models() const;         // GET /v1/models
  std::string metrics() const;  // GET /metrics
  void http_response(int status);  // counts a response in the metrics (the HTTP layer's logger)

 private:
  friend class CompletionJob;
  Scheduler& scheduler_;
  const Tokenizer& tokenizer_;
  Metrics& metrics_;
  ServiceOptions options_;
  int64_t created_;  // the model's "created" time in /v1/models
  int64_t max_token_bytes_;  // the most bytes of text one token stands for (prompts refused before tokenizing)
  // The fewest tokens `text` can encode to: a text longer than the context allows is refused before it is
  // tokenized (a 40 MB prompt cost seconds and left the tokenizer's per-thread scratch at gigabytes).
  int64_t fewest_tokens(const std::string& text) const {
    return (int64_t(text.size()) + max_token_bytes_ - 1) / max_token_bytes_;
  }
  std::shared_ptr<const grammar::Vocabulary> vocabulary_;  // for constrained decoding
};

// One request in flight: its choices in the scheduler and their output so far. Used by one HTTP thread.
class CompletionJob {
 public:
  ~CompletionJob();  // cancels the choices still generating
  bool stream() const { return request_.stream; }

  // Streaming: waits up to `wait` for tokens and returns the SSE events they produced. OpenAI: chunk JSON texts,
  // an error object if the engine failed, the usage chunk, and "[DONE]" last. Anthropic: message_start at once,
  // then the content block events, message_delta and message_stop (or an error event). Empty on timeout.
  std::vector<SseEvent> poll(std::chrono::milliseconds wait);
  bool done() const { return done_sent_; }
  // Non-streaming: waits for every choice and returns the response body. Throws ApiError (500) when the
  // engine failed. `abandoned` is asked between waits (a few times a second) whether anyone still wants the
  // answer: when it says no, the choices are cancelled (their slots freed) and the result is empty.
  std::optional<Json> wait(const std::function<bool()>& abandoned);
  // The client went away: stop generating (frees the slots).
  void cancel();

 private:
  friend class CompletionService;
  struct Inbox;
  struct Choice;
  CompletionJob(CompletionService& service, CompletionRequest request);
  // The grammar of the request's answer (response_format, a forced tool_choice) as a constraint in its initial
  // state; null when the answer is free. Throws ApiError (400) for a schema it cannot honour.
  std::unique_ptr<grammar::TokenConstraint> make_constraint(bool thinking) const;
  // thinking: the output starts in the reasoning; constraint: each choice's copy starts from it (null: none).
  void submit_all(const std::vector<std::vector<int32_t>>& prompts, bool chat, bool thinking,
                  const grammar::TokenConstraint* constraint);
  // Applies one engine event to its choice; stream chunks go to `out` when streaming.
  void handle(size_t choice, const GenerationEvent& event, std::chrono::steady_clock::time_point at,
              std::vector<SseEvent>& out);
  void finish_choice(Choice& c, const std::string& reason, std::vector<SseEvent>& out);
  // An OpenAI stream chunk of a choice: `delta`, the logprobs of the tokens not sent yet, the finish reason.
  void send_chunk(Choice& c, const ChatDelta& delta, const std::string& finish_reason, std::vector<SseEvent>& out);
  // The choice's logprobs from entry `from` on, in its endpoint's shape; null when the request did not ask.
  Json logprobs_json(const Choice& c, size_t from) const;
  bool all_finished() const;
  Usage usage() const;  // every prompt once, every choice's tokens
  std::vector<SseEvent> drain(std::chrono::milliseconds wait);

  CompletionService& service_;
  CompletionRequest request_;
  ResponseHeader header_;
  std::chrono::steady_clock::time_point arrival_;
  std::shared_ptr<Inbox> inbox_;  // shared with the scheduler's sinks, which may outlive the job
  std::vector<std::unique_ptr<Choice>> choices_;
  std::vector<int64_t> prompt_lengths_;  // per prompt (usage counts each prompt once, not once per choice)
  std::vector<std::string> echoes_;      // per prompt, with echo: the text that starts each of its choices
  // A completion choice's text to send: with echo, its first piece starts with its prompt's text.
  std::string completion_text(const Choice& c, const std::string& content) const;
  std::string error_;                    // the engine's error, if any choice failed
  bool started_ = false;                 // a stream's opening events (Anthropic's message_start) went out
  bool done_sent_ = false;
};

}  // namespace dsv4::server
