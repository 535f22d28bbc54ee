// gemm family, tensor-core path: thin wrappers over the sm_90a PTX it is built from — mbarriers, TMA tile
// loads, wgmma fences and shared-memory descriptors, register reallocation. Device code only; every wrapper
// exists only where the architecture has the instruction (__CUDA_ARCH_FEAT_SM90_ALL: sm_90a).
#pragma once

#include <cuda.h>  // CUtensorMap (a plain 128-byte struct; no driver library is linked for it)

#include <cstdint>

namespace dsv4::cuda::tc {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarriers (one 64-bit word in shared memory each)

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(arrivals) : "memory");
}

// NOTE: initialised barriers must be visible to the async proxy (TMA completes transactions on them) before
// any thread uses them; the caller follows this with __syncthreads().
__device__ __forceinline__ void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

// One arrival that also announces `bytes` of TMA transactions the current phase must wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_address(bar)) : "memory");
}

// Blocks until the phase with parity `parity` has completed. A fresh barrier is in phase 0, so waiting for
// parity 1 returns at once: producers start by waiting for "the previous use" of every stage that way.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t address = smem_address(bar);
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n"
        ".reg .pred complete;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
        "selp.u32 %0, 1, 0, complete;\n"
        "}\n"
        : "=r"(done)
        : "r"(address), "r"(parity)
        : "memory");
  }
}

// ---- TMA

__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Copies the box at (inner, outer) — inner counted in elements along the contiguous dimension — of a 2-D
// tensor map into shared memory at `dst`, completing `bytes` of transactions on `bar`. Out-of-bounds
// elements arrive as zeros (and still count as transaction bytes).
// NOTE: `inner` must start on a 16-byte boundary (inner · element bytes % 16 == 0): another start is an illegal
// instruction, not an error the map's encoding could report.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int32_t inner,
                                            int32_t outer) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::
          "r"(smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(inner), "r"(outer), "r"(smem_address(bar))
      : "memory");
}

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global memory to shared memory at
// `dst`, completing that many bytes of transactions on `bar` (a plain bulk copy: no tensor map, no swizzle).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_address(dst)),
               "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(smem_address(bar))
               : "memory");
}

// ---- wgmma bookkeeping

// Orders this thread's register accesses before the wgmmas that follow (required before the first wgmma and
// after any other instruction touched the accumulators).
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }

__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }

// Waits until at most `kPending` committed wgmma groups are still in flight.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// NOTE: the compiler does not know that wgmma_wait completes the accumulator registers; this empty asm
// "redefines" each one after the wait so no read of an accumulator is scheduled before it.
template <int kCount>
__device__ __forceinline__ void fence_registers(float (&r)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// The same for wgmma operands held in registers (A fragments): live and unchanged until the wait.
template <int kCount>
__device__ __forceinline__ void fence_registers(uint32_t (&r)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// Descriptor of a K-major operand tile in shared memory written by TMA with 128-byte swizzle: rows of
// 128 bytes, 8-row swizzle atoms 1024 bytes apart (stride byte offset), the leading byte offset unused for
// swizzled K-major layouts (1 by convention). The tile must start on a 1024-byte boundary; stepping along K
// inside the 128-byte row is done by adding (bytes >> 4) to the descriptor.
__device__ __forceinline__ uint64_t smem_descriptor_sw128(const void* tile) {
  const uint64_t start = (smem_address(tile) & 0x3FFFF) >> 4;
  return start | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// The same swizzle for an MN-major operand (wgmma's transposed B): each 128-byte row holds 64 consecutive N
// elements of one K index, 8-row atoms (8 K indices) 1024 bytes apart (stride byte offset), and the next 64 N
// elements' atoms `lbo` bytes further (leading byte offset). Stepping along K by 8-row groups is done by adding
// (1024 · groups) >> 4.
__device__ __forceinline__ uint64_t smem_descriptor_sw128_mn(const void* tile, uint32_t lbo) {
  const uint64_t start = (smem_address(tile) & 0x3FFFF) >> 4;
  return start | (uint64_t(lbo >> 4) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// Orders this thread's generic-proxy accesses to shared memory before later async-proxy ones (wgmma reading
// operands written by plain stores; a bulk copy overwriting what plain stores wrote), once the threads have met
// at a barrier.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// ---- register reallocation between warpgroups (all threads of a warpgroup execute the same one)

template <uint32_t kRegisters>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

template <uint32_t kRegisters>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace dsv4::cuda::tc
