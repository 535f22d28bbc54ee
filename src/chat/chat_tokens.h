// The marker strings of the DeepSeek-V4 chat format (DeepSeek's encoding/encoding_dsv4.py), shared by the
// prompt encoder and the output parser. All of them are added tokens of the V4 tokenizer except the DSML tag
// names, which are "<" / "</" + the token ｜DSML｜ + plain text (see docs/design/chat-encoding.md).
#pragma once

#include <string_view>

namespace dsv4::chat {

inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";  // id 0, special
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";    // id 1, special
inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";

// DSML (DeepSeek markup) tags of a tool-call block. The open tags of invoke / parameter carry attributes
// (` name="..."`, ` string="true|false"`) and end with `">`.
inline constexpr std::string_view kToolCallsOpen = "<｜DSML｜tool_calls>";
inline constexpr std::string_view kToolCallsClose = "</｜DSML｜tool_calls>";
inline constexpr std::string_view kInvokeOpen = "<｜DSML｜invoke";
inline constexpr std::string_view kInvokeClose = "</｜DSML｜invoke>";
inline constexpr std::string_view kParameterOpen = "<｜DSML｜parameter";
inline constexpr std::string_view kParameterClose = "</｜DSML｜parameter>";
// The encoder writes "\n\n" before the block; the parser drops it from the content.
inline constexpr std::string_view kToolCallsLead = "\n\n";

inline constexpr std::string_view kToolResultOpen = "<tool_result>";
inline constexpr std::string_view kToolResultClose = "</tool_result>";

}  // namespace dsv4::chat
