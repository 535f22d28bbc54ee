// dsv4 generate: prefill a prompt, then decode one token at a time.
#include <chrono>
#include <cstdio>
#include <vector>

#include "args.h"
#include "commands.h"
#include "core/error.h"
#include "engine/backend.h"
#include "loader/weight_map.h"
#include "model/deepseek_v4.h"
#include "sampler/sampler.h"

namespace dsv4::cli {

namespace {

constexpr const char* kHelp = R"(usage: dsv4 generate --model DIR --prompt-ids 1,2,3 [options]

Prefills the prompt, decodes incrementally and prints the new token ids, space-separated, as the last line.

  --model DIR          checkpoint directory (config.json + safetensors)
  --prompt-ids IDS     comma-separated prompt token ids
  --max-tokens N       new tokens to generate (default 32)
  --temperature T      0 = greedy (default), > 0 samples from softmax(logits / T)
  --top-k K            keep the K most likely tokens (0 = off)
  --top-p P            keep the smallest set of tokens with probability mass >= P (default 1)
  --min-p P            drop tokens less likely than P times the most likely one (default 0)
  --repetition-penalty R, --presence-penalty P, --frequency-penalty F
                       penalties on tokens already seen (R: prompt and output) / generated (P, F)
  --seed S             random seed for sampling (default 0)
  --ignore-eos         keep generating after the end-of-sequence token
  --print-ids          print the generated ids (the default output of this command)
  --backend NAME       cpu (default)
  --numerics MODE      reference (default) | exact
  --step N             prompt tokens per forward step (default 64)
)";

}  // namespace

int cmd_generate(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  const Args args(argc, argv, 2,
                  {"--model", "--prompt-ids", "--max-tokens", "--temperature", "--top-k", "--top-p", "--min-p",
                   "--repetition-penalty", "--presence-penalty", "--frequency-penalty", "--seed", "--backend",
                   "--numerics", "--step"},
                  {"--ignore-eos", "--print-ids"});
  const std::vector<int32_t> prompt = args.get_ids("--prompt-ids");
  const int64_t max_tokens = args.get_int("--max-tokens", 32);
  DSV4_CHECK(max_tokens >= 0, "--max-tokens must not be negative");
  SamplingParams sampling;
  sampling.temperature = float(args.get_double("--temperature", 0.0));
  sampling.top_k = args.get_int("--top-k", 0);
  sampling.top_p = float(args.get_double("--top-p", 1.0));
  sampling.min_p = float(args.get_double("--min-p", 0.0));
  sampling.repetition_penalty = float(args.get_double("--repetition-penalty", 1.0));
  sampling.presence_penalty = float(args.get_double("--presence-penalty", 0.0));
  sampling.frequency_penalty = float(args.get_double("--frequency-penalty", 0.0));
  sampling.seed = uint64_t(args.get_int("--seed", 0));
  validate(sampling);
  const int64_t step = args.get_int("--step", 64);
  DSV4_CHECK(step >= 1, "--step must be at least 1");
  const bool ignore_eos = args.has("--ignore-eos");

  const auto model = load_model(args.get("--model"));
  const ModelConfig& c = model->config;
  for (int32_t t : prompt)
    DSV4_CHECK(t < c.vocab_size, "--prompt-ids: token id ", t, " is outside the vocabulary [0, ", c.vocab_size, ")");
  const int64_t context = int64_t(prompt.size()) + max_tokens;
  DSV4_CHECK(c.max_position_embeddings == 0 || context <= c.max_position_embeddings, "prompt (", prompt.size(),
             " tokens) + --max-tokens ", max_tokens, " exceeds the model's context of ", c.max_position_embeddings);
  const auto ops = make_backend(args.get("--backend", "cpu"), c);
  DeepseekV4 forward(*model, *ops, parse_numerics(args.get("--numerics", "reference")), context,
                     std::min<int64_t>(step, int64_t(prompt.size())));
  Sampler sampler(sampling, c.vocab_size);

  const int64_t V = c.vocab_size;
  std::vector<float> logits(static_cast<size_t>(V));
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t p = 0; p < prompt.size(); p += size_t(forward.max_step())) {
    const int64_t n = std::min<int64_t>(forward.max_step(), int64_t(prompt.size() - p));
    forward.step(prompt.data() + p, n, logits.data(), /*all_rows=*/false);
  }
  const auto t1 = std::chrono::steady_clock::now();
  std::vector<int32_t> generated;
  while (int64_t(generated.size()) < max_tokens) {
    const int32_t next = sampler.sample(logits.data(), prompt, generated);
    generated.push_back(next);
    if (!ignore_eos && next == c.eos_token_id) break;
    if (int64_t(generated.size()) == max_tokens) break;
    forward.step(&next, 1, logits.data(), /*all_rows=*/false);
  }
  const auto t2 = std::chrono::steady_clock::now();
  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double decode_s = std::chrono::duration<double>(t2 - t1).count();
  std::fprintf(stderr, "prompt %zu tokens in %.3f s (%.1f tok/s); generated %zu tokens in %.3f s (%.2f tok/s)\n",
               prompt.size(), prefill_s, double(prompt.size()) / prefill_s, generated.size(), decode_s,
               generated.size() > 1 ? double(generated.size() - 1) / decode_s : 0.0);
  std::string line;
  for (size_t i = 0; i < generated.size(); ++i) {
    if (i) line += ' ';
    line += std::to_string(generated[i]);
  }
  std::printf("%s\n", line.c_str());
  return 0;
}

}  // namespace dsv4::cli
