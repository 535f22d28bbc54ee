// Choosing a backend and numerics mode by name (CLI, server, tests).
#pragma once

#include <memory>
#include <string>

#include "model/ops.h"

namespace dsv4 {

// "cpu", "cuda" (weights uploaded to GPU 0 here), or "auto": cuda when this build has it and a GPU is visible.
std::unique_ptr<Ops> make_backend(const std::string& name, const ModelWeights& model);
std::string resolve_backend_name(const std::string& name);  // "auto" → "cuda" | "cpu"
// "reference" | "exact" | "fast", or "auto": fast on the cuda backend (what DeepSeek's GPU code computes), the
// reference oracle on the cpu backend. `backend` is a resolved name (resolve_backend_name).
Numerics parse_numerics(const std::string& name, const std::string& backend);
const char* numerics_name(Numerics numerics);

}  // namespace dsv4
