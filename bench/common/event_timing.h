// Shared by the CUDA benchmarks: calls enqueued on a stream, timed between two CUDA events, with the L2 flushed
// before each where a benchmark measures the decode step's real case (its weights and caches do not stay in L2),
// and a call captured once as a CUDA graph (no host launch cost between its kernels, as under PDL in a step).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "cuda/common/check.h"

namespace dsv4::bench {

// Two events around work on a stream: start(s), enqueue, then stop_ms(s) waits for it and returns its ms.
class EventTimer {
 public:
  EventTimer() {
    DSV4_CUDA_CHECK(cudaEventCreate(&start_));
    DSV4_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~EventTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  void start(cudaStream_t s) { DSV4_CUDA_CHECK(cudaEventRecord(start_, s)); }
  double stop_ms(cudaStream_t s) {
    DSV4_CUDA_CHECK(cudaEventRecord(stop_, s));
    DSV4_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0.0f;
    DSV4_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return double(ms);
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// The median of timings (the upper one of an even count).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ms of each of `iters` calls of enqueue() on stream s, each after `flush_bytes` of `flush` (several times the
// L2) are rewritten: every call starts with a cold L2.
template <class Enqueue>
std::vector<double> flushed_ms(cudaStream_t s, void* flush, size_t flush_bytes, int iters, const Enqueue& enqueue) {
  EventTimer timer;
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    DSV4_CUDA_CHECK(cudaMemsetAsync(flush, i & 0xFF, flush_bytes, s));
    timer.start(s);
    enqueue();
    ms.push_back(timer.stop_ms(s));
  }
  return ms;
}

// What enqueue() puts on stream s, captured once as a CUDA graph and replayed by launch().
class CapturedGraph {
 public:
  template <class Enqueue>
  CapturedGraph(cudaStream_t s, const Enqueue& enqueue) {
    DSV4_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    enqueue();
    DSV4_CUDA_CHECK(cudaStreamEndCapture(s, &graph_));
    DSV4_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  ~CapturedGraph() {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;

  void launch(cudaStream_t s) const { DSV4_CUDA_CHECK(cudaGraphLaunch(exec_, s)); }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace dsv4::bench
