// Incremental parser of DeepSeek-V4 output text (the text generated after the prompt of encode_chat) into
// reasoning, content and DSML tool calls: the reverse of the assistant turn,
//
//   [reasoning</think>]content[\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n
//   <｜DSML｜parameter name="k" string="true|false">v</｜DSML｜parameter>\n...</｜DSML｜invoke>\n...
//   </｜DSML｜tool_calls>]<｜end▁of▁sentence｜>
//
// Text may arrive in chunks of any size, split anywhere (inside a marker or a UTF-8 character): text that may
// be the start of a marker, or an incomplete UTF-8 character, is held back until the next chunk decides.
// Everything in ChatParseResult only grows, so a streaming server can send the new suffixes as deltas.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dsv4::chat {

struct ParsedToolCall {
  std::string name;
  // JSON object text in DeepSeek's spelling ({"k": v, "k2": v2}): string="true" values as JSON strings,
  // string="false" values verbatim. While !complete it is the text so far without the closing brace
  // ("{" then "{\"k\": v" ...), always a prefix of the final text.
  std::string arguments;
  bool complete = false;  // </｜DSML｜invoke> seen
};

struct ChatParseResult {
  std::string reasoning;  // thinking mode: the text before </think>
  std::string content;    // the answer, without the "\n\n" that introduces a tool-call block
  std::vector<ParsedToolCall> tool_calls;
  bool stopped = false;  // <｜end▁of▁sentence｜> seen; later text is ignored
};

class ChatParser {
 public:
  // thinking: the prompt ended with <think>, so the output starts with reasoning (up to </think>).
  explicit ChatParser(bool thinking);

  // Appends generated text and parses as far as it can. Throws Error on malformed DSML markup inside a
  // tool-call block (unknown tag, missing attribute, duplicate parameter, text after the block); the parser
  // is unusable afterwards (result() keeps what was parsed before the error).
  void feed(std::string_view text);
  // End of generation: releases text held back as a possible marker prefix. A tool call cut off by the end
  // stays with complete == false. feed() may not be called afterwards.
  void finish();

  const ChatParseResult& result() const { return result_; }

 private:
  enum class State { kReasoning, kContent, kToolCalls, kInvoke, kParameterValue, kAfterToolCalls, kDone };

  void parse(bool final);
  bool step_text(bool final);  // kReasoning / kContent
  bool step_tool_calls();
  bool step_invoke();
  bool step_parameter_value();
  bool step_after_tool_calls();

  State state_;
  std::string pending_;  // text not parsed yet
  size_t scanned_ = 0;   // kParameterValue: pending_[0, scanned_) holds no closing tag start
  bool finished_ = false;
  // The parameter being read: name, string="true", and the names seen in the current invoke.
  std::string param_name_;
  bool param_is_string_ = false;
  std::vector<std::string> param_names_;
  ChatParseResult result_;
};

// One-shot: feed(text) then finish().
ChatParseResult parse_chat_output(std::string_view text, bool thinking);

}  // namespace dsv4::chat
