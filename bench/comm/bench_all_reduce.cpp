// The GPU ranks' all-reduce at the message sizes of a decode step ([batch, D] floats, D = 4096: 16 KB at batch
// 1, 1 MB at batch 64) and of prefill: NCCL (ring / tree, as the machine's library picks), launched one by one
// and from a CUDA graph, on every visible GPU. Prints µs per call (rank 0's stream; the ranks wait for each
// other). Issue #25's yardstick: PyTorch's symmetric-memory one-shot all-reduce, 8.3 µs at 8 KB on 2×H100.
//
// Then the all-reduce where the model has it: a sub-block boundary of a decode step (all_reduce of the
// sub-block's rows, hc_post, hc_pre_norm; V4-Flash's hc 4 × D 4096, fn F32) through CudaOps, without the
// all-reduce, with NCCL's, and with the sum inside hc_post_mix over the peer exchange (up to 64 rows). The
// differences are what the reduction costs the step.
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
#include "cuda/cuda_ops.h"

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

// A decode step's sub-block boundary on every rank of a group, as the model calls it: all_reduce of f (or
// none), hc_post into the streams X, hc_pre_norm of X. Inputs are zeros, so that repeated boundaries stay finite.
class Boundaries {
 public:
  Boundaries(std::shared_ptr<cuda::NcclGroup> group, int64_t rows) : rows_(rows) {
    config_.dim = 4096;
    config_.hc_mult = 4;
    config_.hc_sinkhorn_iters = 20;
    config_.hc_eps = 1e-6;
    config_.norm_eps = 1e-6;
    const int64_t D = config_.dim, hc = config_.hc_mult, K = hc * D, M = (2 + hc) * hc;
    fn_.assign(size_t(M * K), 1e-3f);
    w_.fn.dtype = DType::kF32;
    w_.fn.rows = M;
    w_.fn.cols = K;
    w_.fn.row_stride = K * 4;
    w_.fn.data = reinterpret_cast<const uint8_t*>(fn_.data());
    w_.base.assign(size_t(M), 0.5f);
    w_.scale.assign(3, 1.0f);
    gamma_.assign(size_t(D), 1.0f);
    for (int r = 0; r < group->ranks(); ++r) {
      Rank k;
      k.ops = std::make_unique<CudaOps>(config_, r, group, r);
      k.ops->upload(w_.fn);
      k.ops->upload(w_.base);
      k.ops->upload(w_.scale);
      k.ops->upload(gamma_);
      k.f = k.ops->alloc(size_t(rows * D));
      k.X = k.ops->alloc(size_t(rows * hc * D));
      k.post = k.ops->alloc(size_t(rows * hc));
      k.comb = k.ops->alloc(size_t(rows * hc * hc));
      k.x = k.ops->alloc(size_t(rows * D));
      k.xn = k.ops->alloc(size_t(rows * D));
      ranks_.push_back(std::move(k));
    }
  }
  cudaStream_t stream(int r) { return ranks_[size_t(r)].ops->stream(); }
  void run(int r, bool reduce) {
    Rank& k = ranks_[size_t(r)];
    k.ops->bind_thread();
    if (reduce) k.ops->all_reduce(k.f, size_t(rows_ * config_.dim));
    k.ops->hc_post(k.f, k.post, k.comb, rows_, k.X);
    k.ops->hc_pre_norm(k.X, w_, gamma_, rows_, config_.dim, k.x, k.xn, k.post, k.comb);
  }

 private:
  struct Rank {
    std::unique_ptr<CudaOps> ops;
    float *f, *X, *post, *comb, *x, *xn;
  };
  ModelConfig config_;
  int64_t rows_;
  std::vector<float> fn_, gamma_;
  HcWeights w_;
  std::vector<Rank> ranks_;
};

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

    auto with_peers = std::make_shared<cuda::NcclGroup>(devices);
    auto nccl_only = std::make_shared<cuda::NcclGroup>(devices, /*peer_exchange=*/false);
    std::printf("\nA decode step's sub-block boundary (all_reduce, hc_post, hc_pre_norm; hc 4, D 4096), µs per "
                "boundary, one by one / from a graph; peer exchange %s\n\n",
                with_peers->peers() ? "available" : "NOT available (no peer access)");
    std::printf("| rows | no all-reduce | NCCL all-reduce | summed in hc_post_mix |\n|---:|---:|---:|---:|\n");
    for (int64_t rows : {int64_t(1), int64_t(2), int64_t(8), int64_t(64)}) {
      const auto boundary = [&](const std::shared_ptr<cuda::NcclGroup>& group, bool reduce) {
        Boundaries b(group, rows);
        std::vector<cudaStream_t> ops_streams;
        for (int r = 0; r < ranks; ++r) ops_streams.push_back(b.stream(r));
        std::vector<std::thread> warm;  // the first call sizes the ops' workspaces: outside any capture
        for (int r = 0; r < ranks; ++r) warm.emplace_back([&, r] { b.run(r, reduce); });
        for (auto& t : warm) t.join();
        const auto call = [&](int r, float*, size_t, cudaStream_t) { b.run(r, reduce); };
        char v[48];
        std::snprintf(v, sizeof v, "%.1f / %.1f", time_calls(ranks, 0, false, ops_streams, x, call),
                      time_calls(ranks, 0, true, ops_streams, x, call));
        return std::string(v);
      };
      std::printf("| %lld | %s | %s | %s |\n", static_cast<long long>(rows), boundary(nccl_only, false).c_str(),
                  boundary(nccl_only, true).c_str(), boundary(with_peers, true).c_str());
    }
  } catch (const dsv4::Error& e) {
    std::fprintf(stderr, "bench_all_reduce: %s\n", e.what());
    return 1;
  }
  return 0;
}
