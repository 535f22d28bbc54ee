// The OpenAI API schema: request bodies of /v1/chat/completions and /v1/completions parsed and validated into
// plain structs, and the response objects, stream chunks and errors serialized. No HTTP and no engine here:
// every problem with a request becomes an ApiError carrying the status and the OpenAI error fields.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/chat_encoding.h"
#include "grammar/grammar.h"
#include "sampler/sampler.h"

namespace dsv4::server {

// Ordered: responses keep the field order of OpenAI's documentation, and tool schemas keep theirs (the prompt
// renders them in the order given).
using Json = nlohmann::ordered_json;

// {"error": {"message", "type", "param", "code"}} with an HTTP status.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string type, std::string param = {}, std::string code = {})
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string type;
  std::string param;  // the offending request field, empty when none
  std::string code;
};

// 400 invalid_request_error about `param`.
ApiError invalid_request(const std::string& message, const std::string& param = {},
                         const std::string& code = "invalid_value");
Json error_body(const ApiError& error);

// The text of a JSON value as the server sends it. Strings that are not valid UTF-8 (a request path, a parser's
// message quoting the offending byte, text a model emitted mid-character) have those bytes replaced by U+FFFD:
// nlohmann's dump() throws on them, which in an HTTP error handler ended the process.
std::string json_text(const Json& value);

// The readers of request fields, shared by the API schemas (anthropic_api too). A field that is absent or null
// reads as std::nullopt; a present field of the wrong type or out of range throws ApiError (400) naming it.
Json parse_object(const std::string& body);  // the body as a JSON object
const Json* field(const Json& body, const std::string& name);  // present and not null, else nullptr
std::string get_model(const Json& body);  // the required "model"
ApiError wrong_type(const std::string& name, const std::string& expected);
std::optional<bool> get_bool(const Json& body, const std::string& name);
std::optional<std::string> get_string(const Json& body, const std::string& name);
std::optional<int64_t> get_int(const Json& body, const std::string& name, int64_t lo, int64_t hi);
// A number in [lo, hi] (lo excluded when lo_open).
std::optional<float> get_number(const Json& body, const std::string& name, double lo, double hi,
                                bool lo_open = false);
// A string or an array of strings (at most 16), empty ones dropped.
std::vector<std::string> get_stop(const Json& body, const std::string& name);

// /v1/messages is Anthropic's Messages API (anthropic_api.h); it shares the chat fields of CompletionRequest.
enum class Endpoint { kChatCompletions, kCompletions, kMessages };

// The largest max_tokens a request may name (the context then bounds it: a 400 naming the prompt).
inline constexpr int64_t kMaxTokensField = int64_t(1) << 40;

// The most alternatives per token `top_logprobs` (chat) and `logprobs` (completions) may ask for.
inline constexpr int64_t kMaxTopLogprobs = 20;

struct CompletionRequest {
  Endpoint endpoint = Endpoint::kChatCompletions;
  std::string model;

  // /v1/chat/completions
  std::vector<chat::Message> messages;
  std::vector<chat::Tool> tools;       // empty with tool_choice "none"
  chat::ChatOptions chat_options;      // thinking mode and reasoning effort

  // /v1/completions: one entry per prompt, each either text or token ids
  struct Prompt {
    std::string text;
    std::vector<int32_t> tokens;
    bool is_tokens = false;
  };
  std::vector<Prompt> prompts;
  bool echo = false;  // each choice's text starts with its prompt's (token prompts: their decoded text)

  std::optional<int64_t> max_tokens;  // absent: as many as the context allows
  SamplingParams sampling;            // fields not given keep the server's defaults
  bool seed_given = false;
  std::vector<std::string> stop;
  int64_t n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool ignore_eos = false;
  // Set: report each generated token's log-probability with this many most likely alternatives (chat:
  // "logprobs": true and top_logprobs; completions: "logprobs": N).
  std::optional<int64_t> logprobs;

  // Constrained decoding (chat and messages). The answer must be a JSON value of `json_schema` (response_format
  // json_object: {"type": "object"}; json_schema; Anthropic's output_config.format), and/or, with tool_choice
  // required / a named function (Anthropic: any / tool), a DSML block of tool calls whose arguments follow the
  // tools' parameters. With tool_choice auto and a schema, the answer is either.
  std::optional<Json> json_schema;
  std::string json_schema_field;  // the request field that holds it, for errors
  enum class ToolChoice { kAuto, kRequired, kNamed };
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string forced_tool;        // kNamed: the function
  bool parallel_tool_calls = true;  // false: exactly one call (only honoured where a grammar applies)
  bool constrained() const { return json_schema || tool_choice != ToolChoice::kAuto; }
};

// Parses a request body of /v1/chat/completions or /v1/completions (Anthropic's: parse_messages); `defaults` are
// the sampling parameters used for fields the request leaves out.
// Throws ApiError (400) naming the field on malformed JSON, missing or wrong-typed fields and values out of
// range, and for features this server does not implement (prompt logprobs, suffix, best_of > n, ...).
CompletionRequest parse_request(Endpoint endpoint, const std::string& body, const SamplingParams& defaults);

// The rules between the constrained-decoding fields, shared with parse_messages: ignore_eos is refused with a
// grammar, and parallel tool calls can be turned off only where a grammar applies. Throws ApiError (400).
void check_constraint_fields(const CompletionRequest& r);

// POST /tokenize (vLLM's shape): {"model", "prompt", "add_special_tokens" (default true: the BOS)}, or {"model",
// "messages", and the chat fields} for the prompt /v1/chat/completions would build. Throws ApiError (400).
struct TokenizeRequest {
  std::string model;
  std::optional<CompletionRequest> chat;  // set for the messages form
  std::string prompt;
  bool add_special_tokens = true;
};
TokenizeRequest parse_tokenize(const std::string& body);

// POST /detokenize: {"model", "tokens": [ids]}. Throws ApiError (400).
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
DetokenizeRequest parse_detokenize(const std::string& body);

// One streamed piece of a chat choice's output.
struct ToolCallDelta {
  int64_t index = 0;  // position of the call in the choice's tool_calls
  std::string id;     // set on the call's first delta, with the name
  std::string name;
  std::string arguments;  // the newly arrived part of the JSON arguments text
};
struct ChatDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};
Json usage_json(const Usage& usage);

// The envelope shared by responses and chunks: id, object, created, model.
struct ResponseHeader {
  std::string id;  // "chatcmpl-…" / "cmpl-…"
  std::string object;
  int64_t created = 0;
  std::string model;
};
Json response_envelope(const ResponseHeader& header);

// A token as the logprobs objects spell it: its text ("bytes:\xNN..." when its bytes are not whole UTF-8 on
// their own, as OpenAI writes them), its bytes and its log-probability (clamped at -9999, as vLLM does).
struct LogprobToken {
  std::string text;
  std::string bytes;
  float logprob = 0.0f;
};
// One generated token's logprobs: the token, the most likely alternatives (most likely first) and, for
// completions, where its text starts in the choice's text (code points, after the echoed prompt).
struct LogprobEntry {
  LogprobToken token;
  std::vector<LogprobToken> top;
  int64_t text_offset = 0;
};
// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}.
Json chat_logprobs_json(const std::vector<LogprobEntry>& entries);
// Completions: {"tokens", "token_logprobs", "top_logprobs": [{text: logprob} of the alternatives and the token
// itself], "text_offset"}.
Json text_logprobs_json(const std::vector<LogprobEntry>& entries);

// A finished chat choice: {"index", "message": {"role", "content", ["reasoning_content"], ["tool_calls"]},
// "logprobs", "finish_reason"}. `logprobs` is null unless the request asked for them.
struct ChatChoice {
  std::string reasoning;
  std::string content;
  std::vector<chat::ToolCall> tool_calls;  // id, name, arguments
  std::string finish_reason;
};
Json chat_choice_json(int64_t index, const ChatChoice& choice, const Json& logprobs = nullptr);
// A chat.completion.chunk choice: {"index", "delta": {...}, "logprobs", "finish_reason"}.
Json chat_chunk_choice_json(int64_t index, const ChatDelta& delta, bool first, const std::string& finish_reason,
                            const Json& logprobs = nullptr);
// A text_completion choice (whole or streamed): {"index", "text", "logprobs", "finish_reason"}.
Json text_choice_json(int64_t index, const std::string& text, const std::string& finish_reason,
                      const Json& logprobs = nullptr);

// prefix + 24 random alphanumerics, as OpenAI's ids look ("chatcmpl-…", "call_…").
std::string random_id(const std::string& prefix);

}  // namespace dsv4::server
