// Kernel launches with programmatic dependent launch (PDL, sm_90+), shared by the families. A kernel launched this
// way may be scheduled while its predecessor in the stream drains (hiding the launch gap between the small
// kernels of a decode step); it must wait for the predecessor (pdl_wait, or pdl_wait_predecessor) before touching
// anything the predecessor wrote.
//
// Reads before the wait: constants (weights, tables) may be read at once — at decode that takes an HBM round
// trip off the step's path — and so may what a copy or memset earlier in the stream wrote (no kernel overlaps
// those; read through L2 with __ldcg, as this SM's L1 may still hold an earlier step's lines).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/check.h"

namespace dsv4::cuda {

// The two PDL instructions; no-ops without PDL (sm_80, or a launch without the attribute).
// pdl_wait_predecessor: the calling thread waits until the predecessor grid has completed and its memory is
// visible. pdl_trigger: this block lets the successor grid launch, which it does once every block of this grid
// has triggered or exited; a block's repeated triggers do nothing more.
__device__ __forceinline__ void pdl_wait_predecessor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// The usual prologue: waits for the predecessor, then lets this grid's successor launch at once if this grid is
// a single wave (no more blocks than SMs × per_sm, the blocks of this kernel an SM holds at once by its launch
// bounds; 1 where that is not pinned); a larger grid lets it launch as its blocks exit. An early successor's
// blocks sit resident until this grid completes: with blocks of this grid still waiting for a slot they would
// take slots from them.
__device__ __forceinline__ void pdl_wait(unsigned per_sm = 1) {
  pdl_wait_predecessor();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned sms;
  asm("mov.u32 %0, %%nsmid;" : "=r"(sms));
  if (gridDim.x * gridDim.y * gridDim.z <= sms * per_sm) pdl_trigger();
#endif
}

// pdl: the device supports it (compute capability ≥ 9); the kernel must wait before reading what its predecessor
// wrote (pdl_wait or pdl_wait_predecessor). cluster > 1: thread-block clusters of that many blocks along x
// (sm_90; grid.x a multiple of it; cuda/common/cluster.cuh). For kernels of several arguments.
template <class... Args>
void launch_pdl_args(void (*kernel)(Args...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                     int cluster, const Args&... args) {
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n++].val.clusterDim = {unsigned(cluster), 1, 1};
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = n;
  DSV4_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
}

// The same for the usual kernel of one parameter struct.
template <class Params>
void launch_pdl(void (*kernel)(Params), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                const Params& p, int cluster = 1) {
  launch_pdl_args(kernel, grid, block, smem, stream, pdl, cluster, p);
}

}  // namespace dsv4::cuda
