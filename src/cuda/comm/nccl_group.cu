#include "cuda/comm/nccl_group.h"

#include <dlfcn.h>
#include <nccl.h>

#include <cstdlib>

#include "core/error.h"

namespace dsv4::cuda {

// The entry points this group uses, resolved from the shared library; the prototypes come from nccl.h.
struct NcclGroup::Api {
  void* library = nullptr;
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;

  Api() {
    library = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    DSV4_CHECK(library, "several GPUs need NCCL, and libnccl.so.2 was not found (", dlerror(),
               "): install it, or add its directory to LD_LIBRARY_PATH (PyTorch ships one in "
               "site-packages/nvidia/nccl/lib)");
    const auto symbol = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(library, name));
      DSV4_CHECK(fn, "libnccl.so.2 lacks ", name);
    };
    symbol(get_version, "ncclGetVersion");
    symbol(comm_init_all, "ncclCommInitAll");
    symbol(comm_destroy, "ncclCommDestroy");
    symbol(comm_abort, "ncclCommAbort");
    symbol(all_reduce, "ncclAllReduce");
    symbol(error_string, "ncclGetErrorString");
  }
  ~Api() {
    if (library) dlclose(library);
  }
  void check(ncclResult_t r, const char* what) const {
    DSV4_CHECK(r == ncclSuccess, "NCCL ", what, " failed: ", error_string(r));
  }
};

NcclGroup::NcclGroup(const std::vector<int>& devices, bool peer_exchange) : api_(std::make_unique<Api>()) {
  // NVLink SHARP (multicast) stays off: the GPU machines forbid it (docs/design/parallel.md).
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  // Every connection made here rather than at a collective's first use (NCCL ≥ 2.22 connects lazily), which a
  // CUDA graph capture cannot contain.
  setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
  api_->check(api_->get_version(&version_), "version");
  std::vector<ncclComm_t> comms(devices.size());
  api_->check(api_->comm_init_all(comms.data(), int(devices.size()), devices.data()), "communicator setup");
  comms_.assign(comms.begin(), comms.end());
  if (peer_exchange && devices.size() >= 2 && PeerExchange::possible(devices))
    peers_ = std::make_unique<PeerExchange>(devices);
}

NcclGroup::~NcclGroup() {
  for (void* c : comms_) {
    if (aborted_) continue;  // an aborted communicator is already freed
    api_->comm_destroy(static_cast<ncclComm_t>(c));
  }
}

void NcclGroup::check_alive() const {
  DSV4_CHECK(!aborted_, "another rank of this model failed; the model cannot run further");
}

void NcclGroup::all_reduce(int rank, float* x, size_t count, cudaStream_t stream) {
  check_alive();
  api_->check(api_->all_reduce(x, x, count, ncclFloat32, ncclSum, static_cast<ncclComm_t>(comms_[size_t(rank)]),
                               stream),
              "all-reduce");
}

void NcclGroup::abort() {
  if (aborted_.exchange(true)) return;
  if (peers_) peers_->abort();
  for (void* c : comms_) api_->comm_abort(static_cast<ncclComm_t>(c));
}

}  // namespace dsv4::cuda
