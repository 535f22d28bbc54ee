// Options shared by the commands that run a model: --model (default: the shipped tiny model), --backend,
// --numerics, --step; and the loading of model + backend + forward pass from them.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>

#include "args.h"
#include "engine/backend.h"
#include "loader/synth.h"
#include "model/deepseek_v4.h"
#include "model/parallel.h"
#include "model/weights.h"

namespace dsv4::cli {

constexpr const char* kModelOptionsHelp =
    R"(  --model DIR          checkpoint directory (config.json + safetensors [+ tokenizer.json]);
                       default: the tiny model shipped in models/tiny
  --synth PRESET       instead of --model: random weights of v4-flash / v4-pro shapes in the official formats,
                       made in memory (on cuda, each GPU makes its shard in place: no file, 0.15 GiB of host
                       memory for V4-Flash); --layers N keeps the first N layers; --experts N, --vocab N,
                       --dim N, --inter N, --set F=V,... shrink it as for dsv4 synth; --synth-seed N (default 0)
  --tokenizer DIR      the directory whose tokenizer.json to use (default: the model's)
  --backend NAME       auto (default: cuda when a GPU is visible, else cpu) | cpu | cuda
  --numerics MODE      auto (default: fast on cuda, reference on cpu) | fast (DeepSeek's GPU numerics: bf16
                       activations, FP8 act-quant GEMMs) | reference (the fp32 oracle with the official FP8/FP4
                       simulation points) | exact (no simulation)
  --step N             prompt tokens per forward step (default 2048 on cuda, 64 on cpu)
  --tp N               tensor parallel over N ranks: attention heads and expert dimensions split (default 1)
  --ep N               expert parallel over N ranks: whole experts split (default 1); with --tp N, attention
                       by heads and experts whole. On cuda, rank r runs on GPU r; on cpu, ranks are threads.
)";

inline std::set<std::string> model_options() {
  return {"--model", "--synth", "--layers", "--synth-seed", "--experts", "--vocab", "--dim", "--inter", "--set",
          "--tokenizer", "--backend", "--numerics", "--step", "--tp", "--ep"};
}

// --tp and --ep (kModelOptionsHelp).
Parallelism parallelism_option(const Args& args);

// --step's default on a resolved backend ("cuda" or "cpu"), for the model commands and bench alike: on cuda a
// step of 2048 tokens prefills a long prompt ~7x faster than steps of 64 (docs/PERFORMANCE.md, "Prefill by step
// size"). Memory grows with it: the step's activations (~0.7 MB a token on V4-Flash; the logits rows stay at
// kLogitRows) and every sequence's sliding-window ring (step slots a layer: ~51 MiB a sequence at V4-Flash's
// depth).
inline int64_t default_step(const std::string& backend) { return backend == "cuda" ? 2048 : 64; }

struct LoadedModel {
  std::string dir;  // or "synth PRESET (in memory)"
  std::string backend;  // resolved: "cpu" | "cuda"
  Numerics numerics = Numerics::kReference;
  Parallelism parallelism;
  std::unique_ptr<const ModelWeights> weights;
  Ranks ranks;  // each rank's shard and backend
  std::unique_ptr<DeepseekV4> forward;
};

std::string model_dir(const Args& args);
// Throws when an option that shapes --synth (or one of `extra`, the command's own) is given without it.
void check_synth_only(const Args& args, std::initializer_list<const char*> extra = {});
// --synth PRESET and the options that shape it (kModelOptionsHelp); a bad preset or override fails here.
SynthOptions synth_options(const Args& args);
// The model's config.json, or --synth's, without loading weights.
ModelConfig model_config(const Args& args);
// Where tokenizer.json is: --tokenizer, else the model directory (a clear error with --synth, which has none).
std::string tokenizer_dir(const Args& args);
// max_context: tokens the sequence may reach (checked against the model's max_position_embeddings).
LoadedModel load(const Args& args, int64_t max_context);

}  // namespace dsv4::cli
