#include "model_options.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "engine/backend.h"
#include "loader/checkpoint.h"
#include "loader/hf_config.h"
#include "loader/synth.h"
#include "loader/weight_map.h"

namespace dsv4::cli {

std::string model_dir(const Args& args) {
  DSV4_CHECK(!args.has("--synth"), "internal error: --synth has no model directory");
  if (args.has("--model")) return args.get("--model");
  const std::string shipped = DSV4_DEFAULT_MODEL;
  DSV4_CHECK(std::filesystem::exists(shipped + "/config.json"), "no --model given and the shipped model is missing at ",
             shipped);
  return shipped;
}

std::string tokenizer_dir(const Args& args) {
  if (args.has("--tokenizer")) return args.get("--tokenizer");
  DSV4_CHECK(!args.has("--synth"), "--synth makes weights only: give --tokenizer DIR (a directory holding "
             "tokenizer.json), or token ids where the command takes them");
  return model_dir(args);
}

void check_synth_only(const Args& args, std::initializer_list<const char*> extra) {
  std::vector<std::string> names = {"--layers", "--synth-seed"};
  for (const std::string& name : synth_override_options()) names.push_back("--" + name);
  names.insert(names.end(), extra.begin(), extra.end());
  for (const std::string& name : names)
    DSV4_CHECK(!args.has(name) || args.has("--synth"), name, " only applies with --synth PRESET");
}

SynthOptions synth_options(const Args& args) {
  DSV4_CHECK(!args.has("--model"), "give --model DIR or --synth PRESET, not both");
  SynthOptions s;
  s.preset = args.get("--synth");
  s.layers = args.get_int("--layers", 0);
  DSV4_CHECK(!args.has("--layers") || s.layers >= 1, "--layers must be at least 1");
  const int64_t seed = args.get_int("--synth-seed", 0);
  DSV4_CHECK(seed >= 0, "--synth-seed must not be negative");
  s.seed = uint64_t(seed);
  for (const std::string& name : synth_override_options())
    if (args.has("--" + name)) add_synth_override(name, args.get("--" + name), &s);
  synth_config_json(s);  // a bad preset or override fails here
  return s;
}

ModelConfig model_config(const Args& args) {
  if (args.has("--synth")) return parse_config_json(synth_config_json(synth_options(args)).dump(), "synth config");
  return load_config(model_dir(args));
}

Parallelism parallelism_option(const Args& args) {
  Parallelism p;
  p.tp = int(args.get_int("--tp", 1));
  p.ep = int(args.get_int("--ep", 1));
  DSV4_CHECK(p.tp >= 1 && p.tp <= 64 && p.ep >= 1 && p.ep <= 64, "--tp and --ep must be between 1 and 64");
  return p;
}

LoadedModel load(const Args& args, int64_t max_context) {
  LoadedModel m;
  check_synth_only(args);
  m.parallelism = parallelism_option(args);
  m.backend = resolve_backend_name(args.get("--backend", "auto"));
  if (args.has("--synth")) {
    const SynthOptions s = synth_options(args);
    m.dir = cat("synth ", s.preset, " (in memory)");
    m.weights = synth_model(s, m.backend == "cuda" ? SynthPlace::kDevice : SynthPlace::kHost);
  } else {
    m.dir = model_dir(args);
    m.weights = load_model(m.dir);
  }
  check_parallelism(*m.weights, m.parallelism);  // before the weights are read in
  // Large checkpoints: read them in once with a progress bar instead of stalling inside the first step.
  const Checkpoint& ckpt = *m.weights->storage;
  if (!args.has("--synth") && ckpt.total_bytes() > (size_t(1) << 30)) {
    const bool tty = isatty(fileno(stderr));
    ckpt.prefetch([&](size_t done, size_t total) {
      if (!tty) return;
      const int width = 40, filled = int(double(done) / double(total) * width);
      std::fprintf(stderr, "\rloading %s [%s%s] %5.1f / %.1f GiB", m.dir.c_str(), std::string(size_t(filled), '#').c_str(),
                   std::string(size_t(width - filled), ' ').c_str(), double(done) / (1 << 30), double(total) / (1 << 30));
      if (done == total) std::fprintf(stderr, "\n");
    });
  }
  const ModelConfig& c = m.weights->config;
  DSV4_CHECK(c.max_position_embeddings == 0 || max_context <= c.max_position_embeddings, "the sequence would reach ",
             max_context, " tokens (prompt + new tokens), which exceeds the model's context of ",
             c.max_position_embeddings);
  const int64_t step = args.get_int("--step", default_step(m.backend));
  DSV4_CHECK(step >= 1, "--step must be at least 1");
  m.numerics = parse_numerics(args.get("--numerics", "auto"), m.backend);
  m.ranks = make_ranks(m.backend, *m.weights, m.parallelism);
  m.forward = std::make_unique<DeepseekV4>(*m.weights, m.ranks.shards, m.numerics, max_context, std::min(step, max_context));
  return m;
}

}  // namespace dsv4::cli
