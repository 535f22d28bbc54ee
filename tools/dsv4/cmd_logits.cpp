// dsv4 logits: float32 logits of every prompt position (or the MTP module's draft logits) to a file.
#include <cstdio>
#include <fstream>
#include <vector>

#include "args.h"
#include "commands.h"
#include "core/error.h"
#include "engine/backend.h"
#include "loader/weight_map.h"
#include "model/deepseek_v4.h"

namespace dsv4::cli {

namespace {

constexpr const char* kHelp = R"(usage: dsv4 logits --model DIR --tokens 1,2,3 --out FILE [options]

Writes float32 little-endian logits [T x vocab], row-major, for every position of the prompt.

  --model DIR          checkpoint directory (config.json + safetensors)
  --tokens IDS         comma-separated prompt token ids
  --out FILE           output file
  --backend NAME       cpu (default)
  --numerics MODE      reference (default: official FP8/FP4 simulation) | exact
  --mtp                write the MTP draft logits [(T-1) x vocab] instead: row j from the main model's
                       final state at position j and the true token j+1
  --step N             tokens per forward step (default 64)
)";

}  // namespace

bool wants_help(int argc, char** argv) {
  for (int i = 2; i < argc; ++i)
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") return true;
  return false;
}

int cmd_logits(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  const Args args(argc, argv, 2, {"--model", "--tokens", "--out", "--backend", "--numerics", "--step"}, {"--mtp"});
  const std::vector<int32_t> tokens = args.get_ids("--tokens");
  const std::string out_path = args.get("--out");
  const bool mtp = args.has("--mtp");
  const int64_t T = int64_t(tokens.size());
  const int64_t step = args.get_int("--step", 64);
  DSV4_CHECK(step >= 1, "--step must be at least 1");
  const auto model = load_model(args.get("--model"));
  const ModelConfig& c = model->config;
  for (int32_t t : tokens)
    DSV4_CHECK(t < c.vocab_size, "--tokens: token id ", t, " is outside the vocabulary [0, ", c.vocab_size, ")");
  DSV4_CHECK(!mtp || T >= 2, "--mtp needs at least 2 tokens");
  const auto ops = make_backend(args.get("--backend", "cpu"), c);
  DeepseekV4 forward(*model, *ops, parse_numerics(args.get("--numerics", "reference")), T, std::min(step, T));
  DSV4_CHECK(!mtp || forward.has_mtp(), args.get("--model"), ": checkpoint has no MTP module (mtp.0.* tensors)");

  const int64_t V = c.vocab_size;
  std::vector<float> logits(size_t((mtp ? T - 1 : T) * V));
  std::vector<float> chunk(size_t(forward.max_step() * V));
  for (int64_t p = 0; p < T; p += forward.max_step()) {
    const int64_t n = std::min(forward.max_step(), T - p);
    if (!mtp) {
      forward.step(tokens.data() + p, n, logits.data() + p * V, /*all_rows=*/true);
      continue;
    }
    forward.step(tokens.data() + p, n, chunk.data(), /*all_rows=*/false);
    const int64_t rows = std::min(n, T - 1 - p);  // row j needs the true token j + 1
    if (rows > 0) forward.mtp_step(tokens.data() + p + 1, rows, logits.data() + p * V);
  }
  std::ofstream out(out_path, std::ios::binary);
  DSV4_CHECK(out.good(), out_path, ": cannot open for writing");
  out.write(reinterpret_cast<const char*>(logits.data()), std::streamsize(logits.size() * sizeof(float)));
  DSV4_CHECK(out.good(), out_path, ": write failed");
  return 0;
}

}  // namespace dsv4::cli
