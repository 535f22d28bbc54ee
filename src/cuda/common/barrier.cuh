// Named barriers: a subset of a block's warps meets where __syncthreads would need all of them (warp-specialised
// kernels whose warps meet at different places in the code; a phase that only some warps take part in).
#pragma once

namespace dsv4::cuda {

// Barrier `id` (1..15: 0 is __syncthreads') over `threads` threads, a multiple of 32.
__device__ __forceinline__ void barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Arrives at barrier `id` without waiting: the threads that only produce for those that barrier_sync on it.
__device__ __forceinline__ void barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace dsv4::cuda
