// step family benchmark: what one dependent step of a batch-1 decode costs at the least, on one GPU. A decode
// layer is a chain of ~15 dependent steps (docs/PERFORMANCE.md, "What a layer costs"): each needs all of its
// predecessor's output (a row of a few KB, read by every block, as a GEMV reads x) and streams its own weights.
// Here each step is exactly that and nothing else — every block reads the whole 16 KB row through L2, sums it,
// folds in its share of W weight bytes (cold: every step its own, the chain's weights far beyond L2), and writes
// its slice of the next row — in three forms, each a chain of kSteps steps replayed from a CUDA graph:
//   kernels      one kernel a step, plain stream order;
//   kernels+PDL  one kernel a step under programmatic dependent launch: a step's weights are loaded before its
//                wait (as the engine's GEMVs do), its blocks resident while the predecessor runs;
//   persistent   one kernel for the chain, a grid barrier between steps (an arrival counter), the next step's
//                weights loaded before the barrier: the floor of a layer as one launch.
// Prints µs per step beside W at the copy bandwidth (measure_copy_bandwidth, in the same run).
//
//   bench_chain
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "common/event_timing.h"
#include "cuda/bandwidth.h"
#include "cuda/common/check.h"
#include "cuda/common/launch.cuh"

namespace dsv4 {
namespace {

constexpr int kThreads = 256;
constexpr int kD = 4096;          // the row: V4-Flash's D in fp32, 16 KB
constexpr int kSteps = 64;        // a chain: ~4 layers' steps
constexpr int kPre = 8;           // 16-byte weight loads a thread issues before it waits (128 bytes)
constexpr int kReplays = 20;

struct StepParams {
  float* rows = nullptr;        // [2][kD]: step k reads row k % 2, writes row (k + 1) % 2
  const uint4* w = nullptr;     // [kSteps][blocks][w_per_block]
  int64_t w_per_block = 0;      // 16-byte words of one step's weights a block streams
  int step = 0;
};

// Step p.step's weights for this block: the first kPre words a thread loads (before any wait), then the rest.
__device__ __forceinline__ void weights_first(const StepParams& p, int step, uint4 (&pre)[kPre]) {
  const uint4* w = p.w + (int64_t(step) * gridDim.x + blockIdx.x) * p.w_per_block;
#pragma unroll
  for (int i = 0; i < kPre; ++i) {
    const int64_t j = threadIdx.x + int64_t(i) * kThreads;
    pre[i] = j < p.w_per_block ? __ldcs(w + j) : make_uint4(0, 0, 0, 0);
  }
}

__device__ __forceinline__ unsigned weights_rest(const StepParams& p, int step, const uint4 (&pre)[kPre]) {
  const uint4* w = p.w + (int64_t(step) * gridDim.x + blockIdx.x) * p.w_per_block;
  unsigned acc = 0;
#pragma unroll
  for (int i = 0; i < kPre; ++i) acc ^= pre[i].x ^ pre[i].y ^ pre[i].z ^ pre[i].w;
  for (int64_t j = threadIdx.x + int64_t(kPre) * kThreads; j < p.w_per_block; j += kThreads * 4) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      v[u] = j + u * kThreads < p.w_per_block ? __ldcs(w + j + u * kThreads) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  return acc;
}

// The step's body after its dependency is met: the whole row read (through L2: a previous replay's lines may sit
// in this SM's L1), summed over the block, the weights folded in, this block's slice of the next row written:
// the row's mean + 1. The chain starts from a zero row, so step k reads k everywhere, and a step that read a
// half-written row leaves the last row off kSteps.
__device__ __forceinline__ void step_body(const StepParams& p, int step, const uint4 (&pre)[kPre]) {
  __shared__ float warp_sums[kThreads / 32];
  const float* x = p.rows + (step % 2) * kD;
  float* y = p.rows + ((step + 1) % 2) * kD;
  float s = 0.0f;
  for (int i = threadIdx.x; i < kD; i += kThreads) s += __ldcg(x + i);
  const unsigned acc = weights_rest(p, step, pre);
  s += float(acc & 1u) * 1e-30f;  // the weights are consumed (the 0x5A bytes fold to 0: exact sums)
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = s;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
  const int per = (kD + gridDim.x - 1) / gridDim.x;
  for (int i = threadIdx.x; i < per; i += kThreads) {
    const int j = blockIdx.x * per + i;
    if (j < kD) y[j] = total / float(kD) + 1.0f;
  }
  __syncthreads();  // warp_sums is reused by the persistent kernel's next step
}

// One step a launch; with PDL the weights' first words are in flight before the wait.
__global__ void __launch_bounds__(kThreads) step_kernel(StepParams p) {
  uint4 pre[kPre];
  weights_first(p, p.step, pre);
  cuda::pdl_wait();
  step_body(p, p.step, pre);
}

// Every step in one launch; `arrivals` counts blocks that finished a step (zero at launch). The grid is one block
// an SM (256 threads, no dynamic shared memory: resident at once): every block waits for all the others.
__global__ void __launch_bounds__(kThreads) chain_kernel(StepParams p, unsigned* arrivals) {
  for (int step = 0; step < kSteps; ++step) {
    uint4 pre[kPre];
    weights_first(p, step, pre);  // constants: before the barrier
    if (step > 0) {
      if (threadIdx.x == 0) {
        __threadfence();  // this block's slice of the row, before its arrival
        atomicAdd(arrivals, 1u);
        const unsigned want = unsigned(step) * gridDim.x;
        while (*reinterpret_cast<volatile unsigned*>(arrivals) < want) {
        }
        __threadfence();
      }
      __syncthreads();
    }
    step_body(p, step, pre);
  }
}

// µs per step of what enqueue() puts on the stream (kSteps steps), from a graph, median of kReplays.
template <class Enqueue>
double us_per_step(cudaStream_t s, const Enqueue& enqueue) {
  bench::CapturedGraph graph(s, enqueue);
  graph.launch(s);  // warm-up
  DSV4_CUDA_CHECK(cudaStreamSynchronize(s));
  bench::EventTimer timer;
  std::vector<double> ms;
  for (int r = 0; r < kReplays; ++r) {
    timer.start(s);
    graph.launch(s);
    ms.push_back(timer.stop_ms(s));
  }
  return bench::median(ms) * 1000.0 / kSteps;
}

// Whether the last replay's chain ended on kSteps everywhere (kSteps is even: row 0).
bool chain_ended_right(const float* rows) {
  std::vector<float> got(kD);
  DSV4_CUDA_CHECK(cudaMemcpy(got.data(), rows, kD * sizeof(float), cudaMemcpyDeviceToHost));
  for (float v : got)
    if (v != float(kSteps)) {
      std::fprintf(stderr, "bench_chain: the last row holds %g, not %d: a step read a half-written row\n",
                   double(v), kSteps);
      return false;
    }
  return true;
}

int run() {
  cudaDeviceProp prop;
  DSV4_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  const int blocks = sms;  // one block an SM, as the engine's GEMVs at batch 1 (and one wave for the barrier)
  cudaStream_t s;
  DSV4_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  const double copy_bw = measure_copy_bandwidth(0);  // bytes / s, read + written

  float* rows = nullptr;
  DSV4_CUDA_CHECK(cudaMalloc(&rows, 2 * kD * sizeof(float)));
  unsigned* arrivals = nullptr;
  DSV4_CUDA_CHECK(cudaMalloc(&arrivals, sizeof(unsigned)));

  std::printf("%s, %d SMs, copy bandwidth %.2f TB/s; a chain of %d steps from a CUDA graph, %d blocks of %d "
              "threads a step, a %d-float row; µs per step (median of %d replays)\n\n",
              prop.name, sms, copy_bw / 1e12, kSteps, blocks, kThreads, kD, kReplays);
  std::printf("| weights a step | at the copy bandwidth | kernels | kernels+PDL | persistent |\n"
              "|---:|---:|---:|---:|---:|\n");
  for (const size_t w_bytes : {size_t(0), size_t(2) << 20, size_t(8) << 20, size_t(17) << 20}) {
    StepParams p;
    p.rows = rows;
    p.w_per_block = int64_t(w_bytes / 16 / size_t(blocks));
    uint4* w = nullptr;
    const size_t total = std::max<size_t>(16, size_t(kSteps) * size_t(blocks) * size_t(p.w_per_block) * 16);
    DSV4_CUDA_CHECK(cudaMalloc(&w, total));
    DSV4_CUDA_CHECK(cudaMemset(w, 0x5A, total));
    p.w = w;
    double us[3];
    for (int mode = 0; mode < 2; ++mode) {
      us[mode] = us_per_step(s, [&] {
        DSV4_CUDA_CHECK(cudaMemsetAsync(rows, 0, 2 * kD * sizeof(float), s));
        for (int k = 0; k < kSteps; ++k) {
          StepParams q = p;
          q.step = k;
          cuda::launch_pdl(step_kernel, dim3(blocks), dim3(kThreads), 0, s, mode == 1, q);
        }
      });
      if (!chain_ended_right(rows)) return 1;
    }
    us[2] = us_per_step(s, [&] {
      DSV4_CUDA_CHECK(cudaMemsetAsync(rows, 0, 2 * kD * sizeof(float), s));
      DSV4_CUDA_CHECK(cudaMemsetAsync(arrivals, 0, sizeof(unsigned), s));
      chain_kernel<<<blocks, kThreads, 0, s>>>(p, arrivals);
      DSV4_CUDA_CHECK(cudaGetLastError());
    });
    if (!chain_ended_right(rows)) return 1;
    std::printf("| %.1f MB | %.2f | %.2f | %.2f | %.2f |\n", double(w_bytes) / 1e6,
                double(w_bytes) / copy_bw * 1e6, us[0], us[1], us[2]);
    DSV4_CUDA_CHECK(cudaFree(w));
  }
  DSV4_CUDA_CHECK(cudaFree(rows));
  DSV4_CUDA_CHECK(cudaFree(arrivals));
  DSV4_CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
}

}  // namespace
}  // namespace dsv4

int main() {
  try {
    return dsv4::run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_chain: %s\n", e.what());
    return 1;
  }
}
