// The DeepSeek-V4 chat prompt: messages (+ tool definitions) -> prompt text, reproducing DeepSeek's
// encoding_dsv4.py (encode_messages) byte for byte. The result is TEXT; the tokenizer turns the marker strings
// in it (<｜User｜>, <think>, ...) into their ids. Format, sources and deviations: docs/design/chat-encoding.md.
//
//   <｜begin▁of▁sentence｜>{system}[\n\n## Tools ...]<｜User｜>{user}<｜Assistant｜></think>{answer}<｜end▁of▁sentence｜>
//   ...<｜User｜>{last user}<｜Assistant｜><think>          (thinking mode: the model writes reasoning</think>answer)
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "chat/py_json.h"

namespace dsv4::chat {

// system / user / assistant / tool are the OpenAI roles. developer (a user turn that may carry tools; DeepSeek
// uses it in its search agent) and latest_reminder (<｜latest_reminder｜>{content}, e.g. date and locale) are
// DeepSeek's own.
enum class Role { kSystem, kUser, kAssistant, kTool, kDeveloper, kLatestReminder };

// "system", "user", ...; Error naming the role for anything else.
Role parse_role(std::string_view name);
std::string_view role_name(Role role);

struct ToolCall {
  std::string id;         // optional; orders the tool results that answer the calls
  std::string name;       // function name
  std::string arguments;  // a JSON object as text (OpenAI "arguments"); "" means no arguments
};

struct Message {
  Role role = Role::kUser;
  std::string content;
  std::string reasoning_content;     // assistant: the thinking of that turn (rendered per ChatOptions)
  std::vector<ToolCall> tool_calls;  // assistant only
  std::string tool_call_id;          // tool: required, the id of the call this result answers
  std::string name;                  // tool: the function name (informational, not rendered)
  bool prefix = false;  // assistant: an unfinished answer for the model to continue (no EOS; must be last)
};

// One OpenAI tool: {"type": "function", "function": {"name", "description", "parameters"}}. Only "function" is
// rendered, with Python's json.dumps spelling and the key order given here, so parse request bodies with
// ordered_json (nlohmann::json sorts keys and the prompt would differ from DeepSeek's).
struct Tool {
  OrderedJson definition;
};

enum class ReasoningEffort {
  kDefault,  // no prompt (the encoder's None)
  kHigh,     // accepted by encoding_dsv4.py but renders nothing either
  kMax,      // thinking mode only: the "Reasoning Effort: Absolute maximum ..." paragraph right after BOS
};

struct ChatOptions {
  bool thinking = false;  // thinking mode (generation starts inside <think>) vs chat mode (starts after </think>)
  // After a final user / developer turn, append <｜Assistant｜> + <think> (thinking) or </think> (chat).
  bool add_generation_prompt = true;
  // Thinking mode: omit the reasoning of assistant turns before the last user turn (encoding_dsv4.py's
  // drop_thinking, default on). Ignored (reasoning kept) when tools are given, as in encoding_dsv4.py.
  bool drop_earlier_reasoning = true;
  bool add_bos = true;
  ReasoningEffort reasoning_effort = ReasoningEffort::kDefault;
};

// The prompt text. Tools go on the leading system (or developer) message; without one, an empty system
// message is put first for them (so the prompt starts "<BOS>\n\n## Tools"). Throws Error on malformed input:
// a tool message without tool_call_id, tool calls on a non-assistant message, a tool call without a name or
// whose arguments are JSON but not an object, an empty developer message, a tool definition without
// function.name, a prefix message that is not the last assistant message.
std::string encode_chat(const std::vector<Message>& messages, const std::vector<Tool>& tools,
                        const ChatOptions& options);

// The "## Tools" section (ends with a newline) that encode_chat appends to the system message after "\n\n".
std::string render_tools(const std::vector<Tool>& tools);

// The DSML block for an assistant's tool calls, starting with "\n\n<｜DSML｜tool_calls>" (no EOS).
std::string render_tool_calls(const std::vector<ToolCall>& calls);

// OpenAI chat-completions JSON -> Message: role, content (a string, null, or an array of {"type": "text"} parts
// joined with "\n\n"), reasoning_content (or "reasoning"), tool_calls[].{id, function.{name, arguments}}
// (arguments a string or an object), tool_call_id, name, prefix. Error on unknown roles and wrong types.
Message message_from_json(const OrderedJson& j);
// {"type": "function", "function": {...}} -> Tool; Error if function.name is missing.
Tool tool_from_json(const OrderedJson& j);

}  // namespace dsv4::chat
