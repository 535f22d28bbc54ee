#include "cuda/comm/peer_all_reduce.h"

#include <cstdint>

#include "cuda/common/check.h"

namespace dsv4::cuda {

namespace {

constexpr int kThreads = 512;
constexpr int64_t kStageFloats = int64_t(kPeerMaxBytes / sizeof(float));
// Block b always reduces elements [b·kChunk, (b + 1)·kChunk): its staging region and its flags are its own
// whatever the message size, so a call never overwrites a region another block of an earlier call reads.
constexpr int64_t kChunk = kStageFloats / kPeerMaxBlocks;
static_assert(kChunk == 4 * kThreads, "a thread reduces one float4");

struct PeerParams {
  float* x;  // [count], this rank's, in place
  int64_t count;
  bool vector;  // x is 16-byte aligned: float4 loads and stores
  int rank, ranks;
  const float* stage[kPeerMaxRanks];  // every rank's staging buffers (peer pointers)
  unsigned* flags[kPeerMaxRanks];     // every rank's flags
  unsigned* epochs;                   // this rank's
  const volatile unsigned* aborted;   // mapped host memory
};

__device__ __forceinline__ void store_release_sys(unsigned* p, unsigned v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned load_acquire_sys(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__global__ void __launch_bounds__(kThreads) peer_all_reduce_kernel(PeerParams p) {
  const int b = blockIdx.x;
  const int64_t begin = b * kChunk, end = min(p.count, begin + kChunk);
  const unsigned e = p.epochs[b] + 1;  // this call, for this block
  const int64_t half = (e & 1) * kStageFloats;
  float* mine = const_cast<float*>(p.stage[p.rank]) + half;
  // Thread t owns elements begin + 4t .. begin + 4t + 3 (kChunk = 4 · kThreads): one 16-byte load per rank, all
  // in flight at once — remote loads are latency bound, a loop of dependent ones was slower than NCCL.
  const int64_t i = begin + 4 * int64_t(threadIdx.x);
  const bool whole = i + 4 <= end && p.vector;
  if (whole) {
    *reinterpret_cast<float4*>(mine + i) = *reinterpret_cast<const float4*>(p.x + i);
  } else {
    for (int64_t j = i; j < min(end, i + 4); ++j) mine[j] = p.x[j];
  }
  __syncthreads();
  if (threadIdx.x < p.ranks) {
    // Arrive at every rank (the fence orders this block's staging stores before the flag), then wait for every
    // rank's same block.
    __threadfence_system();
    store_release_sys(p.flags[threadIdx.x] + b * kPeerMaxRanks + p.rank, e);
    const unsigned* mine_flag = p.flags[p.rank] + b * kPeerMaxRanks + threadIdx.x;
    while (int(load_acquire_sys(mine_flag) - e) < 0 && !*p.aborted) {
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) p.epochs[b] = e;
  if (whole) {
    float4 v[kPeerMaxRanks];
#pragma unroll
    for (int q = 0; q < kPeerMaxRanks; ++q)
      if (q < p.ranks) v[q] = __ldcv(reinterpret_cast<const float4*>(p.stage[q] + half + i));  // uncached
    float4 s = v[0];
#pragma unroll
    for (int q = 1; q < kPeerMaxRanks; ++q)
      if (q < p.ranks) s.x += v[q].x, s.y += v[q].y, s.z += v[q].z, s.w += v[q].w;
    *reinterpret_cast<float4*>(p.x + i) = s;
  } else {
    for (int64_t j = i; j < min(end, i + 4); ++j) {
      float s = __ldcv(p.stage[0] + half + j);
      for (int q = 1; q < p.ranks; ++q) s += __ldcv(p.stage[q] + half + j);
      p.x[j] = s;
    }
  }
}

}  // namespace

PeerAllReduce::PeerAllReduce(const std::vector<int>& devices) : devices_(devices) {
  const int n = int(devices.size());
  DSV4_CHECK(n >= 1 && n <= kPeerMaxRanks, "peer all-reduce: ", n, " ranks (at most ", kPeerMaxRanks, ")");
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      int can = 0;
      DSV4_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, devices[size_t(a)], devices[size_t(b)]));
      DSV4_CHECK(can, "GPU ", devices[size_t(a)], " cannot read GPU ", devices[size_t(b)], "'s memory (no peer access)");
      DSV4_CUDA_CHECK(cudaSetDevice(devices[size_t(a)]));
      const cudaError_t err = cudaDeviceEnablePeerAccess(devices[size_t(b)], 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
      else DSV4_CUDA_CHECK(err);
    }
  for (int a = 0; a < n; ++a) {
    DSV4_CUDA_CHECK(cudaSetDevice(devices[size_t(a)]));
    RankMemory m;
    DSV4_CUDA_CHECK(cudaMalloc(&m.stage, 2 * kPeerMaxBytes));
    DSV4_CUDA_CHECK(cudaMalloc(&m.flags, kPeerMaxBlocks * kPeerMaxRanks * sizeof(unsigned)));
    DSV4_CUDA_CHECK(cudaMalloc(&m.epochs, kPeerMaxBlocks * sizeof(unsigned)));
    DSV4_CUDA_CHECK(cudaMemset(m.flags, 0, kPeerMaxBlocks * kPeerMaxRanks * sizeof(unsigned)));
    DSV4_CUDA_CHECK(cudaMemset(m.epochs, 0, kPeerMaxBlocks * sizeof(unsigned)));
    memory_.push_back(m);
  }
  DSV4_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&aborted_), sizeof(unsigned),
                                cudaHostAllocMapped | cudaHostAllocPortable));
  *aborted_ = 0;
  for (int a = 0; a < n; ++a) {
    DSV4_CUDA_CHECK(cudaSetDevice(devices[size_t(a)]));
    DSV4_CUDA_CHECK(cudaDeviceSynchronize());  // the zeroed flags are in place before any rank's first call
  }
}

void PeerAllReduce::abort() { *reinterpret_cast<volatile unsigned*>(aborted_) = 1; }

PeerAllReduce::~PeerAllReduce() {
  for (size_t a = 0; a < memory_.size(); ++a) {
    cudaSetDevice(devices_[a]);
    cudaFree(memory_[a].stage);
    cudaFree(memory_[a].flags);
    cudaFree(memory_[a].epochs);
  }
  if (aborted_) cudaFreeHost(aborted_);
}

void PeerAllReduce::all_reduce(int rank, float* x, size_t count, cudaStream_t stream) {
  DSV4_CHECK(fits(count), "peer all-reduce: ", count, " floats exceed ", kPeerMaxBytes, " bytes");
  if (count == 0) return;
  PeerParams p{};
  p.x = x;
  p.count = int64_t(count);
  p.vector = reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const int blocks = int(ceil_div(p.count, kChunk));
  p.rank = rank;
  p.ranks = ranks();
  for (int q = 0; q < p.ranks; ++q) {
    p.stage[q] = memory_[size_t(q)].stage;
    p.flags[q] = memory_[size_t(q)].flags;
  }
  p.epochs = memory_[size_t(rank)].epochs;
  p.aborted = aborted_;  // mapped, portable: the same address on every device (unified addressing)
  peer_all_reduce_kernel<<<blocks, kThreads, 0, stream>>>(p);
  DSV4_LAUNCH_CHECK();
}

}  // namespace dsv4::cuda
