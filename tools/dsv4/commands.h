// The dsv4 subcommands; each parses its own options and returns the process exit status.
#pragma once

namespace dsv4::cli {

int cmd_chat(int argc, char** argv);
int cmd_generate(int argc, char** argv);
int cmd_perplexity(int argc, char** argv);
int cmd_info(int argc, char** argv);
int cmd_logits(int argc, char** argv);
int cmd_quantize(int argc, char** argv);
int cmd_synth(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_serve(int argc, char** argv);

}  // namespace dsv4::cli
