// The collectives of GPU ranks (model/parallel.h): one NCCL communicator per GPU of this process. NCCL is
// loaded when a group is made (dlopen of libnccl.so.2), so a binary without it still runs on one GPU; where it
// is missing the error says how to point to it (PyTorch ships one: site-packages/nvidia/nccl/lib).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <vector>

#include "cuda/comm/peer_exchange.h"

namespace dsv4::cuda {

class NcclGroup {
 public:
  // One rank per device, rank r on devices[r]. Sets NCCL_NVLS_ENABLE=0 unless it is set: NVLink multicast is
  // kept off (docs/design/parallel.md). With `peer_exchange`, and where every pair of GPUs reaches the other's
  // memory, the group also holds a PeerExchange for the decode rows' all-reduce inside its consumer.
  explicit NcclGroup(const std::vector<int>& devices, bool peer_exchange = true);
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int ranks() const { return int(comms_.size()); }
  int version() const { return version_; }  // NCCL_VERSION_CODE of the library loaded

  // Enqueues x [count] ← Σ over the ranks' x on `stream` (in place; capturable in a CUDA graph). NCCL's ring
  // and tree all-reduces hand every rank the same reduced values.
  void all_reduce(int rank, float* x, size_t count, cudaStream_t stream);
  // A rank failed: every communicator is aborted and every peer exchange wait released, so that collectives
  // waiting on it end, and later calls throw.
  void abort();
  void check_alive() const;  // throws once aborted

  const PeerExchange* peers() const { return peers_.get(); }  // nullptr: NCCL only

 private:
  struct Api;  // the NCCL entry points, from dlopen
  std::unique_ptr<Api> api_;
  std::vector<void*> comms_;  // ncclComm_t, by rank
  std::unique_ptr<PeerExchange> peers_;
  int version_ = 0;
  std::atomic<bool> aborted_{false};
};

}  // namespace dsv4::cuda
