// A one-shot all-reduce over peer-to-peer loads (NVLink), for the small messages of decode: each rank copies
// its x into a staging buffer of its own GPU, tells every rank so through a flag in that rank's memory, waits
// for everyone's flag, then sums all ranks' staging buffers straight from their GPUs, in rank order — so every
// rank gets the same bits. One kernel a call and no host involvement, so it is capturable in a CUDA graph;
// NCCL's ring needs several NVLink round trips where this needs one (issue #25 measured 15 µs against 8 µs).
//
// Each block reduces its own slice (8 KB, a float4 a thread) and synchronises with the same block of the other ranks through its
// own flags, so blocks never wait on each other. The staging buffers alternate between two halves: a rank that
// starts call e + 2 has seen every rank arrive at call e + 1, hence finish reading call e's half.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

namespace dsv4::cuda {

constexpr int kPeerMaxRanks = 8;
// Up to two rows of V4's D = 4096: measured 7.7–8.8 µs at 16 KB on 2×H100 (bench_all_reduce), where NCCL took
// 15 µs (issue #25). Larger messages go to NCCL until bench_all_reduce has measured both there (a first version
// of this kernel, a loop of dependent remote loads, made every decode step slower up to 1 MB).
constexpr size_t kPeerMaxBytes = size_t(32) << 10;
constexpr int kPeerMaxBlocks = int(kPeerMaxBytes / 8192);  // 8 KB a block

class PeerAllReduce {
 public:
  // Enables peer access between every pair of `devices` and allocates each one's staging buffers and flags.
  // Throws when a pair cannot reach each other (the caller then keeps NCCL for every message).
  explicit PeerAllReduce(const std::vector<int>& devices);
  ~PeerAllReduce();
  PeerAllReduce(const PeerAllReduce&) = delete;
  PeerAllReduce& operator=(const PeerAllReduce&) = delete;

  int ranks() const { return int(devices_.size()); }
  static bool fits(size_t count) { return count * sizeof(float) <= kPeerMaxBytes; }
  // Enqueues x [count] ← Σ over the ranks' x (in rank order) on `stream`, which belongs to devices[rank]; every
  // rank must make the same calls in the same order.
  void all_reduce(int rank, float* x, size_t count, cudaStream_t stream);
  // A rank failed: the kernels waiting for it return (x is then garbage), and so do later ones.
  void abort();

 private:
  struct RankMemory {
    float* stage = nullptr;        // [2, kPeerMaxBytes / 4]
    unsigned* flags = nullptr;     // [kPeerMaxBlocks, kPeerMaxRanks]: the call each rank's block b reached
    unsigned* epochs = nullptr;    // [kPeerMaxBlocks]: this rank's calls, per block
  };
  std::vector<int> devices_;
  std::vector<RankMemory> memory_;
  unsigned* aborted_ = nullptr;  // mapped host memory, read by the waiting kernels: non-zero once aborted
};

}  // namespace dsv4::cuda
