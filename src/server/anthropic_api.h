// Anthropic's Messages API (POST /v1/messages) on top of the chat plumbing: a request body parsed and validated
// into the same CompletionRequest the OpenAI chat endpoint makes (system, messages of text / thinking /
// tool_use / tool_result blocks, tools, thinking mode), and a choice's output spelled as a message: content
// blocks, stop_reason, usage, Anthropic's stream events and error shape. No HTTP and no engine here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/openai_api.h"

namespace dsv4::server {

// Parses a /v1/messages body. Required: model, max_tokens, messages. Thinking mode with "thinking": {"type":
// "enabled", "budget_tokens"} (the budget is checked, not enforced: max_tokens bounds the reasoning too) or
// {"type": "adaptive"}. tool_choice any / tool and output_config.format are honoured by constrained decoding.
// Throws ApiError (400) naming the field for malformed or missing fields, and for what this server does not
// implement (image and document blocks, server tools, strict tools under tool_choice auto, ...).
CompletionRequest parse_messages(const std::string& body, const SamplingParams& defaults);

// {"type": "error", "error": {"type", "message"}}, the type from the status (400 invalid_request_error, 401
// authentication_error, 404 not_found_error, 413 request_too_large, 429 rate_limit_error, 5xx api_error, ...).
Json anthropic_error_body(const ApiError& error);

// An OpenAI finish reason ("stop", "length", "tool_calls", ...) as a stop_reason: end_turn, max_tokens,
// tool_use, or stop_sequence when `stop_sequence` (the stop string reached) is not empty.
std::string stop_reason(const std::string& finish_reason, const std::string& stop_sequence);

// A whole message: {"id", "type": "message", "role": "assistant", "model", "content": [thinking, text,
// tool_use... blocks], "stop_reason", "stop_sequence", "usage": {"input_tokens", "output_tokens"}}. A tool
// call's input is its arguments as an object; arguments that are not a JSON object (a call cut off by max_tokens)
// become {"arguments": text}, as DeepSeek's encoder reads such arguments back.
Json message_json(const ResponseHeader& header, const ChatChoice& choice, const std::string& stop_reason,
                  const std::string& stop_sequence, const Usage& usage);

// A streamed message's events are the `data` JSON objects; each one's "type" is also its SSE event name.
// The first ones: message_start (the message with no content yet, and its input tokens) and a ping.
std::vector<Json> message_start(const ResponseHeader& header, int64_t input_tokens);

// The events of one streamed message, made from its choice's deltas. Content blocks (thinking, text, tool_use)
// are numbered in the order they open; a block opens with its first text and closes when another opens or the
// message ends.
class MessageStream {
 public:
  // content_block_start / _delta (text_delta, thinking_delta, input_json_delta) / _stop.
  std::vector<Json> delta(const ChatDelta& delta);
  // The open block's content_block_stop, message_delta (stop_reason, stop_sequence, usage.output_tokens) and
  // message_stop.
  std::vector<Json> finish(const std::string& stop_reason, const std::string& stop_sequence, int64_t output_tokens);

 private:
  enum class Block { kNone, kThinking, kText, kToolUse };
  void open(Block kind, Json content_block, std::vector<Json>& out);
  void close(std::vector<Json>& out);
  Block open_ = Block::kNone;
  int64_t index_ = -1;  // the open block's (or the last closed one's) index
};

}  // namespace dsv4::server
