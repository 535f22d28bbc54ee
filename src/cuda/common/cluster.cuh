// Thread-block clusters (sm_90): the blocks of a cluster split one unit of work and meet through distributed
// shared memory (the decode GEMV's K slices, expert_up's at a tensor-parallel rank's narrow I). Every helper takes
// the cluster's size as launched, 1 where the kernel ran without clusters (then it is the block alone).
#pragma once

#include <cooperative_groups.h>

namespace dsv4::cuda {

// The cluster's blocks (1 without clusters) and this block's rank in it.
__device__ __forceinline__ int cluster_blocks() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return int(cooperative_groups::this_cluster().num_blocks());
#else
  return 1;
#endif
}
__device__ __forceinline__ int cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return int(cooperative_groups::this_cluster().block_rank());
#else
  return 0;
#endif
}

// Every thread of the cluster (of the block where `blocks` is 1) waits here; the cluster barrier also orders each
// block's shared-memory writes before it for the peers that read them after.
__device__ __forceinline__ void cluster_barrier(int blocks) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (blocks > 1) {
    cooperative_groups::this_cluster().sync();
    return;
  }
#endif
  (void)blocks;
  __syncthreads();
}

// The cluster barrier for threads that reach it from different places in the code (warp-specialised kernels:
// the non-.aligned form). Every thread of every block of the cluster must arrive once; it orders each thread's
// memory accesses before it, distributed shared memory included, before those of every thread after it.
__device__ __forceinline__ void cluster_sync_anywhere() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
#endif
}

// Block `rank`'s copy of this block's shared-memory address p.
template <class T>
__device__ __forceinline__ T* cluster_shared(T* p, int rank, int blocks) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (blocks > 1) return cooperative_groups::this_cluster().map_shared_rank(p, rank);
#endif
  (void)rank;
  (void)blocks;
  return p;  // clusters are only launched on sm_90+
}

}  // namespace dsv4::cuda
