// The collectives of in-process CPU ranks (model/parallel.h): every rank of the group calls with the same
// arguments, each from its own thread. What NCCL is to GPU ranks, over host memory.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace dsv4 {

class HostGroup {
 public:
  explicit HostGroup(int ranks);
  int ranks() const { return int(inputs_.size()); }

  // x [count] ← Σ over the ranks' x, added in rank order, so that every rank gets the same bits.
  void all_reduce(int rank, float* x, size_t count);
  // A rank failed: calls waiting now, and every later call, throw instead of waiting for it.
  void abort();

 private:
  // Waits until every rank has arrived (a barrier), sum_ then holding at least sum_size; throws once aborted.
  void arrive(size_t sum_size = 0);

  std::mutex mutex_;
  std::condition_variable all_here_;
  int arrived_ = 0;
  uint64_t phase_ = 0;
  bool aborted_ = false;
  std::vector<float*> inputs_;  // each rank's x of the current call
  std::vector<float> sum_;
};

}  // namespace dsv4
