// Device side of the peer exchange (peer_exchange.h): the sum over the ranks of a block's slice of a share,
// inside the kernel that reads it, a slot (< kPeerSlots) for each 128-column slice of each row; the whole grid
// must be resident at once, as the peers' blocks wait for each other.
#pragma once

#include <cstdint>

#include "cuda/comm/peer_exchange.h"
#include "cuda/elementwise/pack.cuh"

namespace dsv4::cuda {

// Until both 16-byte words at `at` carry `flag` in their odd 4-byte halves (true, the values in *v), or the
// group is aborted (false). Volatile loads: the words are another GPU's stores, and this SM's L1 must not
// answer. The abort word lies in host memory: a read crosses PCIe (~1 µs, and the blocks' reads queue there), so
// it is read once every 4096 polls.
__device__ __forceinline__ bool peer_receive(const uint4* at, unsigned flag, const volatile unsigned* aborted,
                                             Pack<4>* v) {
  for (unsigned i = 1;; ++i) {
    uint4 a, b;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a.x), "=r"(a.y), "=r"(a.z), "=r"(a.w) : "l"(at));
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(b.x), "=r"(b.y), "=r"(b.z), "=r"(b.w) : "l"(at + 1));
    if (a.y == flag && a.w == flag && b.y == flag && b.w == flag) {
      v->v[0] = __uint_as_float(a.x), v->v[1] = __uint_as_float(a.z);
      v->v[2] = __uint_as_float(b.x), v->v[3] = __uint_as_float(b.z);
      return true;
    }
    if (i % 4096 == 0 && *aborted) return false;
  }
}

// A slot's exchange, by the lanes of one warp (lane l: the pack at l of the slot's slice), after the kernel's PDL
// wait (the share's producer has finished): peer_call, then each live lane's peer_push and peer_gather, then
// peer_done by the whole warp. Lanes past D (alike on every rank) push and gather nothing.

// The slot's flag for this call: its calls on this rank so far + 1, the same count on every rank.
__device__ __forceinline__ unsigned peer_call(const PeerSlots& p, int slot) { return __ldcg(p.calls + slot) + 1; }

// This lane's pack into every peer's inbox.
__device__ __forceinline__ void peer_push(const PeerSlots& p, int slot, unsigned call, const Pack<4>& mine) {
  const int lane = int(threadIdx.x % 32), parity = int(call & 1u);
  const uint4 w0 = make_uint4(__float_as_uint(mine.v[0]), call, __float_as_uint(mine.v[1]), call);
  const uint4 w1 = make_uint4(__float_as_uint(mine.v[2]), call, __float_as_uint(mine.v[3]), call);
  for (int q = 0; q < p.ranks; ++q) {
    if (q == p.rank) continue;
    uint4* at = p.inbox[q] + peer_inbox_word(parity, slot, p.ranks, p.rank, lane, 0);
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(at), "r"(w0.x), "r"(w0.y), "r"(w0.z),
                 "r"(w0.w) : "memory");
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(at + 1), "r"(w1.x), "r"(w1.y), "r"(w1.z),
                 "r"(w1.w) : "memory");
  }
}

// Σ over the ranks, in rank order, of this lane's pack (this rank's: `mine`), the peers' from this rank's inbox.
// After an abort a missing share counts as zero.
__device__ __forceinline__ Pack<4> peer_gather(const PeerSlots& p, int slot, unsigned call, const Pack<4>& mine) {
  const int lane = int(threadIdx.x % 32), parity = int(call & 1u);
  Pack<4> sum{};
  for (int r = 0; r < p.ranks; ++r) {
    Pack<4> v = mine;
    if (r != p.rank &&
        !peer_receive(p.inbox[p.rank] + peer_inbox_word(parity, slot, p.ranks, r, lane, 0), call, p.aborted, &v))
      v = Pack<4>{};
    if (r == 0) sum = v;
    else
#pragma unroll
      for (int e = 0; e < 4; ++e) sum.v[e] += v.v[e];
  }
  return sum;
}

// The slot's call is over on this rank (the whole warp, after its gathers).
__device__ __forceinline__ void peer_done(const PeerSlots& p, int slot, unsigned call) {
  __syncwarp();
  if (threadIdx.x % 32 == 0) p.calls[slot] = call;  // read again by this slot's next call, a later kernel
}

// The whole exchange of a slot at once (hc_post_mix: a block's slice of one token, warp 0).
__device__ __forceinline__ Pack<4> peer_sum(const PeerSlots& p, int slot, bool live, const Pack<4>& mine) {
  const unsigned call = peer_call(p, slot);
  Pack<4> sum{};
  if (live) {
    peer_push(p, slot, call, mine);
    sum = peer_gather(p, slot, call, mine);
  }
  peer_done(p, slot, call);
  return sum;
}

}  // namespace dsv4::cuda
