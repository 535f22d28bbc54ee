// The GPU ranks' small all-reduce folded into the kernel that consumes it (docs/design/parallel.md, "The
// all-reduce inside its consumer"). At decode a sub-block's output is a partial sum of a few rows; instead of an
// NCCL call before the kernel that reads it, that kernel's blocks trade the ranks' shares over NVLink and add
// them in rank order: every rank the same bits, no launch and no NCCL protocol on the path.
//
// A push in NCCL's LL manner: block b of every rank writes its slice of its share into every peer's inbox, each
// 4-byte value beside a 4-byte flag (the call's count) in one 8-byte half of a 16-byte store, and polls its own
// inbox until every peer's halves carry this call's flag. A value and its flag land together (NVLink does not
// tear an aligned 8-byte half), so nothing else orders them: no fence, no start or end handshake, and a rank's
// share is read only by the rank itself. The inbox has two halves by the call's parity: a rank writes call
// k + 2 into a peer's half only after its own call k + 1, which needed the peer's call k + 1, which the peer sent
// after it had read call k.
//
// Memory: every rank holds, in its own GPU memory, the inbox [2 parities][kPeerSlots][ranks senders][32 lanes]
// of 32 bytes (a lane's 4 values), and its own count of calls per slot. Calls are counted on the GPU, not
// numbered by the host: a CUDA graph may replay them. Abort: a host-mapped word ends every wait, so a rank whose
// peer died finishes its kernels (with wrong sums) and the group's later calls throw.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace dsv4::cuda {

constexpr int kPeerMaxRanks = 8;
constexpr int kPeerSlots = 2048;  // (row, 128-column slice) pairs of one call: 64 rows of D = 4096
constexpr int kPeerLanes = 32;    // a slot's senders each send 32 lanes × 4 values

// The 16-byte word `half` (0, 1) of lane `lane`'s packet from `sender` in slot `slot`, call parity `parity`, of an
// inbox of `ranks` senders; a packet holds the lane's values v0..v3 as {v0, flag, v1, flag}, {v2, flag, v3, flag}.
__host__ __device__ inline int64_t peer_inbox_word(int parity, int slot, int ranks, int sender, int lane, int half) {
  return ((int64_t(parity) * kPeerSlots + slot) * ranks + sender) * (kPeerLanes * 2) + lane * 2 + half;
}

// A kernel's view of the exchange (by value in its parameters). ranks ≤ 1: no exchange.
struct PeerSlots {
  uint4* inbox[kPeerMaxRanks] = {};  // rank q's inbox (peer_inbox_word)
  unsigned* calls = nullptr;         // this rank's: [kPeerSlots], calls made on each slot
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
  int ranks() const { return int(memory_.size()); }
  // The fewest SMs of the ranks' GPUs. Whether a call takes the exchange must be decided alike on every rank (a
  // rank in the exchange waits for its peers there, one taking NCCL for them in NCCL: neither returns), so it
  // is decided from what the ranks share: the call's shape, this count, and one architecture's residency.
  int sms() const { return sms_; }
  PeerSlots slots(int rank) const;
  void abort();  // releases every wait, now and later

 private:
  // Waits until every rank's GPU is idle; errors are ignored (the destructor calls it). A rank's inbox may be
  // written by a peer's kernel still queued — after an abort the GPUs drift apart — so none is freed before then.
  void quiesce() const;

  struct RankMemory {
    int device = 0;
    uint4* inbox = nullptr;
    unsigned* calls = nullptr;
  };
  std::vector<RankMemory> memory_;
  unsigned* aborted_ = nullptr;  // mapped, portable host memory
  int sms_ = 0;
};

}  // namespace dsv4::cuda
