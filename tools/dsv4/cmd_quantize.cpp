// dsv4 quantize: BF16/F32 checkpoint → official FP8 (attention, shared experts) + FP4 (routed experts) layout.
#include <cstdio>

#include "args.h"
#include "commands.h"
#include "loader/quantize.h"

namespace dsv4::cli {

namespace {

constexpr const char* kHelp = R"(usage: dsv4 quantize --model DIR --out DIR

Converts a floating-point DeepSeek-V4 checkpoint (official or transformers layout) into the official
storage formats: FP8 e4m3 with E8M0 128x128 block scales for wq_a, wq_b, wkv, wo_a, wo_b, indexer.wq_b,
the shared experts and the MTP projections; packed FP4 e2m1 with E8M0 per-32 scales for routed experts.
Other tensors are copied unchanged; names are written in the official spelling.
)";

}  // namespace

int cmd_quantize(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  const Args args(argc, argv, 2, {"--model", "--out"}, {});
  const size_t n = quantize_checkpoint(args.get("--model"), args.get("--out"));
  std::fprintf(stderr, "wrote %zu tensors to %s\n", n, args.get("--out").c_str());
  return 0;
}

}  // namespace dsv4::cli
