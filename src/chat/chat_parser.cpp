// Incremental DeepSeek-V4 output parser: a small state machine over a buffer of unparsed text. Text states
// (reasoning, content) emit everything except a tail that could still become a marker; tool-call states
// consume whole tags and parameters only.
#include "chat/chat_parser.h"

#include <algorithm>
#include <initializer_list>
#include <nlohmann/json.hpp>

#include "chat/chat_tokens.h"
#include "chat/py_json.h"
#include "core/error.h"

namespace dsv4::chat {

namespace {

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// Length of the longest suffix of `text` that is a proper prefix of `marker`.
size_t partial_marker(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

// Bytes at the end of `text` that start a UTF-8 character whose remaining bytes have not arrived.
size_t incomplete_utf8(std::string_view text) {
  size_t cont = 0;
  for (size_t i = text.size(); i > 0 && cont < 4; --i) {
    const auto c = static_cast<unsigned char>(text[i - 1]);
    if ((c & 0xC0) == 0x80) {
      ++cont;
      continue;
    }
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return cont + 1 < need ? cont + 1 : 0;
  }
  return 0;
}

// Earliest occurrence of any marker: {position, marker}; {npos, {}} when none.
std::pair<size_t, std::string_view> find_first(std::string_view text, std::initializer_list<std::string_view> markers) {
  std::pair<size_t, std::string_view> best{std::string_view::npos, {}};
  for (const std::string_view m : markers) {
    const size_t pos = text.find(m);
    if (pos < best.first) best = {pos, m};
  }
  return best;
}

bool is_proper_prefix_of(std::string_view text, std::string_view marker) {
  return text.size() < marker.size() && marker.substr(0, text.size()) == text;
}

std::string excerpt(std::string_view text) {
  return std::string(text.substr(0, 60)) + (text.size() > 60 ? "..." : "");
}

// The attributes of the open tag `tag` at the start of `text` whose closing `">` is at `end`: ` name="f"`.
std::string_view attribute_text(std::string_view text, std::string_view tag, size_t end) {
  return text.substr(tag.size(), end + 1 - tag.size());
}

// Attributes of an open tag: ` name="x" string="true"` -> {{"name", "x"}, {"string", "true"}}.
std::vector<std::pair<std::string, std::string>> parse_attributes(std::string_view text, std::string_view tag) {
  std::vector<std::pair<std::string, std::string>> attrs;
  size_t i = 0;
  while (true) {
    while (i < text.size() && is_space(text[i])) ++i;
    if (i == text.size()) return attrs;
    const size_t eq = text.find("=\"", i);
    DSV4_CHECK(eq != std::string_view::npos, "malformed DSML tag ", tag, ": expected key=\"value\" in '",
               excerpt(text), "'");
    const size_t close = text.find('"', eq + 2);
    DSV4_CHECK(close != std::string_view::npos, "malformed DSML tag ", tag, ": unterminated attribute in '",
               excerpt(text), "'");
    attrs.emplace_back(std::string(text.substr(i, eq - i)), std::string(text.substr(eq + 2, close - eq - 2)));
    i = close + 1;
  }
}

const std::string* attribute(const std::vector<std::pair<std::string, std::string>>& attrs, std::string_view key) {
  for (const auto& [k, v] : attrs)
    if (k == key) return &v;
  return nullptr;
}

}  // namespace

ChatParser::ChatParser(bool thinking) : state_(thinking ? State::kReasoning : State::kContent) {}

void ChatParser::feed(std::string_view text) {
  DSV4_CHECK(!finished_, "ChatParser: feed() after finish() or after an error");
  pending_ += text;
  try {
    parse(false);
  } catch (...) {
    finished_ = true;  // the state is not consistent any more
    throw;
  }
}

void ChatParser::finish() {
  if (finished_) return;
  finished_ = true;
  parse(true);
}

void ChatParser::parse(bool final) {
  bool progress = true;
  while (progress) {
    switch (state_) {
      case State::kReasoning:
      case State::kContent: progress = step_text(final); break;
      case State::kToolCalls: progress = step_tool_calls(); break;
      case State::kInvoke: progress = step_invoke(); break;
      case State::kParameterValue: progress = step_parameter_value(); break;
      case State::kAfterToolCalls: progress = step_after_tool_calls(); break;
      case State::kDone:
        pending_.clear();
        progress = false;
        break;
    }
  }
}

// Reasoning ends at </think>; content ends at the tool-call block or EOS. Both end at EOS.
bool ChatParser::step_text(bool final) {
  const bool reasoning = state_ == State::kReasoning;
  std::string& out = reasoning ? result_.reasoning : result_.content;
  const auto [pos, marker] = reasoning ? find_first(pending_, {kThinkEnd, kEos})
                                       : find_first(pending_, {kToolCallsOpen, kEos});
  if (pos != std::string::npos) {
    size_t text_end = pos;
    if (marker == kToolCallsOpen && pos >= kToolCallsLead.size() &&
        std::string_view(pending_).substr(pos - kToolCallsLead.size(), kToolCallsLead.size()) == kToolCallsLead) {
      text_end -= kToolCallsLead.size();  // the "\n\n" belongs to the block, not to the content
    }
    out.append(pending_, 0, text_end);
    pending_.erase(0, pos + marker.size());
    if (marker == kEos) {
      result_.stopped = true;
      state_ = State::kDone;
    } else {
      state_ = marker == kThinkEnd ? State::kContent : State::kToolCalls;
    }
    return true;
  }
  size_t keep = 0;
  if (!final) {
    // Hold back what may still become a marker (for content also the "\n\n" that may precede a block).
    const std::string lead = std::string(kToolCallsLead) + std::string(kToolCallsOpen);
    keep = reasoning ? std::max(partial_marker(pending_, kThinkEnd), partial_marker(pending_, kEos))
                     : std::max({partial_marker(pending_, kToolCallsOpen), partial_marker(pending_, lead),
                                 partial_marker(pending_, kEos)});
    keep += incomplete_utf8(std::string_view(pending_).substr(0, pending_.size() - keep));
  }
  out.append(pending_, 0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return false;
}

// Between invokes: whitespace, then <｜DSML｜invoke name="f"> or </｜DSML｜tool_calls>.
bool ChatParser::step_tool_calls() {
  const size_t start = std::min(pending_.find_first_not_of(" \t\r\n"), pending_.size());
  pending_.erase(0, start);
  if (pending_.empty()) return false;
  if (pending_.starts_with(kToolCallsClose)) {
    pending_.erase(0, kToolCallsClose.size());
    state_ = State::kAfterToolCalls;
    return true;
  }
  if (pending_.starts_with(kInvokeOpen)) {
    const size_t end = pending_.find("\">", kInvokeOpen.size());
    if (end == std::string::npos) return false;  // the tag is not complete yet
    const auto attrs = parse_attributes(attribute_text(pending_, kInvokeOpen, end), "invoke");
    const std::string* name = attribute(attrs, "name");
    DSV4_CHECK(name && !name->empty(), "malformed DSML invoke tag: no name in '", excerpt(pending_), "'");
    result_.tool_calls.push_back({*name, "{", false});
    param_names_.clear();
    pending_.erase(0, end + 2);
    state_ = State::kInvoke;
    return true;
  }
  if (is_proper_prefix_of(pending_, kToolCallsClose) || is_proper_prefix_of(pending_, kInvokeOpen)) return false;
  fail(cat("malformed DSML tool calls: expected <｜DSML｜invoke or </｜DSML｜tool_calls>, got '", excerpt(pending_), "'"));
}

// Inside an invoke: whitespace, then <｜DSML｜parameter name="k" string="true|false"> or </｜DSML｜invoke>.
bool ChatParser::step_invoke() {
  const size_t start = std::min(pending_.find_first_not_of(" \t\r\n"), pending_.size());
  pending_.erase(0, start);
  if (pending_.empty()) return false;
  if (pending_.starts_with(kInvokeClose)) {
    pending_.erase(0, kInvokeClose.size());
    ParsedToolCall& call = result_.tool_calls.back();
    call.arguments += '}';
    call.complete = true;
    state_ = State::kToolCalls;
    return true;
  }
  if (pending_.starts_with(kParameterOpen)) {
    const size_t end = pending_.find("\">", kParameterOpen.size());
    if (end == std::string::npos) return false;
    const auto attrs = parse_attributes(attribute_text(pending_, kParameterOpen, end), "parameter");
    const std::string* name = attribute(attrs, "name");
    const std::string* is_string = attribute(attrs, "string");
    DSV4_CHECK(name && !name->empty(), "malformed DSML parameter tag: no name in '", excerpt(pending_), "'");
    DSV4_CHECK(is_string && (*is_string == "true" || *is_string == "false"),
               "malformed DSML parameter tag: string=\"true\" or \"false\" expected in '", excerpt(pending_), "'");
    DSV4_CHECK(std::find(param_names_.begin(), param_names_.end(), *name) == param_names_.end(),
               "malformed DSML tool call '", result_.tool_calls.back().name, "': duplicate parameter '", *name, "'");
    param_names_.push_back(*name);
    param_name_ = *name;
    param_is_string_ = *is_string == "true";
    pending_.erase(0, end + 2);
    scanned_ = 0;
    state_ = State::kParameterValue;
    return true;
  }
  if (is_proper_prefix_of(pending_, kInvokeClose) || is_proper_prefix_of(pending_, kParameterOpen)) return false;
  fail(cat("malformed DSML invoke '", result_.tool_calls.back().name,
           "': expected <｜DSML｜parameter or </｜DSML｜invoke>, got '", excerpt(pending_), "'"));
}

// A parameter value is everything up to </｜DSML｜parameter> (it may contain newlines and '<').
bool ChatParser::step_parameter_value() {
  const size_t pos = pending_.find(kParameterClose, scanned_);
  const size_t eos = pending_.find(kEos, scanned_);
  DSV4_CHECK(eos == std::string::npos || eos > pos, "malformed DSML tool call '", result_.tool_calls.back().name,
             "': end of sentence inside parameter '", param_name_, "'");
  if (pos == std::string::npos) {
    // Resume the search where a closing tag (or EOS) could still start.
    const size_t longest = std::max(kParameterClose.size(), kEos.size());
    scanned_ = pending_.size() >= longest ? pending_.size() - longest + 1 : 0;
    return false;
  }
  const std::string_view value = std::string_view(pending_).substr(0, pos);
  ParsedToolCall& call = result_.tool_calls.back();
  if (call.arguments.size() > 1) call.arguments += ", ";
  call.arguments += py_json_string(param_name_);
  call.arguments += ": ";
  // string="false" values are JSON already and go in verbatim; one that does not parse is kept as a string
  // so that the arguments stay valid JSON (encoding_dsv4.py would copy it as it is).
  if (param_is_string_ || !nlohmann::json::accept(value)) {
    call.arguments += py_json_string(value);
  } else {
    call.arguments += value;
  }
  pending_.erase(0, pos + kParameterClose.size());
  state_ = State::kInvoke;
  return true;
}

// After </｜DSML｜tool_calls>: only whitespace and EOS may follow.
bool ChatParser::step_after_tool_calls() {
  const size_t start = std::min(pending_.find_first_not_of(" \t\r\n"), pending_.size());
  pending_.erase(0, start);
  if (pending_.empty()) return false;
  if (pending_.starts_with(kEos)) {
    result_.stopped = true;
    state_ = State::kDone;
    return true;
  }
  if (is_proper_prefix_of(pending_, kEos)) return false;
  fail(cat("malformed DSML tool calls: unexpected text after </｜DSML｜tool_calls>: '", excerpt(pending_), "'"));
}

ChatParseResult parse_chat_output(std::string_view text, bool thinking) {
  ChatParser parser(thinking);
  parser.feed(text);
  parser.finish();
  return parser.result();
}

}  // namespace dsv4::chat
