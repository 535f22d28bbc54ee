#include "server/completion_service.h"

#include <algorithm>
#include <ctime>
#include <random>

#include "chat/chat_encoding.h"
#include "core/error.h"
#include "tokenizer/utf8.h"

namespace dsv4::server {

using clock = std::chrono::steady_clock;

namespace {
double seconds(clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

// Engine events waiting for the HTTP thread, filled by the scheduler's sinks on the engine thread.
struct CompletionJob::Inbox {
  struct Item {
    size_t choice;
    GenerationEvent event;
    clock::time_point at;
  };
  std::mutex mutex;
  std::condition_variable ready;
  std::deque<Item> items;
};

struct CompletionJob::Choice {
  int64_t index = 0;
  Scheduler::RequestId id = 0;
  OutputDecoder decoder;
  MessageStream message;  // Anthropic streams: the content blocks sent so far
  std::vector<LogprobEntry> logprobs;  // one per generated token, when asked
  size_t logprobs_sent = 0;            // streams: the entries already in a chunk
  int64_t generated = 0;
  bool first_chunk = true;
  bool finished = false;
  std::string finish_reason;
  clock::time_point last_token;
  std::optional<clock::time_point> admitted, first_token;  // its phases, for the metrics
  Choice(int64_t i, OutputDecoder d) : index(i), decoder(std::move(d)) {}
};

namespace {

// The most bytes of text one token stands for (added and special tokens included): a text of B bytes is at least
// B / max_token_bytes tokens.
int64_t max_token_bytes(const Tokenizer& tokenizer) {
  size_t most = 1;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    most = std::max(most, tokenizer.token_bytes(id).size());
    if (const auto token = tokenizer.id_to_token(id)) most = std::max(most, token->size());
  }
  return int64_t(most);
}

// A token in a logprobs object: bytes that are not whole UTF-8 on their own (part of a character) are spelled
// "bytes:\xNN..." as OpenAI does; logprobs are clamped at -9999 (vLLM's floor for -inf) so JSON can carry them.
LogprobToken logprob_token(const Tokenizer& tokenizer, int32_t id, float logprob) {
  const std::string bytes(tokenizer.token_bytes(id));
  std::string text = bytes;
  if (tok::find_invalid_utf8(bytes) != std::string_view::npos) {
    static constexpr char kHex[] = "0123456789abcdef";
    text = "bytes:";
    for (const char b : bytes) text += std::string("\\x") + kHex[uint8_t(b) >> 4] + kHex[uint8_t(b) & 15];
  }
  return {text, bytes, std::max(logprob, -9999.0f)};
}

SseEvent anthropic_event(const Json& event) { return {event["type"].get<std::string>(), json_text(event)}; }

}  // namespace

std::shared_ptr<const grammar::Vocabulary> grammar_vocabulary(const Tokenizer& tokenizer, int64_t vocab_size,
                                                              int32_t eos) {
  std::vector<std::string> bytes(static_cast<size_t>(vocab_size));
  std::vector<bool> special(size_t(vocab_size), false);
  for (int32_t id = 0; id < std::min<int64_t>(vocab_size, tokenizer.vocab_size()); ++id) {
    bytes[size_t(id)] = tokenizer.token_bytes(id);
    special[size_t(id)] = tokenizer.is_special(id);
  }
  return std::make_shared<const grammar::Vocabulary>(std::move(bytes), special, eos);
}

CompletionService::CompletionService(Scheduler& scheduler, const Tokenizer& tokenizer, Metrics& metrics,
                                     ServiceOptions options)
    : scheduler_(scheduler), tokenizer_(tokenizer), metrics_(metrics), options_(std::move(options)),
      created_(int64_t(std::time(nullptr))), max_token_bytes_(max_token_bytes(tokenizer)),
      vocabulary_(grammar_vocabulary(tokenizer, scheduler.model_config().vocab_size,
                                     int32_t(scheduler.model_config().eos_token_id))) {}

namespace {

void check_model(const std::string& asked, const std::string& served) {
  if (asked != served)
    throw ApiError(404, "The model '" + asked + "' does not exist; this server serves '" + served + "'",
                   "invalid_request_error", "model", "model_not_found");
}

// A field of an unexpected JSON type that a check missed: still the client's request, not a server error.
template <typename Parse>
auto parse_or_400(Parse parse) {
  try {
    return parse();
  } catch (const nlohmann::json::exception& e) {
    throw invalid_request(std::string("the request has a field of the wrong type: ") + e.what());
  }
}

}  // namespace

Json CompletionService::tokenize(const std::string& body) const {
  const TokenizeRequest r = parse_or_400([&] { return parse_tokenize(body); });
  check_model(r.model, options_.model_name);
  const int64_t context = scheduler_.options().max_context;
  const char* param = r.chat ? "messages" : "prompt";
  std::string text;
  try {  // a conversation the chat encoding refuses (a tool message without its call's id, ...) is the client's
    text = r.chat ? chat::encode_chat(r.chat->messages, r.chat->tools, r.chat->chat_options) : r.prompt;
  } catch (const Error& e) {
    throw invalid_request(e.what(), param);
  }
  if (fewest_tokens(text) > context)
    throw invalid_request("the text is longer than " + std::to_string(context) + " tokens could hold", param,
                          "context_length_exceeded");
  std::vector<int32_t> ids;
  try {
    ids = tokenizer_.encode(text, /*add_bos=*/!r.chat && r.add_special_tokens && tokenizer_.bos_id().has_value());
  } catch (const Error& e) {
    throw invalid_request(e.what(), param);
  }
  return Json{{"count", ids.size()}, {"max_model_len", context}, {"tokens", ids}, {"token_strs", nullptr}};
}

Json CompletionService::detokenize(const std::string& body) const {
  const DetokenizeRequest r = parse_or_400([&] { return parse_detokenize(body); });
  check_model(r.model, options_.model_name);
  for (const int32_t id : r.tokens)
    if (id >= tokenizer_.vocab_size())
      throw invalid_request("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                std::to_string(tokenizer_.vocab_size()) + ")",
                            "tokens");
  return Json{{"prompt", tokenizer_.decode(r.tokens)}};
}

void CompletionService::http_response(int status) { metrics_.http_response(status); }

Json CompletionService::models() const {
  Json model{{"id", options_.model_name},
             {"object", "model"},
             {"created", created_},
             {"owned_by", "dsv4"},
             {"max_model_len", scheduler_.options().max_context}};
  return Json{{"object", "list"}, {"data", Json::array({model})}};
}

std::string CompletionService::metrics() const {
  return metrics_.render(scheduler_.stats());
}

std::unique_ptr<CompletionJob> CompletionService::start(Endpoint endpoint, const std::string& body) {
  CompletionRequest request = parse_or_400([&] {
    return endpoint == Endpoint::kMessages ? parse_messages(body, options_.defaults)
                                           : parse_request(endpoint, body, options_.defaults);
  });
  check_model(request.model, options_.model_name);
  const int64_t slots = scheduler_.options().max_seqs;
  if (request.n * int64_t(std::max<size_t>(request.prompts.size(), 1)) > slots)
    throw invalid_request("n × prompts may be at most " + std::to_string(slots) + " (the server's --max-seqs)", "n");
  return std::unique_ptr<CompletionJob>(new CompletionJob(*this, std::move(request)));
}

CompletionJob::CompletionJob(CompletionService& service, CompletionRequest request)
    : service_(service), request_(std::move(request)), arrival_(clock::now()), inbox_(std::make_shared<Inbox>()) {
  const bool chat = request_.endpoint != Endpoint::kCompletions;
  const bool openai_chat = request_.endpoint == Endpoint::kChatCompletions;
  const char* object = request_.endpoint == Endpoint::kMessages ? "message"
                       : !openai_chat                           ? "text_completion"
                       : request_.stream                        ? "chat.completion.chunk"
                                                                : "chat.completion";
  const char* id_prefix = request_.endpoint == Endpoint::kMessages ? "msg_" : openai_chat ? "chatcmpl-" : "cmpl-";
  header_ = {random_id(id_prefix), object, int64_t(std::time(nullptr)), service_.options_.model_name};
  const Tokenizer& tokenizer = service_.tokenizer_;

  // The prompts as tokens; a text that cannot fit is refused before it is tokenized (fewest_tokens).
  const int64_t context = service_.scheduler_.options().max_context;
  const int64_t completion = request_.max_tokens.value_or(1);
  const auto too_long = [&](int64_t length, bool at_least) {
    const int64_t wanted = length + completion;
    return invalid_request("This model's maximum context length is " + std::to_string(context) +
                               " tokens. However, you requested " + (at_least ? "at least " : "") +
                               std::to_string(wanted) + " tokens (" + std::to_string(length) + " in the " +
                               (chat ? "messages" : "prompt") + ", " + std::to_string(completion) +
                               " in the completion). Please reduce the length of the input or of max_tokens.",
                           chat ? "messages" : "prompt", "context_length_exceeded");
  };
  const auto encode = [&](const std::string& text, bool add_bos) {
    const int64_t fewest = service_.fewest_tokens(text);
    if (fewest + completion > context) throw too_long(fewest, /*at_least=*/true);
    return tokenizer.encode(text, add_bos);
  };
  std::vector<std::vector<int32_t>> prompts;
  try {
    if (chat) {
      prompts.push_back(encode(chat::encode_chat(request_.messages, request_.tools, request_.chat_options), false));
    } else {
      for (const auto& p : request_.prompts) prompts.push_back(p.is_tokens ? p.tokens : encode(p.text, true));
    }
  } catch (const Error& e) {
    throw invalid_request(e.what(), chat ? "messages" : "prompt");
  }
  for (const auto& p : prompts) {
    const int64_t length = int64_t(p.size());
    if (length + completion > context) throw too_long(length, /*at_least=*/false);
    prompt_lengths_.push_back(length);
  }
  if (request_.echo)
    for (const auto& p : request_.prompts) echoes_.push_back(p.is_tokens ? tokenizer.decode(p.tokens) : p.text);

  // The output starts inside <think> in thinking mode, unless it continues an assistant prefix (rendered after
  // its </think>).
  const bool continues = chat && request_.messages.back().prefix;
  const bool thinking = chat && request_.chat_options.thinking && !continues;
  const std::unique_ptr<grammar::TokenConstraint> constraint = make_constraint(thinking);
  if (constraint && continues) {
    const chat::Message& prefix = request_.messages.back();
    if (!constraint->accept_text(prefix.content + chat::render_tool_calls(prefix.tool_calls)))
      throw invalid_request("the assistant prefix is not the start of an answer that " +
                                (request_.json_schema ? request_.json_schema_field : std::string("tool_choice")) +
                                " allows",
                            "messages");
  }

  // One scheduler request per choice: prompt-major, as OpenAI numbers the choices of a batch of prompts.
  // A throw from a constructor skips the destructor, so a refused submission cancels the queued ones here.
  try {
    submit_all(prompts, chat, thinking, constraint.get());
  } catch (...) {
    cancel();
    throw;
  }
  int64_t prompt_tokens = 0;
  for (int64_t l : prompt_lengths_) prompt_tokens += l * request_.n;
  service_.metrics_.add_prompt_tokens(prompt_tokens);
}

std::unique_ptr<grammar::TokenConstraint> CompletionJob::make_constraint(bool thinking) const {
  if (!request_.constrained()) return nullptr;
  grammar::Spec spec;
  spec.reasoning = thinking;
  spec.json = request_.json_schema;
  spec.single_call = !request_.parallel_tool_calls;
  // The tools a call may name: all of them (required, or auto beside a response format), or the named one.
  std::vector<size_t> tool_index;
  for (size_t i = 0; i < request_.tools.size(); ++i) {
    const Json& function = request_.tools[i].definition["function"];
    const std::string name = function["name"].get<std::string>();
    if (request_.tool_choice == CompletionRequest::ToolChoice::kNamed && name != request_.forced_tool) continue;
    spec.tools.push_back({name, function.value("parameters", Json())});
    tool_index.push_back(i);
  }
  std::shared_ptr<const grammar::Grammar> g;
  try {
    g = grammar::compile(spec);
  } catch (const grammar::SchemaError& e) {
    const bool messages = request_.endpoint == Endpoint::kMessages;
    const std::string param = e.tool < 0 ? request_.json_schema_field
                                         : "tools[" + std::to_string(tool_index[size_t(e.tool)]) + "]" +
                                               (messages ? ".input_schema" : ".function.parameters");
    throw invalid_request(param + " " + e.what(), e.tool < 0 ? request_.json_schema_field : "tools");
  }
  return std::make_unique<grammar::TokenConstraint>(std::move(g), service_.vocabulary_);
}

void CompletionJob::submit_all(const std::vector<std::vector<int32_t>>& prompts, bool chat, bool thinking,
                               const grammar::TokenConstraint* constraint) {
  const int64_t context = service_.scheduler_.options().max_context;
  const uint64_t seed = request_.seed_given ? request_.sampling.seed : std::random_device{}();
  const std::string call_id_prefix = request_.endpoint == Endpoint::kMessages ? "toolu_" : "call_";
  for (const auto& prompt : prompts) {
    for (int64_t j = 0; j < request_.n; ++j) {
      const size_t index = choices_.size();
      choices_.push_back(std::make_unique<Choice>(
          int64_t(index), OutputDecoder(service_.tokenizer_, chat, thinking, request_.stop, call_id_prefix)));
      Choice& c = *choices_.back();
      GenerationRequest g;
      g.prompt = prompt;
      g.max_tokens = request_.max_tokens.value_or(context - int64_t(prompt.size()));
      g.sampling = request_.sampling;
      g.sampling.seed = seed + uint64_t(index);
      g.stop_at_eos = !request_.ignore_eos;
      g.logprobs = request_.logprobs;
      if (constraint) g.constraint = std::make_shared<grammar::TokenConstraint>(*constraint);
      c.finished = true;  // until the scheduler has it
      std::optional<Scheduler::RequestId> id;
      try {
        id = service_.scheduler_.submit(std::move(g), [inbox = inbox_, index](const GenerationEvent& e) {
          {
            std::lock_guard lock(inbox->mutex);
            inbox->items.push_back({index, e, clock::now()});
          }
          inbox->ready.notify_one();
        });
      } catch (const Error& e) {
        throw invalid_request(e.what());
      }
      if (!id) {
        throw ApiError(429, "The server is overloaded: every sequence slot is busy and the queue is full. Retry later.",
                       "rate_limit_error", "", "rate_limit_exceeded");
      }
      c.id = *id;
      c.finished = false;
    }
  }
}

CompletionJob::~CompletionJob() { cancel(); }

void CompletionJob::cancel() {
  for (auto& c : choices_) {
    if (c->finished) continue;
    service_.scheduler_.cancel(c->id);
    c->finished = true;
    c->finish_reason = "abort";
    service_.metrics_.finished("abort");
  }
}

bool CompletionJob::all_finished() const {
  for (const auto& c : choices_)
    if (!c->finished) return false;
  return true;
}

void CompletionJob::finish_choice(Choice& c, const std::string& reason, std::vector<SseEvent>& out) {
  const ChatDelta rest = c.decoder.finish();
  c.finished = true;
  // A model that ended its turn after tool calls asks for them to be run.
  c.finish_reason = reason == "stop" && !c.decoder.output().tool_calls.empty() ? "tool_calls" : reason;
  const clock::time_point now = clock::now();
  service_.metrics_.observe_e2e(seconds(now - arrival_));
  service_.metrics_.finished(c.finish_reason);
  if (c.admitted) {  // a sequence that ran: its queue, prefill and decode time (zero for phases it never reached)
    const clock::time_point first = c.first_token.value_or(now);
    service_.metrics_.request_phases(seconds(*c.admitted - arrival_), seconds(first - *c.admitted),
                                     seconds(now - first), prompt_lengths_[size_t(c.index / request_.n)], c.generated);
  }
  if (!request_.stream) return;
  if (request_.endpoint != Endpoint::kMessages) {
    if (!rest.empty()) send_chunk(c, rest, "", out);
    send_chunk(c, {}, c.finish_reason, out);
    return;
  }
  for (const Json& e : c.message.delta(rest)) out.push_back(anthropic_event(e));
  if (reason == "error") return;  // the stream ends with the error event instead
  const std::string& stop_sequence = c.decoder.stop_sequence();
  for (const Json& e : c.message.finish(stop_reason(c.finish_reason, stop_sequence), stop_sequence, c.generated))
    out.push_back(anthropic_event(e));
}

Json CompletionJob::logprobs_json(const Choice& c, size_t from) const {
  if (!request_.logprobs) return nullptr;
  const std::vector<LogprobEntry> entries(c.logprobs.begin() + std::ptrdiff_t(from), c.logprobs.end());
  return request_.endpoint == Endpoint::kCompletions ? text_logprobs_json(entries) : chat_logprobs_json(entries);
}

void CompletionJob::send_chunk(Choice& c, const ChatDelta& delta, const std::string& finish_reason,
                               std::vector<SseEvent>& out) {
  // The logprobs of the tokens since the last chunk (null in a chunk that carries none: the finish chunk).
  const Json logprobs = c.logprobs.size() > c.logprobs_sent ? logprobs_json(c, c.logprobs_sent) : Json();
  c.logprobs_sent = c.logprobs.size();
  Json chunk = response_envelope(header_);
  chunk["choices"] = Json::array(
      {request_.endpoint == Endpoint::kChatCompletions
           ? chat_chunk_choice_json(c.index, delta, c.first_chunk, finish_reason, logprobs)
           : text_choice_json(c.index, completion_text(c, delta.content), finish_reason, logprobs)});
  c.first_chunk = false;
  out.push_back({"", json_text(chunk)});
}

void CompletionJob::handle(size_t index, const GenerationEvent& event, clock::time_point at,
                           std::vector<SseEvent>& out) {
  Choice& c = *choices_[index];
  if (c.finished) return;  // stopped here (stop string, cancel) before the engine heard of it
  Metrics& metrics = service_.metrics_;
  if (event.admitted) {
    c.admitted = at;
    return;
  }
  if (event.token) {
    metrics.add_generation_tokens(1);
    if (c.generated == 0) {
      metrics.observe_ttft(seconds(at - arrival_));
      c.first_token = at;
    } else {
      metrics.observe_itl(seconds(at - c.last_token));
    }
    c.last_token = at;
    ++c.generated;
    if (event.logprobs) {
      LogprobEntry& e = c.logprobs.emplace_back();
      e.token = logprob_token(service_.tokenizer_, *event.token, event.logprobs->logprob);
      for (const auto& [id, logprob] : event.logprobs->top)
        e.top.push_back(logprob_token(service_.tokenizer_, id, logprob));
      e.text_offset = c.decoder.text_chars();  // echo is refused with logprobs: the text starts with the output
    }
    const ChatDelta delta = c.decoder.push(*event.token);
    const bool opening = c.first_chunk && (request_.endpoint == Endpoint::kChatCompletions || request_.echo);
    if (request_.stream && request_.endpoint == Endpoint::kMessages) {
      for (const Json& e : c.message.delta(delta)) out.push_back(anthropic_event(e));
    } else if (request_.stream && (!delta.empty() || c.logprobs.size() > c.logprobs_sent || opening)) {
      send_chunk(c, delta, "", out);
    }
    if (c.decoder.stopped()) {
      service_.scheduler_.cancel(c.id);
      finish_choice(c, "stop", out);
    }
    return;
  }
  switch (*event.finished) {
    case FinishReason::kLength: finish_choice(c, "length", out); break;
    case FinishReason::kEos: finish_choice(c, "stop", out); break;
    case FinishReason::kCancelled: finish_choice(c, "abort", out); break;
    case FinishReason::kError: {
      error_ = event.error;
      finish_choice(c, "error", out);
      if (!request_.stream) break;
      const ApiError error(500, "generation failed: " + event.error, "server_error");
      out.push_back(request_.endpoint == Endpoint::kMessages ? anthropic_event(anthropic_error_body(error))
                                                             : SseEvent{"", json_text(error_body(error))});
      break;
    }
  }
}

std::vector<SseEvent> CompletionJob::drain(std::chrono::milliseconds wait) {
  std::deque<Inbox::Item> items;
  {
    std::unique_lock lock(inbox_->mutex);
    inbox_->ready.wait_for(lock, wait, [&] { return !inbox_->items.empty(); });
    items.swap(inbox_->items);
  }
  std::vector<SseEvent> out;
  for (const auto& item : items) handle(item.choice, item.event, item.at, out);
  return out;
}

std::vector<SseEvent> CompletionJob::poll(std::chrono::milliseconds wait) {
  if (done_sent_) return {};
  if (!started_) {  // an Anthropic stream opens at once, before the prompt is read
    started_ = true;
    if (request_.endpoint == Endpoint::kMessages) {
      std::vector<SseEvent> out;
      for (const Json& e : message_start(header_, prompt_lengths_[0])) out.push_back(anthropic_event(e));
      return out;
    }
  }
  std::vector<SseEvent> out = drain(wait);
  if (all_finished()) {
    if (request_.endpoint != Endpoint::kMessages) {  // Anthropic's message_stop was the last event
      if (request_.include_usage) {
        Json chunk = response_envelope(header_);
        chunk["choices"] = Json::array();
        chunk["usage"] = usage_json(usage());
        out.push_back({"", json_text(chunk)});
      }
      out.push_back({"", "[DONE]"});
    }
    done_sent_ = true;
  }
  return out;
}

std::string CompletionJob::completion_text(const Choice& c, const std::string& content) const {
  if (!request_.echo || (request_.stream && !c.first_chunk)) return content;
  return echoes_[size_t(c.index / request_.n)] + content;
}

Usage CompletionJob::usage() const {
  Usage usage;
  for (int64_t l : prompt_lengths_) usage.prompt_tokens += l;
  for (const auto& c : choices_) usage.completion_tokens += c->generated;
  return usage;
}

std::optional<Json> CompletionJob::wait(const std::function<bool()>& abandoned) {
  while (!all_finished()) {
    drain(std::chrono::milliseconds(100));
    if (!all_finished() && abandoned && abandoned()) {
      cancel();
      return std::nullopt;
    }
  }
  if (!error_.empty()) throw ApiError(500, "generation failed: " + error_, "server_error");
  if (request_.endpoint == Endpoint::kMessages) {  // one choice
    const Choice& c = *choices_[0];
    const std::string& stop_sequence = c.decoder.stop_sequence();
    return message_json(header_, c.decoder.output(), stop_reason(c.finish_reason, stop_sequence), stop_sequence,
                        usage());
  }
  Json body = response_envelope(header_);
  Json choices = Json::array();
  for (const auto& c : choices_) {
    ChatChoice out = c->decoder.output();
    out.finish_reason = c->finish_reason;
    choices.push_back(request_.endpoint == Endpoint::kChatCompletions
                          ? chat_choice_json(c->index, out, logprobs_json(*c, 0))
                          : text_choice_json(c->index, completion_text(*c, out.content), out.finish_reason,
                                             logprobs_json(*c, 0)));
  }
  body["choices"] = choices;
  body["usage"] = usage_json(usage());
  return body;
}

}  // namespace dsv4::server
