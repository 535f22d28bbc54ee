// Constrained decoding, the grammar: what an answer may be, compiled from JSON schemas (response_format) and tool
// definitions (tool_choice, written as DeepSeek's DSML). The matcher (matcher.h) walks it byte by byte; the token
// masks (token_mask.h) ask the matcher which tokens of the vocabulary can come next. Design and limits:
// docs/design/constrained-decoding.md.
//
// A Grammar is immutable once compiled and shared by every sequence that uses it.
#pragma once

#include <bitset>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dsv4::grammar {

using Json = nlohmann::ordered_json;

inline constexpr uint32_t kUnbounded = UINT32_MAX;

// Limits of what the grammar lets a model write (documented in the README): a gap between JSON tokens is empty,
// one space, or a newline and up to kMaxIndent spaces or tabs; an integer has at most kMaxIntegerDigits digits
// (an int64), a number at most kMaxNumberBytes bytes and kMaxExponentDigits exponent digits (a finite double); the
// matcher has kMaxFrames frames (containers nest up to kMaxFrames - 2 deep in an answer, one less inside a tool
// call's arguments).
inline constexpr uint32_t kMaxIndent = 20;
inline constexpr uint32_t kMaxIntegerDigits = 18;
inline constexpr uint32_t kMaxNumberBytes = 32;
inline constexpr uint32_t kMaxExponentDigits = 2;
inline constexpr int kMaxFrames = 34;
inline constexpr int kMaxProperties = 64;  // per object (a bit set records the ones written)

// The tags a DSML tool-call block is made of, as chat/chat_tokens.h spells them (the grammar writes exactly what
// chat::ChatParser reads and chat::render_tool_calls writes).
inline constexpr std::string_view kDsmlBlockOpen = "\n\n<｜DSML｜tool_calls>\n";
inline constexpr std::string_view kDsmlInvokeOpen = "<｜DSML｜invoke name=\"";
inline constexpr std::string_view kDsmlParameterOpen = "<｜DSML｜parameter name=\"";
inline constexpr std::string_view kDsmlParameterClose = "</｜DSML｜parameter>";
inline constexpr std::string_view kDsmlInvokeClose = "</｜DSML｜invoke>";
inline constexpr std::string_view kDsmlBlockClose = "</｜DSML｜tool_calls>";
inline constexpr std::string_view kThinkEnd = "</think>";

// A JSON schema the grammar cannot honour: an unsupported keyword, a malformed value, an impossible schema.
// `tool` is the index of the tool whose parameters it is in (Spec::tools), -1 for the answer's schema.
class SchemaError : public Error {
 public:
  SchemaError(const std::string& message, int tool) : Error(message), tool(tool) {}
  int tool;
};

// What an answer may be.
struct Spec {
  struct Tool {
    std::string name;
    Json parameters;  // a JSON schema of an object (null: the tool takes no arguments)
  };
  bool reasoning = false;   // thinking mode: free text up to </think>, then the answer
  std::optional<Json> json;  // the answer may be one JSON value valid against this schema
  std::vector<Tool> tools;   // the answer may be a DSML block calling these tools (one or more calls)
  bool single_call = false;  // the DSML block holds exactly one call
};

// Throws SchemaError. With both json and tools the answer is either (a JSON value or a DSML block); with tools
// alone it must call a tool.
std::shared_ptr<const class Grammar> compile(const Spec& spec);

enum class NodeKind : uint8_t {
  kString,     // a JSON string (escapes allowed), min / max length in code points
  kRawString,  // a DSML string="true" value: raw text up to </｜DSML｜parameter> (consumed), min / max length
  kNumber,     // a JSON number (integer: no fraction or exponent)
  kLiterals,   // one of the strings of a literal set (enum, const, true / false / null, raw enum values)
  kObject,
  kArray,
  kUnion,      // one of several nodes, told apart by their first byte
  kInvoke,     // the parameters of one DSML tool call, up to and including </｜DSML｜invoke>
};

struct Property {
  std::string name;
  uint16_t node = 0;      // kObject: the value's node
  uint16_t raw = 0;       // kInvoke: the node of a string="true" value (kNone: not allowed)
  uint16_t json = 0;      // kInvoke: the node of a string="false" value (kNone: not allowed)
};

inline constexpr uint16_t kNone = UINT16_MAX;

struct Node {
  NodeKind kind = NodeKind::kString;
  uint32_t min = 0, max = kUnbounded;  // string / raw string: code points; array: items
  bool integer = false;                // kNumber
  uint16_t set = kNone;                // kLiterals: the literal set; kInvoke: its parameter menu
  uint16_t items = kNone;              // kArray
  std::vector<Property> properties;    // kObject / kInvoke: sorted by name
  uint64_t required = 0;               // kObject / kInvoke: bit i = properties[i] is required
  uint16_t additional = kNone;         // kObject: the node of other properties' values (kNone: none allowed)
  std::vector<uint16_t> alternatives;  // kUnion
  std::bitset<256> first;              // the bytes a value of this node can start with
};

// Byte strings matched in parallel. Sorted, so the items sharing a prefix form a range; `values` says what each
// item means to the frame that matches it.
struct LiteralSet {
  std::vector<std::string> items;
  std::vector<uint32_t> values;
  bool gated = false;  // a kInvoke menu: an item is offered only while its parameter or close is allowed
};

// Item values of the menus (LiteralSet::values) that choose the next part of a DSML block: kInvokeMenu items
// are a parameter (index << 1 | string="true") or a close; the root's items are a tool index or kCloseBlock.
inline constexpr uint32_t kCloseInvoke = 1u << 30;       // </｜DSML｜invoke> after at least one parameter
inline constexpr uint32_t kCloseEmptyInvoke = 1u << 29;  // \n</｜DSML｜invoke>: a call without parameters
inline constexpr uint32_t kCloseBlock = 1u << 28;        // \n</｜DSML｜tool_calls>

class Grammar {
 public:
  std::vector<Node> nodes;
  std::vector<LiteralSet> sets;
  bool reasoning = false;
  uint16_t json_root = kNone;        // the answer's JSON node, if a JSON answer is allowed
  std::vector<uint16_t> invokes;     // per tool: its kInvoke node (empty: no tool calls)
  uint16_t first_call = kNone;       // the literal set that opens the block and the first call (values: tool)
  uint16_t next_call = kNone;        // after a call: another one or the block's close
  uint16_t parameter_close = kNone;  // </｜DSML｜parameter>\n after a string="false" value
};

}  // namespace dsv4::grammar
