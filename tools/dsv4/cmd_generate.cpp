// dsv4 generate: prefill a prompt (text or token ids), then decode one token at a time, streaming the text.
#include <cstdio>
#include <optional>
#include <vector>

#include "args.h"
#include "commands.h"
#include "core/error.h"
#include "engine/generator.h"
#include "model_options.h"
#include "sampling_options.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::cli {

namespace {

constexpr const char* kUsage = R"(usage: dsv4 generate [-p TEXT | --prompt-ids 1,2,3] [options]

Prefills the prompt, then decodes one token at a time. With -p, the prompt and then the new text are streamed
(the model directory must hold tokenizer.json); with --prompt-ids, the new ids are printed space-separated
as the last line of stdout. A stats line (prompt tokens, time to first token, tokens/s) goes to stderr.

  -p, --prompt TEXT    prompt text (BOS is prepended)
  --prompt-ids IDS     comma-separated prompt token ids (used as given)
  --max-tokens N       new tokens to generate (default 128)
  --ignore-eos         keep generating after the end-of-sequence token
  --stop STR           stop when the generated text contains STR (text mode)
  --print-ids          also print the generated ids as the last line (always on with --prompt-ids)
)";

}  // namespace

int cmd_generate(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::printf("%s%s%s", kUsage, kSamplingHelp, kModelOptionsHelp);
    return 0;
  }
  const Args args(argc, argv, 2,
                  Args::options({{"-p", "--prompt", "--prompt-ids", "--max-tokens", "--stop"},
                                 sampling_options(),
                                 model_options()}),
                  {"--ignore-eos", "--print-ids"});
  const bool text_mode = args.has("-p") || args.has("--prompt");
  DSV4_CHECK(text_mode != args.has("--prompt-ids"), "give exactly one of -p TEXT or --prompt-ids IDS");
  const int64_t max_tokens = args.get_int("--max-tokens", 128);
  DSV4_CHECK(max_tokens >= 0, "--max-tokens must not be negative");
  const SamplingParams sampling = sampling_params(args, text_mode ? 0.8f : 0.0f);

  std::optional<Tokenizer> tokenizer;
  std::vector<int32_t> prompt;
  if (text_mode) {
    tokenizer = Tokenizer::from_file(tokenizer_dir(args));
    prompt = tokenizer->encode(args.has("-p") ? args.get("-p") : args.get("--prompt"), /*add_bos=*/true);
  } else {
    prompt = args.get_ids("--prompt-ids");
  }
  LoadedModel m = load(args, int64_t(prompt.size()) + std::max<int64_t>(max_tokens, 1));

  Sampler sampler(sampling, m.weights->config.vocab_size);
  std::optional<StreamDecoder> stream;
  if (tokenizer) stream.emplace(*tokenizer, /*skip_special=*/true);
  StopMatcher stops(args.has("--stop") ? std::vector<std::string>{args.get("--stop")} : std::vector<std::string>{});
  std::vector<int32_t> generated;
  const auto emit = [&](const std::string& text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  };
  if (text_mode) emit(args.has("-p") ? args.get("-p") : args.get("--prompt"));  // the continuation follows it
  const GenerationStats stats =
      generate(*m.forward, prompt, max_tokens, sampler, !args.has("--ignore-eos"), [&](int32_t id) {
        generated.push_back(id);
        if (!stream) return true;
        emit(stops.feed(stream->push(id)));
        return !stops.stopped();
      });
  if (stream) {
    emit(stops.feed(stream->finish()) + stops.flush());
    emit("\n");
  }
  if (!text_mode || args.has("--print-ids")) {
    std::string line;
    for (size_t i = 0; i < generated.size(); ++i) {
      if (i) line += ' ';
      line += std::to_string(generated[i]);
    }
    std::printf("%s\n", line.c_str());
  }
  std::fprintf(stderr, "prompt %lld tokens, time to first token %.1f ms; generated %lld tokens, %.2f tokens/s\n",
               (long long)stats.prompt_tokens, stats.prefill_seconds * 1e3, (long long)stats.generated_tokens,
               stats.decode_tokens_per_second());
  return 0;
}

}  // namespace dsv4::cli
