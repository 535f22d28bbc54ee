// dsv4: the command-line front end. Each subcommand lives in its own file; errors become one line on
// stderr and exit status 1.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "commands.h"
#include "core/error.h"
#include "tokenizer/cli.h"

namespace {

constexpr const char* kUsage = R"(usage: dsv4 <command> [options]

commands:
  generate   write text (or token ids) continuing a prompt
  chat       talk to the model, one message per line
  serve      an OpenAI-compatible HTTP server with continuous batching
  perplexity score a text file
  info       show the compiled backends and visible GPUs
  logits     write the logits of every prompt position to a file
  quantize   convert a BF16 checkpoint into the official FP8 + FP4 layout
  synth      write a random checkpoint with V4-Flash / V4-Pro shapes and formats
  bench      prefill and decode throughput against the memory-bandwidth floor
  tokenize   text (JSON strings, one per line) to token ids with a tokenizer.json
  detokenize token ids (JSON arrays, one per line) back to text

Run 'dsv4 <command> --help' for the options of a command.
)";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 1 : 0;
  }
  const std::string command = argv[1];
  try {
    if (command == "generate") return dsv4::cli::cmd_generate(argc, argv);
    if (command == "chat") return dsv4::cli::cmd_chat(argc, argv);
    if (command == "serve") return dsv4::cli::cmd_serve(argc, argv);
    if (command == "perplexity") return dsv4::cli::cmd_perplexity(argc, argv);
    if (command == "info") return dsv4::cli::cmd_info(argc, argv);
    if (command == "logits") return dsv4::cli::cmd_logits(argc, argv);
    if (command == "quantize") return dsv4::cli::cmd_quantize(argc, argv);
    if (command == "synth") return dsv4::cli::cmd_synth(argc, argv);
    if (command == "bench") return dsv4::cli::cmd_bench(argc, argv);
    if (command == "tokenize") return dsv4::cli::cmd_tokenize(argc, argv);
    if (command == "detokenize") return dsv4::cli::cmd_detokenize(argc, argv);
    std::fprintf(stderr, "dsv4: unknown command '%s'\n%s", command.c_str(), kUsage);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv4 %s: error: %s\n", command.c_str(), e.what());
    return 1;
  }
}
