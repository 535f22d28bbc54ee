// dsv4 perplexity: exp(mean negative log-likelihood) of a text file under the model.
//
// Definition (tools/train_tiny/perplexity_hf.py computes the same with transformers): the file is tokenized
// without special tokens and cut into consecutive chunks of ctx − 1 tokens (a last chunk shorter than 2 is
// dropped); each chunk is evaluated as [BOS] + chunk from a fresh state, and every chunk token contributes
// −log p(token | preceding tokens including BOS).
#include <cmath>
#include <cstdio>
#include <vector>

#include "args.h"
#include "commands.h"
#include "core/error.h"
#include "engine/generator.h"
#include "model_options.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::cli {

namespace {

constexpr const char* kUsage = R"(usage: dsv4 perplexity -f FILE [--ctx N] [options]

  -f, --file FILE      text to score
  --ctx N              tokens per evaluation window including BOS (default 256)
)";

}  // namespace

int cmd_perplexity(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::printf("%s%s", kUsage, kModelOptionsHelp);
    return 0;
  }
  const Args args(argc, argv, 2,
                  Args::options({{"-f", "--file", "--ctx"}, model_options()}),
                  {});
  const std::string file = args.has("-f") ? args.get("-f") : args.get("--file");
  const int64_t ctx = args.get_int("--ctx", 256);
  DSV4_CHECK(ctx >= 3, "--ctx must be at least 3");
  const Tokenizer tokenizer = Tokenizer::from_file(model_dir(args));
  std::FILE* f = std::fopen(file.c_str(), "rb");
  DSV4_CHECK(f != nullptr, file, ": cannot open");
  std::string text;
  char buf[1 << 16];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  std::fclose(f);
  const std::vector<int32_t> ids = tokenizer.encode(text);
  DSV4_CHECK(tokenizer.bos_id().has_value(), "the tokenizer has no BOS token");

  LoadedModel m = load(args, ctx);
  const int64_t V = m.weights->config.vocab_size;
  std::vector<float> logits(size_t(ctx * V));
  double nll = 0.0;
  int64_t predicted = 0;
  for (size_t start = 0; start < ids.size(); start += size_t(ctx - 1)) {
    const size_t len = std::min(ids.size() - start, size_t(ctx - 1));
    if (len < 2) break;
    std::vector<int32_t> window = {*tokenizer.bos_id()};
    window.insert(window.end(), ids.begin() + long(start), ids.begin() + long(start + len));
    m.forward->reset();
    prefill(*m.forward, window.data(), int64_t(window.size()), logits.data(), /*all_rows=*/true);
    for (size_t j = 0; j + 1 < window.size(); ++j) {  // row j predicts window[j + 1]
      const float* row = logits.data() + j * V;
      double mx = row[0], sum = 0.0;
      for (int64_t i = 1; i < V; ++i) mx = std::max(mx, double(row[i]));
      for (int64_t i = 0; i < V; ++i) sum += std::exp(double(row[i]) - mx);
      nll += mx + std::log(sum) - double(row[window[j + 1]]);
      ++predicted;
    }
  }
  DSV4_CHECK(predicted > 0, file, ": too short to score");
  std::printf("perplexity %.4f over %lld tokens (mean NLL %.6f nats, ctx %lld)\n", std::exp(nll / double(predicted)),
              (long long)predicted, nll / double(predicted), (long long)ctx);
  return 0;
}

}  // namespace dsv4::cli
