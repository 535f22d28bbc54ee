#include "engine/backend.h"

#include "core/error.h"
#include "cpu/cpu_ops.h"

namespace dsv4 {

std::unique_ptr<Ops> make_backend(const std::string& name, const ModelConfig& config) {
  if (name == "cpu") return std::make_unique<CpuOps>(config);
  fail(cat("unknown backend '", name, "' (available: cpu)"));
}

Numerics parse_numerics(const std::string& name) {
  if (name == "reference") return Numerics::kReference;
  if (name == "exact") return Numerics::kExact;
  fail(cat("unknown numerics mode '", name, "' (expected reference or exact)"));
}

}  // namespace dsv4
