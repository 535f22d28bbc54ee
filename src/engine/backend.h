// Choosing a backend and numerics mode by name (CLI, server, tests).
#pragma once

#include <memory>
#include <string>

#include "model/ops.h"

namespace dsv4 {

std::unique_ptr<Ops> make_backend(const std::string& name, const ModelConfig& config);  // "cpu"
Numerics parse_numerics(const std::string& name);  // "reference" | "exact"

}  // namespace dsv4
