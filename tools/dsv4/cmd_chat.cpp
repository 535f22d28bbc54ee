// dsv4 chat: an interactive multi-turn conversation using the DeepSeek-V4 chat encoding. The sequence state
// is kept between turns; only the new part of the encoded conversation is fed to the model.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "args.h"
#include "chat/chat_encoding.h"
#include "chat/chat_parser.h"
#include "commands.h"
#include "core/error.h"
#include "engine/generator.h"
#include "loader/hf_config.h"
#include "model_options.h"
#include "sampling_options.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::cli {

using namespace dsv4::chat;

namespace {

constexpr const char* kUsage = R"(usage: dsv4 chat [options]

Reads one user message per line from stdin and answers it. Commands: /reset clears the conversation,
/quit (or end of input) leaves.

  --system TEXT        system prompt
  --think              thinking mode (the model reasons inside <think> first; the reasoning is shown dimmed)
  --max-tokens N       tokens per answer (default 256)
  --context N          tokens the whole conversation may use (default: the model's context, at most 4096)
)";

}  // namespace

int cmd_chat(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::printf("%s%s%s", kUsage, kSamplingHelp, kModelOptionsHelp);
    return 0;
  }
  const Args args(argc, argv, 2,
                  Args::options({{"--system", "--max-tokens", "--context"},
                                 sampling_options(),
                                 model_options()}),
                  {"--think"});
  const int64_t max_tokens = args.get_int("--max-tokens", 256);
  const int64_t model_context = model_config(args).max_position_embeddings;
  const int64_t context = args.get_int("--context", model_context > 0 ? std::min<int64_t>(model_context, 4096) : 4096);
  DSV4_CHECK(max_tokens >= 1 && context > max_tokens, "need --max-tokens >= 1 and --context > --max-tokens");
  const Tokenizer tokenizer = Tokenizer::from_file(tokenizer_dir(args));
  LoadedModel m = load(args, context);
  const SamplingParams sampling = sampling_params(args, 0.7f);
  ChatOptions options;
  options.thinking = args.has("--think");

  const auto message = [](Role role, const std::string& content) {
    Message msg;
    msg.role = role;
    msg.content = content;
    return msg;
  };
  std::vector<Message> conversation;
  if (args.has("--system")) conversation.push_back(message(Role::kSystem, args.get("--system")));
  std::vector<int32_t> consumed;  // tokens already in the model's state
  const bool tty = isatty(fileno(stdout));
  std::string line;
  while (true) {
    if (tty) std::printf("> "), std::fflush(stdout);
    if (!std::getline(std::cin, line) || line == "/quit") break;
    if (line == "/reset") {
      conversation.resize(args.has("--system") ? 1 : 0);
      continue;
    }
    if (line.empty()) continue;
    conversation.push_back(message(Role::kUser, line));
    const std::vector<int32_t> prompt = tokenizer.encode(encode_chat(conversation, {}, options));
    // Reuse the state when the conversation so far is a prefix of the new prompt, else start over.
    const bool prefix = consumed.size() < prompt.size() && std::equal(consumed.begin(), consumed.end(), prompt.begin());
    if (!prefix) {
      m.forward->reset();
      consumed.clear();
    }
    const std::vector<int32_t> fresh(prompt.begin() + long(consumed.size()), prompt.end());
    if (m.forward->position() + int64_t(fresh.size()) + max_tokens > context) {
      std::fprintf(stderr, "(context of %lld tokens is full; /reset to start over)\n", (long long)context);
      conversation.pop_back();
      continue;
    }
    Sampler sampler(sampling, m.weights->config.vocab_size);
    StreamDecoder stream(tokenizer, /*skip_special=*/true);
    ChatParser parser(options.thinking);
    size_t shown_reasoning = 0, shown_content = 0;
    std::vector<int32_t> answer;
    const auto show = [&] {
      const ChatParseResult& r = parser.result();
      if (r.reasoning.size() > shown_reasoning) {
        std::printf("%s%s%s", tty ? "\033[2m" : "", r.reasoning.substr(shown_reasoning).c_str(), tty ? "\033[0m" : "");
        shown_reasoning = r.reasoning.size();
      }
      if (r.content.size() > shown_content) {
        if (shown_content == 0 && shown_reasoning > 0) std::printf("\n\n");  // the answer after the reasoning
        std::printf("%s", r.content.substr(shown_content).c_str());
        shown_content = r.content.size();
      }
      std::fflush(stdout);
    };
    const GenerationStats stats = generate(*m.forward, fresh, max_tokens, sampler, true, [&](int32_t id) {
      answer.push_back(id);
      parser.feed(stream.push(id));
      show();
      return !parser.result().stopped;
    });
    parser.feed(stream.finish());
    parser.finish();
    show();
    std::printf("\n");
    std::fprintf(stderr, "[%lld prompt tokens, first token %.0f ms, %.1f tokens/s]\n", (long long)stats.prompt_tokens,
                 stats.prefill_seconds * 1e3, stats.decode_tokens_per_second());
    consumed = prompt;
    consumed.insert(consumed.end(), answer.begin(), answer.end());
    Message reply = message(Role::kAssistant, parser.result().content);
    reply.reasoning_content = parser.result().reasoning;
    conversation.push_back(reply);
  }
  return 0;
}

}  // namespace dsv4::cli
