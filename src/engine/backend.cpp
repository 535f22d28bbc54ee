#include "engine/backend.h"

#include "core/error.h"
#include "cpu/cpu_ops.h"
#include "cuda/device.h"
#if DSV4_HAVE_CUDA
#include "cuda/cuda_ops.h"
#endif

namespace dsv4 {

std::string resolve_backend_name(const std::string& name) {
  if (name != "auto") return name;
  std::string why;
  return cuda_compiled() && !cuda_devices(&why).empty() ? "cuda" : "cpu";
}

std::unique_ptr<Ops> make_backend(const std::string& requested, const ModelWeights& model) {
  const std::string name = resolve_backend_name(requested);
  if (name == "cpu") return std::make_unique<CpuOps>(model.config);
  if (name == "cuda") {
    std::string why;
    DSV4_CHECK(!cuda_devices(&why).empty(), "--backend cuda: no usable GPU (", why, ")");
#if DSV4_HAVE_CUDA
    auto ops = std::make_unique<CudaOps>(model.config);
    ops->upload_model(model);
    return ops;
#endif
  }
  fail(cat("unknown backend '", requested, "' (available: auto, cpu", cuda_compiled() ? ", cuda" : "", ")"));
}

Numerics parse_numerics(const std::string& name, const std::string& backend) {
  if (name == "auto") return backend == "cuda" ? Numerics::kFast : Numerics::kReference;
  if (name == "reference") return Numerics::kReference;
  if (name == "exact") return Numerics::kExact;
  if (name == "fast") return Numerics::kFast;
  fail(cat("unknown numerics mode '", name, "' (expected auto, reference, exact or fast)"));
}

const char* numerics_name(Numerics numerics) {
  switch (numerics) {
    case Numerics::kReference: return "reference";
    case Numerics::kExact: return "exact";
    case Numerics::kFast: return "fast";
  }
  return "?";
}

}  // namespace dsv4
