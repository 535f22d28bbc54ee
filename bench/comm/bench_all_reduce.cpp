// The GPU ranks' all-reduce at the message sizes of a decode step ([batch, D] floats, D = 4096: 16 KB at batch
// 1, 1 MB at batch 64) and of prefill: NCCL (ring / tree, as the machine's library picks), launched one by one
// and from a CUDA graph, on every visible GPU. Prints µs per call (rank 0's stream; the ranks wait for each
// other). Issue #25's yardstick: PyTorch's symmetric-memory one-shot all-reduce, 8.3 µs at 8 KB on 2×H100.
//
//   bench_all_reduce
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/event_timing.h"
#include "cuda/comm/nccl_group.h"
#include "cuda/common/check.h"

namespace {

using namespace dsv4;

constexpr int kCallsPerGraph = 20, kReplays = 20;

// µs per call of `call(rank, x, count, stream)` on every rank: launched one by one (the engine's default), or
// replayed from a graph of kCallsPerGraph calls.
double time_calls(int ranks, size_t count, bool graphs, const std::vector<cudaStream_t>& streams,
                  const std::vector<float*>& x, const std::function<void(int, float*, size_t, cudaStream_t)>& call) {
  std::vector<cudaGraphExec_t> execs(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  double us = 0;
  const auto per_rank = [&](int r) {
    DSV4_CUDA_CHECK(cudaSetDevice(r));
    cudaStream_t s = streams[size_t(r)];
    const auto calls = [&](int n) {
      for (int i = 0; i < n; ++i) call(r, x[size_t(r)], count, s);
    };
    if (graphs) {  // kCallsPerGraph calls recorded once, replayed
      cudaGraph_t g = nullptr;
      DSV4_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      try {
        calls(kCallsPerGraph);
      } catch (...) {  // end the capture: a stream left capturing fails every later call on it
        cudaStreamEndCapture(s, &g);
        if (g) cudaGraphDestroy(g);
        throw;
      }
      DSV4_CUDA_CHECK(cudaStreamEndCapture(s, &g));
      DSV4_CUDA_CHECK(cudaGraphInstantiate(&execs[size_t(r)], g, 0));
      DSV4_CUDA_CHECK(cudaGraphDestroy(g));
    }
    const auto run = [&] {
      if (!graphs) return calls(kReplays * kCallsPerGraph);
      for (int i = 0; i < kReplays; ++i) DSV4_CUDA_CHECK(cudaGraphLaunch(execs[size_t(r)], s));
    };
    run();  // warm-up
    DSV4_CUDA_CHECK(cudaStreamSynchronize(s));
    bench::EventTimer timer;
    timer.start(s);
    run();
    const double ms = timer.stop_ms(s);
    if (r == 0) us = ms * 1e3 / (kReplays * kCallsPerGraph);
    if (graphs) DSV4_CUDA_CHECK(cudaGraphExecDestroy(execs[size_t(r)]));
  };
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        per_rank(r);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < ranks; ++r)
    if (!errors[size_t(r)].empty()) throw Error(cat("rank ", r, ": ", errors[size_t(r)]));
  return us;
}

}  // namespace

int main() {
  try {
    int ranks = 0;
    DSV4_CUDA_CHECK(cudaGetDeviceCount(&ranks));
    ranks = std::min(ranks, 8);
    if (ranks < 2) {
      std::printf("bench_all_reduce: needs 2 GPUs, %d visible\n", ranks);
      return 1;
    }
    std::vector<int> devices(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) devices[size_t(r)] = r;
    cuda::NcclGroup nccl(devices);
    const size_t max_count = size_t(512) * 4096;  // 8 MB: a 512-token prefill chunk
    std::vector<cudaStream_t> streams(static_cast<size_t>(ranks));
    std::vector<float*> x(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) {
      DSV4_CUDA_CHECK(cudaSetDevice(r));
      DSV4_CUDA_CHECK(cudaStreamCreateWithFlags(&streams[size_t(r)], cudaStreamNonBlocking));
      DSV4_CUDA_CHECK(cudaMalloc(&x[size_t(r)], max_count * sizeof(float)));
      DSV4_CUDA_CHECK(cudaMemset(x[size_t(r)], 0, max_count * sizeof(float)));
    }
    std::printf("%d GPUs, NCCL %d; µs per call, launched one by one (the engine's default) and from a CUDA graph\n\n",
                ranks, nccl.version());
    std::printf("| rows of D = 4096 | bytes | NCCL | NCCL, graph |\n"
                "|---:|---:|---:|---:|\n");
    const auto nccl_call = [&](int r, float* p, size_t n, cudaStream_t s) { nccl.all_reduce(r, p, n, s); };
    const auto cell = [&](const std::function<double()>& time) -> std::string {
      try {
        char v[32];
        std::snprintf(v, sizeof v, "%.1f", time());
        return v;
      } catch (const Error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return "fails";
      }
    };
    for (size_t rows : {size_t(1), size_t(2), size_t(8), size_t(16), size_t(64), size_t(512)}) {
      const size_t count = rows * 4096;
      std::printf("| %zu | %zu | %s | %s |\n", rows, count * sizeof(float),
                  cell([&] { return time_calls(ranks, count, false, streams, x, nccl_call); }).c_str(),
                  cell([&] { return time_calls(ranks, count, true, streams, x, nccl_call); }).c_str());
    }
    for (int r = 0; r < ranks; ++r) {
      DSV4_CUDA_CHECK(cudaSetDevice(r));
      DSV4_CUDA_CHECK(cudaFree(x[size_t(r)]));
      DSV4_CUDA_CHECK(cudaStreamDestroy(streams[size_t(r)]));
    }
  } catch (const dsv4::Error& e) {
    std::fprintf(stderr, "bench_all_reduce: %s\n", e.what());
    return 1;
  }
  return 0;
}
