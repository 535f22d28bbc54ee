// Builds ModelWeights from a checkpoint directory: resolves official names, checks every tensor's dtype and
// shape against config.json, and wraps matrices as in-place views (no copies of the large tensors).
#pragma once

#include <memory>
#include <string>

#include "model/weights.h"

namespace dsv4 {

std::unique_ptr<const ModelWeights> load_model(const std::string& model_dir);

}  // namespace dsv4
