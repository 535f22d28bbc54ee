// Builds ModelWeights from a checkpoint directory: resolves official names, checks every tensor's dtype and
// shape against config.json, and wraps matrices as in-place views (no copies of the large tensors).
#pragma once

#include <memory>
#include <string>

#include "loader/checkpoint.h"
#include "model/weights.h"

namespace dsv4 {

std::unique_ptr<const ModelWeights> load_model(const std::string& model_dir);
// The same over an open checkpoint (e.g. one held in memory: loader/synth.h) and its parsed config.
std::unique_ptr<const ModelWeights> load_model(std::shared_ptr<const Checkpoint> checkpoint, ModelConfig config);

}  // namespace dsv4
