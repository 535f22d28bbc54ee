#include "engine/backend.h"

#include <cstdio>

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

namespace {

// Bytes of a model's matrices as its checkpoint stores them, views counted at their own size.
double shard_bytes(const ModelWeights& m) {
  double bytes = 0;
  for (const Weight* w : m.matrices)
    if (w) bytes += stored_bytes(*w);
  return bytes;
}

std::string gib(double bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f GiB", bytes / double(1ull << 30));
  return s;
}

}  // namespace

Ranks make_ranks(const std::string& requested, const ModelWeights& model, const Parallelism& parallelism) {
  Ranks r;
  const int n = parallelism.ranks();
  if (n == 1) {
    r.backends.push_back(make_backend(requested, model));
    r.shards.push_back({&model, r.backends.back().get()});
    return r;
  }
  check_parallelism(model, parallelism);
  const std::string name = resolve_backend_name(requested);
  for (int k = 0; k < n; ++k) r.weights.push_back(shard_model(model, parallelism, k));
  if (name == "cpu") {
    auto group = std::make_shared<HostGroup>(n);
    for (int k = 0; k < n; ++k) r.backends.push_back(std::make_unique<CpuOps>(r.weights[size_t(k)]->config, group, k));
  } else if (name == "cuda") {
#if DSV4_HAVE_CUDA
    std::string why;
    const std::vector<CudaDevice> devices_found = cuda_devices(&why);
    const size_t gpus = devices_found.size();
    DSV4_CHECK(gpus >= size_t(n), parallelism_name(parallelism), " runs one rank per GPU and needs ", n, " GPUs; ",
               gpus, " usable", why.empty() ? "" : cat(" (", why, ")"));
    // Each shard's matrices must fit its GPU (with a tenth spare for the caches and workspaces): said before
    // any weight is read.
    for (int k = 0; k < n; ++k) {
      const double need = shard_bytes(*r.weights[size_t(k)]), have = double(devices_found[size_t(k)].memory_bytes);
      DSV4_CHECK(need * 1.1 <= have, parallelism_name(parallelism), ": rank ", k, "'s weights take ", gib(need),
                 " and GPU ", k, " (", devices_found[size_t(k)].name, ") has ", gib(have), "; use more GPUs");
    }
    std::vector<int> devices(static_cast<size_t>(n));
    for (int k = 0; k < n; ++k) devices[size_t(k)] = k;
    auto group = std::make_shared<cuda::NcclGroup>(devices);
    for (int k = 0; k < n; ++k) {
      auto ops = std::make_unique<CudaOps>(r.weights[size_t(k)]->config, k, group, k);
      ops->upload_model(*r.weights[size_t(k)]);
      r.backends.push_back(std::move(ops));
    }
    r.backends.front()->bind_thread();  // the caller's thread runs rank 0
#endif
  }
  DSV4_CHECK(int(r.backends.size()) == n, "unknown backend '", requested, "'");
  for (int k = 0; k < n; ++k) r.shards.push_back({r.weights[size_t(k)].get(), r.backends[size_t(k)].get()});
  return r;
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
