// dsv4 logits: float32 logits of every prompt position (or the MTP module's draft logits) to a file.
#include <cstdio>
#include <fstream>
#include <vector>

#include "args.h"
#include "commands.h"
#include "core/error.h"
#include "engine/generator.h"
#include "model_options.h"

namespace dsv4::cli {

namespace {

constexpr const char* kHelp = R"(usage: dsv4 logits --model DIR --tokens 1,2,3 --out FILE [options]

Writes float32 little-endian logits [T x vocab], row-major, for every position of the prompt.

  --tokens IDS         comma-separated prompt token ids
  --out FILE           output file
  --mtp                write the MTP draft logits [(T-1) x vocab] instead: row j from the main model's
                       final state at position j and the true token j+1
)";

}  // namespace

int cmd_logits(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::printf("%s%s", kHelp, kModelOptionsHelp);
    return 0;
  }
  const Args args(argc, argv, 2, Args::options({{"--tokens", "--out"}, model_options()}), {"--mtp"});
  const std::vector<int32_t> tokens = args.get_ids("--tokens");
  const std::string out_path = args.get("--out");
  const bool mtp = args.has("--mtp");
  const int64_t T = int64_t(tokens.size());
  DSV4_CHECK(!mtp || T >= 2, "--mtp needs at least 2 tokens");
  LoadedModel m = load(args, T);
  DeepseekV4& forward = *m.forward;
  DSV4_CHECK(!mtp || forward.has_mtp(), m.dir, ": checkpoint has no MTP module (mtp.0.* tensors)");

  const int64_t V = m.weights->config.vocab_size;
  std::vector<float> logits(size_t((mtp ? T - 1 : T) * V));
  if (!mtp) {
    prefill(forward, tokens.data(), T, logits.data(), /*all_rows=*/true);
  } else {
    std::vector<float> last(static_cast<size_t>(V));
    for (int64_t p = 0; p < T; p += forward.max_step()) {
      const int64_t n = std::min(forward.max_step(), T - p);
      forward.step(tokens.data() + p, n, last.data(), /*all_rows=*/false);
      const int64_t rows = std::min(n, T - 1 - p);  // row j needs the true token j + 1
      if (rows > 0) forward.mtp_step(tokens.data() + p + 1, rows, logits.data() + p * V);
    }
  }
  std::ofstream out(out_path, std::ios::binary);
  DSV4_CHECK(out.good(), out_path, ": cannot open for writing");
  out.write(reinterpret_cast<const char*>(logits.data()), std::streamsize(logits.size() * sizeof(float)));
  DSV4_CHECK(out.good(), out_path, ": write failed");
  return 0;
}

}  // namespace dsv4::cli
