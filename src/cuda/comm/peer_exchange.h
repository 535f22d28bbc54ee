// The GPU ranks' small all-reduce folded into the kernel that consumes it (docs/design/parallel.md, "The
// all-reduce inside its consumer"). At decode a sub-block's output is a partial sum of a few rows; instead of an
// NCCL call before the kernel that reads it, that kernel's blocks read the other ranks' shares over NVLink and
// add them in rank order: every rank the same bits, no launch and no NCCL protocol on the path.
//
// Block b of every rank meets its peers' block b twice, by flags in each other's memory (peer_exchange.cuh):
//   start  it tells every peer "my share is final, here is its address" (the share's producer finished before
//          this kernel's PDL wait), and waits for the same from every peer; then it reads their slices;
//   end    it tells every peer "I have read your share", and before the kernel exits waits for the same from
//          every peer: no rank overwrites its share (the next sub-block's producer) while another still reads it.
// The flags are plain (relaxed) stores and loads: the data they guard were written by earlier kernels, which
// the kernel boundary already made visible in the owner's L2 (where a peer's NVLink loads are served), and the
// reads depend on the address the start word carries. Release / acquire flags were measured only while every
// poll also read the host-mapped abort word (+36 µs a row, that read's cost: parallel.md); not since.
//
// Memory: every rank holds, in its own GPU memory, per block slot and sender a start word (the share's address
// and the call's count) and an end word, and its own count of calls per slot. Calls are counted on the GPU, not
// numbered by the host: a CUDA graph may replay them. Abort: a host-mapped word ends every wait, so a rank whose
// peer died finishes its kernels (with wrong sums) and the group's later calls throw.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace dsv4::cuda {

constexpr int kPeerMaxRanks = 8;
constexpr int kPeerSlots = 2048;  // blocks of one call: up to 8 rows of D = 32768 in 128-column slices

// A kernel's view of the exchange (by value in its parameters). ranks ≤ 1: no exchange.
struct PeerSlots {
  uint64_t* start[kPeerMaxRanks] = {};  // rank q's: [kPeerSlots][kPeerMaxRanks senders], address << 16 | count
  unsigned* end[kPeerMaxRanks] = {};    // rank q's: [kPeerSlots][kPeerMaxRanks senders], the count
  unsigned* calls = nullptr;            // this rank's: [kPeerSlots], calls made on each slot
  const volatile unsigned* aborted = nullptr;  // host-mapped, shared by the ranks
  int rank = 0, ranks = 0;
};

class PeerExchange {
 public:
  // One rank per entry of devices. Enables peer access between them; throws if a pair lacks it.
  explicit PeerExchange(const std::vector<int>& devices);
  ~PeerExchange();
  PeerExchange(const PeerExchange&) = delete;
  PeerExchange& operator=(const PeerExchange&) = delete;

  // Whether every pair of these devices can reach the other's memory and they share one architecture (no
  // allocation, no state change). One architecture: a kernel's residency per SM is then the same on every rank.
  static bool possible(const std::vector<int>& devices);
  // Whether a share at x can travel in a start word (16-byte aligned, below 2^48).
  static bool addressable(const void* x) {
    const auto a = reinterpret_cast<uintptr_t>(x);
    return a % 16 == 0 && a < (uint64_t(1) << 48);
  }

  int ranks() const { return int(memory_.size()); }
  // The fewest SMs of the ranks' GPUs. Whether a call takes the exchange must be decided alike on every rank (a
  // rank in the exchange waits for its peers there, one taking NCCL for them in NCCL: neither returns), so it
  // is decided from what the ranks share: the call's shape, this count, and one architecture's residency.
  int sms() const { return sms_; }
  PeerSlots slots(int rank) const;
  void abort();  // releases every wait, now and later
  // Waits until every rank's GPU is idle; errors are ignored (destructors call it). A rank's memory may be read
  // by a peer's kernel still queued — after an abort the GPUs drift apart — so no rank frees it before then.
  void quiesce() const;

 private:
  struct RankMemory {
    int device = 0;
    uint64_t* start = nullptr;
    unsigned* end = nullptr;
    unsigned* calls = nullptr;
  };
  std::vector<RankMemory> memory_;
  unsigned* aborted_ = nullptr;  // mapped, portable host memory
  int sms_ = 0;
};

}  // namespace dsv4::cuda
