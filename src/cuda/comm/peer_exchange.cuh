// Device side of the peer exchange (peer_exchange.h): the sum over the ranks of a block's slice of a share,
// inside the kernel that reads it. A kernel calls peer_sum once, then peer_sum_finish before it exits, every block
// on its own slot (< kPeerSlots); the whole grid must be resident at once, as the peers' blocks wait for each other.
#pragma once

#include <cstdint>

#include "cuda/comm/peer_exchange.h"
#include "cuda/elementwise/pack.cuh"

namespace dsv4::cuda {

// Until (the low 16 bits of) *word reach `count` (true), or the group is aborted (false). Volatile loads: the
// word is another GPU's store, and this SM's L1 must not answer. The abort word lies in host memory: a read
// crosses PCIe (~1 µs, and the blocks' reads queue there), so it is read once every 4096 polls.
template <class T>
__device__ __forceinline__ bool peer_wait(const T* word, unsigned count, const volatile unsigned* aborted, T* seen) {
  for (unsigned i = 1;; ++i) {
    *seen = *reinterpret_cast<const volatile T*>(word);
    if (int16_t(uint16_t(*seen) - uint16_t(count)) >= 0) return true;
    if (i % 4096 == 0 && *aborted) return false;
  }
}

// Σ over the ranks, in rank order, of the pack at element `at` of the share (this rank's: `share`; every rank's
// has the same layout; `mine` is this rank's pack there), stored to *sum (shared memory) by each thread that
// passes one (where `reads` is false: zeros, and no peer's memory read). Block-wide: every thread of the block
// calls it (two barriers), after the kernel's PDL wait (the share's producer has finished). The sums are stored
// before the barrier that precedes the end word: a store needs the loaded values, so no NVLink load is still in
// flight when a peer learns it may overwrite its share (a barrier alone orders issue, and the compiler may sink
// the additions, and with them the wait for the loads, past it).
__device__ __forceinline__ void peer_sum(const PeerSlots& p, int slot, const float* share, int64_t at, bool reads,
                                         const Pack<4>& mine, Pack<4>* sum) {
  __shared__ const float* shares[kPeerMaxRanks];
  const unsigned call = __ldcg(p.calls + slot) + 1;  // stored by peer_sum_finish, after every thread read it
  const int q = threadIdx.x;
  if (q < p.ranks) {
    if (q == p.rank) {
      shares[q] = share;
    } else {
      // Start: tell rank q where this rank's share is, then wait for rank q's word.
      volatile uint64_t* there = p.start[q] + slot * kPeerMaxRanks + p.rank;
      *there = uint64_t(reinterpret_cast<uintptr_t>(share)) << 16 | (call & 0xFFFFu);
      uint64_t word;
      const bool arrived = peer_wait(p.start[p.rank] + slot * kPeerMaxRanks + q, call, p.aborted, &word);
      shares[q] = arrived ? reinterpret_cast<const float*>(uintptr_t(word >> 16)) : share;  // aborted: any sum
    }
  }
  __syncthreads();
  if (sum) {
    Pack<4> s{};
    if (reads)
      for (int r = 0; r < p.ranks; ++r) {
        Pack<4> v = mine;
        if (r != p.rank) {
          const float4 w = __ldcv(reinterpret_cast<const float4*>(shares[r] + at));  // over NVLink, uncached
          v.v[0] = w.x, v.v[1] = w.y, v.v[2] = w.z, v.v[3] = w.w;
        }
        if (r == 0) s = v;
        else
#pragma unroll
          for (int e = 0; e < 4; ++e) s.v[e] += v.v[e];
      }
    *sum = s;
  }
  __syncthreads();  // every sum is stored: the block's reads have returned
  if (q < p.ranks && q != p.rank)
    *reinterpret_cast<volatile unsigned*>(p.end[q] + slot * kPeerMaxRanks + p.rank) = call;  // end: read
}

// The end of a kernel that called peer_sum: waits until every peer has read this rank's share (block-wide).
__device__ __forceinline__ void peer_sum_finish(const PeerSlots& p, int slot) {
  const unsigned call = __ldcg(p.calls + slot) + 1;
  const int q = threadIdx.x;
  unsigned seen;
  if (q < p.ranks && q != p.rank) peer_wait(p.end[p.rank] + slot * kPeerMaxRanks + q, call, p.aborted, &seen);
  __syncthreads();  // every thread has read the count
  if (threadIdx.x == 0) p.calls[slot] = call;
}

}  // namespace dsv4::cuda
