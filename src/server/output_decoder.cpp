#include "server/output_decoder.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4::server {

OutputDecoder::OutputDecoder(const Tokenizer& tokenizer, bool chat, bool thinking, std::vector<std::string> stop,
                             std::string call_id_prefix)
    : detok_(tokenizer, /*skip_special=*/true), stop_(std::move(stop)), call_id_prefix_(std::move(call_id_prefix)) {
  if (chat) parser_ = std::make_unique<chat::ChatParser>(thinking);
}

ChatDelta OutputDecoder::push(int32_t token) {
  if (stop_.stopped()) return {};
  const std::string text = detok_.push(token);
  // Complete UTF-8 (the detokenizer holds back partial characters): count every byte but continuation bytes.
  text_chars_ += std::count_if(text.begin(), text.end(), [](char b) { return (uint8_t(b) & 0xC0) != 0x80; });
  return advance(stop_.feed(text), /*final=*/false);
}

ChatDelta OutputDecoder::finish() {
  std::string text;
  if (!stop_.stopped()) text = stop_.feed(detok_.finish());
  text += stop_.flush();
  return advance(text, /*final=*/true);
}

ChatDelta OutputDecoder::advance(const std::string& text, bool final) {
  ChatDelta delta;
  if (!parser_ || raw_) {
    delta.content = text;
    output_.content += text;
    return delta;
  }
  try {
    if (!text.empty()) parser_->feed(text);
    if (final) parser_->finish();
  } catch (const Error&) {
    // Keep what parsed; the text the parser had not consumed yet is lost with it, later text is content.
    raw_ = true;
  }
  // The parser's result only grows: the delta is every field's new suffix.
  const chat::ChatParseResult& r = parser_->result();
  delta.reasoning = r.reasoning.substr(output_.reasoning.size());
  delta.content = r.content.substr(output_.content.size());
  output_.reasoning = r.reasoning;
  output_.content = r.content;
  for (size_t i = 0; i < r.tool_calls.size(); ++i) {
    const chat::ParsedToolCall& call = r.tool_calls[i];
    ToolCallDelta d;
    d.index = int64_t(i);
    if (i == output_.tool_calls.size()) {
      output_.tool_calls.push_back({random_id(call_id_prefix_), call.name, ""});
      d.id = output_.tool_calls.back().id;
      d.name = call.name;
    }
    chat::ToolCall& shown = output_.tool_calls[i];
    d.arguments = call.arguments.substr(shown.arguments.size());
    shown.arguments = call.arguments;
    if (!d.id.empty() || !d.arguments.empty()) delta.tool_calls.push_back(d);
  }
  return delta;
}

}  // namespace dsv4::server
