// Choosing a backend and numerics mode by name (CLI, server, tests).
#pragma once

#include <memory>
#include <string>

#include "model/ops.h"

namespace dsv4 {

// "cpu", "cuda" (weights uploaded to GPU 0 here), or "auto": cuda when this build has it and a GPU is visible.
std::unique_ptr<Ops> make_backend(const std::string& name, const ModelWeights& model);
std::string resolve_backend_name(const std::string& name);  // "auto" → "cuda" | "cpu"
Numerics parse_numerics(const std::string& name);  // "reference" | "exact" | "fast"

}  // namespace dsv4
