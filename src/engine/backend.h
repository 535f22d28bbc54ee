// Choosing a backend and numerics mode by name (CLI, server, tests).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/ops.h"
#include "model/parallel.h"

namespace dsv4 {

// "cpu", "cuda" (weights uploaded to GPU 0 here), or "auto": cuda when this build has it and a GPU is visible.
std::unique_ptr<Ops> make_backend(const std::string& name, const ModelWeights& model);
std::string resolve_backend_name(const std::string& name);  // "auto" → "cuda" | "cpu"

// The model on its ranks (model/parallel.h): each rank's shard of the weights and the backend that runs it —
// in-process CPU ranks summing over host memory, or one GPU per rank (GPU r) joined by NCCL.
struct Ranks {
  std::vector<Shard> shards;  // what DeepseekV4 takes; shards[0].model is `model` itself when one rank
  std::vector<std::unique_ptr<ModelWeights>> weights;  // the shards' weights when several ranks
  std::vector<std::unique_ptr<Ops>> backends;
  Ops& ops() const { return *backends.front(); }  // rank 0's
};
// Checks the split (check_parallelism) and that enough devices exist before any weight is read.
Ranks make_ranks(const std::string& backend, const ModelWeights& model, const Parallelism& parallelism);
// "reference" | "exact" | "fast", or "auto": fast on the cuda backend (what DeepSeek's GPU code computes), the
// reference oracle on the cpu backend. `backend` is a resolved name (resolve_backend_name).
Numerics parse_numerics(const std::string& name, const std::string& backend);
const char* numerics_name(Numerics numerics);

}  // namespace dsv4
