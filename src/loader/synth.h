// Random checkpoints with the exact shapes and official storage formats of DeepSeek-V4-Flash / -Pro (spec §2,
// §12): real-size benchmarks and tests without the real weights. FP8 e4m3 + E8M0 128×128 block scales and
// packed FP4 e2m1 + E8M0 per-32 scales where official_format() (loader/quantize.h) says so, BF16 / F32 / I64
// elsewhere, official names, sharded like the official release (one shard per layer + an index).
//
// Values are drawn like an initialised model (std ≈ 1/sqrt(fan_in) in real units, norm gains ≈ 1, small hc
// mixing logits, small router bias and sinks, tid2eid rows of distinct experts), so a forward pass yields finite
// logits and varied routing. Generation is counter-based (each 8-byte word is a pure function of seed, tensor
// name and word index), multithreaded, written straight into the memory-mapped shards: the output does not
// depend on the thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace dsv4 {

struct SynthOptions {
  std::string preset;   // "v4-flash" | "v4-pro"
  int64_t layers = 0;   // main layers: the first `layers` of the preset's schedule; 0 = all of them
  bool mtp = true;      // write the MTP module (mtp.0.*)
  uint64_t seed = 0;
  // config.json fields to override (numeric fields of the preset only), e.g. {"n_routed_experts", 8}: small
  // models with the same layout for tests.
  std::map<std::string, double> overrides;
  bool force = false;   // overwrite a directory that already holds a checkpoint
  bool dry_run = false;  // plan only: count tensors and bytes, write nothing
};

struct SynthResult {
  ModelConfig config;
  size_t tensors = 0;
  size_t bytes = 0;       // of all shards (synth_model: of all tensors)
  size_t host_bytes = 0;  // synth_model: of the tensors made on the host
  double seconds = 0;     // generating and writing the shards (synth_model: making the host tensors)
};

std::vector<std::string> synth_presets();

// The options that shrink a preset for tests, by CLI name without dashes: "set" ("F=V,F=V", any numeric
// config.json field) and the short names "experts" (n_routed_experts), "vocab" (vocab_size), "dim"
// (hidden_size), "inter" (moe_intermediate_size).
const std::vector<std::string>& synth_override_options();
// Adds the override given as option `name` with its text value; throws naming the option and the bad value.
void add_synth_override(const std::string& name, const std::string& value, SynthOptions* options);

// config.json (official spelling) for the options, validated by the config parser. Throws a clear Error for an
// unknown preset, a bad layer count or an override the formats cannot hold.
nlohmann::json synth_config_json(const SynthOptions& options);

// Writes config.json, generation_config.json, the shards and model.safetensors.index.json into out_dir
// (with dry_run: touches nothing, out_dir may be empty).
// progress(done_bytes, total_bytes) is called from the writing thread as shards complete.
SynthResult synth_checkpoint(const SynthOptions& options, const std::string& out_dir,
                             const std::function<void(size_t, size_t)>& progress = {});

// Where synth_model makes the tensors: all on the host (for the CPU backend), or on the host only the small
// ones, each matrix's elements and the FP4 scales left as GeneratedTensors (loader/synth_fill.h) that the CUDA
// backend makes in GPU memory at upload — only the rank's slice — so a full-size model needs neither a file nor
// its size in host memory (V4-Flash: 0.15 GiB on the host of 148.6 GiB).
enum class SynthPlace { kHost, kDevice };

// The checkpoint synth_checkpoint would write, byte for byte, held in memory and loaded (loader/weight_map.h).
// `result` (optional): its size and the seconds spent making the host tensors.
std::unique_ptr<const ModelWeights> synth_model(const SynthOptions& options, SynthPlace place,
                                                SynthResult* result = nullptr);

}  // namespace dsv4
