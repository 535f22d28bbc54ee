// End-to-end benchmark of one model on one backend (dsv4 bench, in the spirit of llama-bench): prefill
// throughput, batched decode latency and throughput at given context depths, memory, and for every decode row
// the HBM floor — the bytes that must cross memory for that step over the measured copy bandwidth.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/ops.h"
#include "model/parallel.h"
#include "model/weights.h"

namespace dsv4 {

struct BenchOptions {
  std::string model_dir;  // the checkpoint, or what `load` makes (a name for the report)
  // Makes the model instead of loading model_dir (e.g. a synthesised one: loader/synth.h); timed as the load.
  std::function<std::unique_ptr<const ModelWeights>()> load;
  std::string backend = "auto";
  Numerics numerics = Numerics::kReference;
  Parallelism parallelism;  // ranks (model/parallel.h): GPU r runs rank r
  std::vector<int64_t> prefill = {512, 4096};        // prompt lengths
  std::vector<int64_t> contexts = {0, 4096, 32768};  // tokens already in every sequence when decoding starts
  std::vector<int64_t> batches = {1, 8, 64};         // sequences decoded together, one token each per step
  int64_t reps = 3;
  int64_t decode_steps = 16;  // timed steps per decode repetition
  int64_t step = 512;         // prefill tokens per forward step (dsv4 bench: the model commands' default_step)
  // Decode output: every sequence's logits downloaded (as a host sampler needs them), or, by default, its greedy
  // next token chosen on the backend with only the ids downloaded (as `dsv4 generate --temperature 0` runs).
  bool download_logits = false;
  float temperature = 0.0f;  // > 0: every sequence's next token is drawn at this temperature on the backend
  uint64_t seed = 0;
  std::function<void(const std::string&)> log;  // progress lines (may be empty)
};

// How decode steps end, in words: "the greedy next tokens chosen on the backend (ids downloaded)", ...
std::string decode_output(const BenchOptions& o);

struct Stat {  // over repetitions; sd is the sample standard deviation (0 for one repetition)
  double mean = 0, sd = 0, min = 0, max = 0;
};
Stat stat_of(const std::vector<double>& samples);

struct PrefillRow {
  int64_t tokens = 0;
  Stat ms;
  Stat tokens_per_s;
};

// Bytes one decode step must move through memory, and the time that takes at the measured bandwidth.
struct DecodeFloor {
  double weight_bytes = 0;  // dense weights + the routed experts the batch is expected to select
  double cache_bytes = 0;   // window rings, compressed entries attended, indexer keys scored
  double experts_per_layer = 0;
  double seconds = 0;
};

struct DecodeRow {
  int64_t context = 0, batch = 0;
  Stat ms_per_step;   // = per-token latency of each sequence
  Stat tokens_per_s;  // batch / step time
  DecodeFloor floor;
  double achieved = 0;  // floor time / measured step time
};

struct BenchReport {
  std::string model_dir, backend, device, numerics;
  int64_t layers = 0, dim = 0, experts = 0, experts_per_tok = 0, vocab = 0;
  double weight_bytes = 0;  // every matrix as the backend holds it
  double load_seconds = 0;
  int64_t step_tokens = 0;  // the model's step capacity: prefill chunk size
  double bandwidth = 0;  // bytes/s, read + written
  std::string bandwidth_method;
  std::string memory_kind;  // "GPU" (in use on the device) or "RSS" (this process)
  double memory_before_load = 0, memory_after_load = 0, memory_peak = 0;
  BenchOptions options;
  std::vector<PrefillRow> prefill;
  std::vector<DecodeRow> decode;
  nlohmann::json synth;  // set by the caller when the model was synthesised for the run
};

// Expected number of distinct experts when b tokens each pick k of E uniformly at random: E·(1 − (1 − k/E)^b).
double expected_distinct_experts(int64_t experts, int64_t k, int64_t batch);

// The floor of one decode step: `batch` sequences whose new token sits at position `position` (fractional:
// the mean over the timed steps). weight_bytes(w) is the size of a matrix as the backend stores it;
// compact_cache: the caches are in the compact FP8 / FP4 formats (CUDA, reference and fast numerics).
DecodeFloor decode_floor(const ModelWeights& model, const std::function<double(const Weight&)>& weight_bytes,
                         int64_t batch, double position, double bandwidth, bool compact_cache);

BenchReport run_bench(const BenchOptions& options);

std::string bench_markdown(const BenchReport& report);
nlohmann::json bench_json(const BenchReport& report);

}  // namespace dsv4
