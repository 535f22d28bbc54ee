// dsv4 perplexity: exp(mean negative log-likelihood) of a text file under the model; with --save-logits, the
// log-probabilities behind it to a file, and with --kl-divergence, this run against such a file (made under
// other numerics, another backend or other weights): KL divergence, top-1 agreement and Δperplexity.
//
// Definition (tools/train_tiny/perplexity_hf.py computes the same with transformers): the file is tokenized
// without special tokens and cut into consecutive windows of ctx − 1 tokens (a last window shorter than 2 is
// dropped); each window is evaluated as [BOS] + window from a fresh state, and every window token contributes
// −log p(token | preceding tokens including BOS), p from the row's ln softmax rounded to float (kl_divergence.h).
#include <cmath>
#include <cstdio>
#include <optional>
#include <vector>

#include "args.h"
#include "commands.h"
#include "core/error.h"
#include "engine/backend.h"
#include "engine/generator.h"
#include "kl_divergence.h"
#include "model_options.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::cli {

namespace {

constexpr const char* kUsage = R"(usage: dsv4 perplexity -f FILE [--ctx N] [--chunks N] [options]
       dsv4 perplexity -f FILE --save-logits BASE [--logits-format f32|u16] [options]
       dsv4 perplexity -f FILE --kl-divergence BASE [options]

Every token of the text is scored: windows of ctx − 1 tokens, each after BOS from a fresh state.

  -f, --file FILE        text to score
  --ctx N                tokens per evaluation window including BOS (default 256; with --kl-divergence: BASE's)
  --chunks N             score only the first N windows (default: all; with --kl-divergence: BASE's)
  --save-logits BASE     also write the ln softmax of every scored position, with the scored token ids and the
                         backend and numerics of the run, to BASE. Per scored token, f32: 4·V + 8 bytes (16 KiB
                         at vocab 4096: 299 MiB for models/tiny/heldout.txt; 505 KiB at V4's 129280)
  --logits-format F      f32 (default): exact, the same numerics compare at KL 0 | u16: half the size (2·V + 16
                         bytes: 16-bit codes over each row's range, at most its top 32 nats, p 0 below), which
                         adds up to 1e-8 to a KL divergence (2e-9 on models/tiny); top-1 and the base
                         perplexity stay exact
  --kl-divergence BASE   score the same text and compare with BASE: KL(base ‖ this run) per position (mean ±
                         standard error, max, percentiles, median), both perplexities, their ratio and
                         difference, Δp of the true token, and how often the top token agrees ("Same top p"),
                         as llama.cpp's perplexity --kl-divergence reports them. The text must tokenize to
                         the ids BASE was scored on.
)";

struct Window {
  size_t start, len;  // ids[start, start + len), scored after BOS
};

std::vector<Window> plan_windows(size_t n_ids, int64_t ctx, int64_t max_windows) {
  std::vector<Window> windows;
  for (size_t start = 0; start < n_ids && (max_windows <= 0 || int64_t(windows.size()) < max_windows);
       start += size_t(ctx - 1)) {
    const size_t len = std::min(n_ids - start, size_t(ctx - 1));
    if (len < 2) break;
    windows.push_back({start, len});
  }
  return windows;
}

// --ctx / --chunks under --kl-divergence: BASE's value, and an explicit one must agree with it.
int64_t from_base(const Args& args, const std::string& flag, int64_t saved, const std::string& base) {
  if (!args.has(flag)) return saved;
  const int64_t v = args.get_int(flag, saved);
  DSV4_CHECK(v == saved, base, ": saved with ", flag, " ", saved, ", this run asks for ", v);
  return v;
}

void check_same_tokens(const LogitsReader& base, const std::vector<int32_t>& ids, size_t scored, int32_t bos) {
  const LogitsFileInfo& b = base.info();
  DSV4_CHECK(b.bos == bos, base.path(), ": saved with BOS id ", b.bos, ", this tokenizer's is ", bos);
  for (size_t i = 0; i < std::min(scored, b.ids.size()); ++i)
    DSV4_CHECK(b.ids[i] == ids[i], base.path(), ": token ", i, " is ", b.ids[i], " there and ", ids[i],
               " in this run: the text (or tokenizer) differs from the one it was saved with");
  DSV4_CHECK(b.ids.size() == scored, base.path(), ": saved over ", b.ids.size(), " tokens, this run scores ", scored,
             ": the text differs from the one it was saved with");
}

}  // namespace

int cmd_perplexity(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::printf("%s%s", kUsage, kModelOptionsHelp);
    return 0;
  }
  const Args args(
      argc, argv, 2,
      Args::options({{"-f", "--file", "--ctx", "--chunks", "--save-logits", "--logits-format", "--kl-divergence"},
                     model_options()}),
      {});
  const std::string file = args.has("-f") ? args.get("-f") : args.get("--file");
  DSV4_CHECK(!(args.has("--save-logits") && args.has("--kl-divergence")),
             "--save-logits and --kl-divergence: choose one (save the base run, then compare another with it)");
  DSV4_CHECK(!args.has("--logits-format") || args.has("--save-logits"), "--logits-format needs --save-logits");
  const RowEncoding encoding = parse_row_encoding(args.get("--logits-format", "f32"));
  std::optional<LogitsReader> base;
  if (args.has("--kl-divergence")) base.emplace(args.get("--kl-divergence"));
  const int64_t ctx = base ? from_base(args, "--ctx", base->info().ctx, base->path()) : args.get_int("--ctx", 256);
  const int64_t max_windows =
      base ? from_base(args, "--chunks", base->info().windows, base->path()) : args.get_int("--chunks", 0);
  DSV4_CHECK(ctx >= 3, "--ctx must be at least 3");
  DSV4_CHECK(max_windows >= 0, "--chunks must not be negative");

  const Tokenizer tokenizer = Tokenizer::from_file(tokenizer_dir(args));
  std::FILE* f = std::fopen(file.c_str(), "rb");
  DSV4_CHECK(f != nullptr, file, ": cannot open");
  std::string text;
  char buf[1 << 16];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  std::fclose(f);
  const std::vector<int32_t> ids = tokenizer.encode(text);
  DSV4_CHECK(tokenizer.bos_id().has_value(), "the tokenizer has no BOS token");
  const int32_t bos = *tokenizer.bos_id();
  const std::vector<Window> windows = plan_windows(ids.size(), ctx, max_windows);
  DSV4_CHECK(!windows.empty(), file, ": too short to score");
  const size_t scored = windows.back().start + windows.back().len;
  if (base) check_same_tokens(*base, ids, scored, bos);

  LoadedModel m = load(args, ctx);
  const int64_t V = m.weights->config.vocab_size;
  if (base)
    DSV4_CHECK(base->info().vocab == V, base->path(), ": saved with vocab ", base->info().vocab, ", the model at ",
               m.dir, " has ", V);
  const std::string backend = m.backend, numerics = numerics_name(m.numerics);
  std::optional<LogitsWriter> saved;
  if (args.has("--save-logits"))
    saved.emplace(args.get("--save-logits"),
                  LogitsFileInfo{encoding, V, ctx, int64_t(windows.size()), bos, backend, numerics,
                                 std::vector<int32_t>(ids.begin(), ids.begin() + long(scored))});

  std::vector<float> logits(static_cast<size_t>(ctx * V)), lp(static_cast<size_t>(V));
  std::vector<float> base_lp(base ? static_cast<size_t>(V) : 0);
  KlStats stats;
  double nll = 0.0;
  int64_t predicted = 0;
  for (const Window& w : windows) {
    std::vector<int32_t> window = {bos};
    window.insert(window.end(), ids.begin() + long(w.start), ids.begin() + long(w.start + w.len));
    m.forward->reset();
    prefill(*m.forward, window.data(), int64_t(window.size()), logits.data(), /*all_rows=*/true);
    for (size_t j = 0; j + 1 < window.size(); ++j) {  // row j predicts window[j + 1]
      const int32_t target = window[j + 1];
      log_softmax(logits.data() + j * V, V, lp.data());
      nll -= double(lp[size_t(target)]);
      ++predicted;
      if (saved) saved->write_row(lp.data(), target);
      if (base) {
        const BaseRow row = base->read_row(base_lp.data());
        stats.add(base_lp.data(), row, lp.data(), target, V);
      }
    }
  }
  std::printf("perplexity %.4f over %lld tokens (mean NLL %.6f nats, ctx %lld)\n", std::exp(nll / double(predicted)),
              (long long)predicted, nll / double(predicted), (long long)ctx);
  if (saved) {
    saved->finish();
    std::fprintf(stderr, "saved the log-probs of %lld positions (%s rows, %s / %s) to %s: %.1f MiB\n",
                 (long long)predicted, row_encoding_name(encoding), backend.c_str(), numerics.c_str(),
                 args.get("--save-logits").c_str(), double(saved->bytes()) / (1 << 20));
  }
  if (base) {
    const LogitsFileInfo& b = base->info();
    std::printf("\nKL divergence over %lld positions: Q = this run (%s / %s), base = %s (%s / %s, %s rows)\n",
                (long long)stats.count(), backend.c_str(), numerics.c_str(), base->path().c_str(), b.backend.c_str(),
                b.numerics.c_str(), row_encoding_name(b.encoding));
    stats.print(stdout);
  }
  return 0;
}

}  // namespace dsv4::cli
