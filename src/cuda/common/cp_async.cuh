// Asynchronous global → shared copies (cp.async, sm_80+), shared by the kernels that stage through shared memory
// while they compute: the attention kernels (attention/), the grouped MoE GEMMs (moe/experts_grouped.cu) and the
// bf16 decode GEMV's weight ring (gemm/gemv_mma.cu).
#pragma once

namespace dsv4::cuda {

// 16 bytes, cached in L2 only (.cg); both addresses 16-byte aligned.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem));
}
// 4 bytes (.ca: the 4-byte form allows no other); both addresses 4-byte aligned.
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  const unsigned s = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gmem));
}
// The same at a shared-memory address (the state space's own 32-bit address: no conversion per copy).
__device__ __forceinline__ void cp_async16(unsigned smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem), "l"(gmem));
}
__device__ __forceinline__ void cp_async4(unsigned smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
// The same for a count known only at run time (a ring's depth), 0 ≤ n ≤ 7; larger n waits for all.
__device__ __forceinline__ void cp_async_wait_dyn(int n) {
  switch (n) {
    case 7: cp_async_wait<7>(); break;
    case 6: cp_async_wait<6>(); break;
    case 5: cp_async_wait<5>(); break;
    case 4: cp_async_wait<4>(); break;
    case 3: cp_async_wait<3>(); break;
    case 2: cp_async_wait<2>(); break;
    case 1: cp_async_wait<1>(); break;
    default: cp_async_wait<0>(); break;
  }
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// An arrival on the mbarrier at shared address `bar` once every cp.async this thread issued before has landed,
// counted against the barrier's expected arrivals (.noinc): a barrier of N producer threads expects N.
__device__ __forceinline__ void cp_async_mbarrier_arrive(unsigned bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

}  // namespace dsv4::cuda
