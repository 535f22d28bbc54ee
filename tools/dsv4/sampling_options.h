// Sampling options shared by generate and chat.
#pragma once

#include "args.h"
#include "sampler/sampler.h"

namespace dsv4::cli {

constexpr const char* kSamplingHelp =
    R"(  --temperature T      0 = greedy; > 0 samples from softmax(logits / T)
  --top-k K            keep the K most likely tokens (0 = off)
  --top-p P            keep the smallest set of tokens with probability mass >= P (default 1)
  --min-p P            drop tokens less likely than P times the most likely one (default 0)
  --repetition-penalty R, --presence-penalty P, --frequency-penalty F
                       penalties on tokens already seen (R: prompt and output) / generated (P, F)
  --seed S             random seed for sampling (default 0)
)";

inline std::set<std::string> sampling_options() {
  return {"--temperature",      "--top-k",           "--top-p",           "--min-p",
          "--repetition-penalty", "--presence-penalty", "--frequency-penalty", "--seed"};
}

inline SamplingParams sampling_params(const Args& args, float default_temperature) {
  SamplingParams s;
  s.temperature = float(args.get_double("--temperature", default_temperature));
  s.top_k = args.get_int("--top-k", 0);
  s.top_p = float(args.get_double("--top-p", 1.0));
  s.min_p = float(args.get_double("--min-p", 0.0));
  s.repetition_penalty = float(args.get_double("--repetition-penalty", 1.0));
  s.presence_penalty = float(args.get_double("--presence-penalty", 0.0));
  s.frequency_penalty = float(args.get_double("--frequency-penalty", 0.0));
  s.seed = uint64_t(args.get_int("--seed", 0));
  validate(s);
  return s;
}

}  // namespace dsv4::cli
