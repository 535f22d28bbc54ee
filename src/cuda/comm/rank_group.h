// The GPU ranks of one model (model/parallel.h), one process: NCCL for every collective, and the peer-to-peer
// one-shot all-reduce (peer_all_reduce.h) for the messages that fit it, where every pair of GPUs reaches the
// other's memory.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <memory>
#include <vector>

#include "cuda/comm/nccl_group.h"
#include "cuda/comm/peer_all_reduce.h"

namespace dsv4::cuda {

class RankGroup {
 public:
  explicit RankGroup(const std::vector<int>& devices);

  // x [count] ← Σ over the ranks' x, enqueued on `stream` (devices[rank]'s); every rank gets the same bits.
  void all_reduce(int rank, float* x, size_t count, cudaStream_t stream);
  // A rank failed: waiting collectives end and later ones throw.
  void abort();
  bool peer_to_peer() const { return peer_ != nullptr; }

 private:
  NcclGroup nccl_;
  std::unique_ptr<PeerAllReduce> peer_;  // nullptr: some pair has no peer access
  std::atomic<bool> aborted_{false};
};

}  // namespace dsv4::cuda
