// One choice's generated tokens turned into what the API shows, incrementally: detokenized without broken
// UTF-8, cut at the first stop string, and for chat split into reasoning, content and tool calls (DSML). Each
// push() returns only the newly visible part, so a stream sends it as a delta and a plain response joins them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chat/chat_parser.h"
#include "server/openai_api.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::server {

class OutputDecoder {
 public:
  // chat: parse reasoning (thinking: the output starts inside <think>) and tool calls; otherwise all text is
  // content. Tool calls get ids `call_id_prefix` + random ("call_" for OpenAI, "toolu_" for Anthropic).
  OutputDecoder(const Tokenizer& tokenizer, bool chat, bool thinking, std::vector<std::string> stop,
                std::string call_id_prefix = "call_");

  ChatDelta push(int32_t token);
  ChatDelta finish();  // end of generation: releases held-back text

  bool stopped() const { return stop_.stopped(); }  // a stop string was reached: generate nothing more
  const std::string& stop_sequence() const { return stop_.matched(); }  // the one reached, if any
  // Code points of text the tokens pushed so far decode to (before stop strings cut it): where the next
  // token's text starts.
  int64_t text_chars() const { return text_chars_; }
  // Everything shown so far (complete after finish()); tool calls carry their ids.
  const ChatChoice& output() const { return output_; }

 private:
  ChatDelta advance(const std::string& text, bool final);

  StreamDecoder detok_;
  StopMatcher stop_;
  std::unique_ptr<chat::ChatParser> parser_;  // chat only
  bool raw_ = false;  // the model wrote malformed DSML: from there on, everything is plain content
  std::string call_id_prefix_;
  int64_t text_chars_ = 0;
  ChatChoice output_;
};

}  // namespace dsv4::server
