// The comm family (src/cuda/comm): the GPU ranks' all-reduce (NCCL) against the CPU sum in rank order, on every
// visible GPU (at least 2; skipped, visibly, otherwise; at most 8). Odd sizes, a V4 row and batches of rows,
// repeated calls on their own results, calls replayed from a CUDA graph, and a rank that never arrives: the
// other ends once the group is aborted.
#include <thread>

#include "gpu.h"

#if DSV4_HAVE_CUDA
#include "cuda/comm/nccl_group.h"
#include "cuda/common/check.h"
#endif

namespace dsv4::test {
namespace {

#if DSV4_HAVE_CUDA
int visible_gpus() {
  int n = 0;
  DSV4_CUDA_CHECK(cudaGetDeviceCount(&n));
  return std::min(n, 8);
}

// One thread a rank, each on its own device and stream, running fn(rank, stream).
template <class Fn>
void on_every_rank(int ranks, const std::vector<cudaStream_t>& streams, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      DSV4_CUDA_CHECK(cudaSetDevice(r));
      fn(r, streams[size_t(r)]);
      DSV4_CUDA_CHECK(cudaStreamSynchronize(streams[size_t(r)]));
    });
  for (auto& t : threads) t.join();
}
#endif

TEST(CudaComm, AllReduceEqualsTheSumInRankOrder) {
  DSV4_REQUIRE_GPUS(2);
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  const int ranks = visible_gpus();
  std::vector<int> devices(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) devices[size_t(r)] = r;
  cuda::NcclGroup group(devices);
  std::vector<cudaStream_t> streams(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    DSV4_CUDA_CHECK(cudaSetDevice(r));
    DSV4_CUDA_CHECK(cudaStreamCreateWithFlags(&streams[size_t(r)], cudaStreamNonBlocking));
  }
  // 1 float; around one and two V4 rows (a batch-1 and batch-2 decode message); batch 8 and 64 rows of V4.
  for (size_t count : {size_t(1), size_t(4095), size_t(4096), size_t(8191), size_t(8192), size_t(8193),
                       size_t(8 * 4096 + 5), size_t(64 * 4096)}) {
    for (int graph = 0; graph < 2; ++graph) {
      std::vector<std::vector<float>> x(static_cast<size_t>(ranks));
      std::vector<float*> dx(static_cast<size_t>(ranks));
      for (int r = 0; r < ranks; ++r) {
        x[size_t(r)] = random_floats(count, rng, -100.0f, 100.0f);
        DSV4_CUDA_CHECK(cudaSetDevice(r));
        DSV4_CUDA_CHECK(cudaMalloc(&dx[size_t(r)], count * sizeof(float)));
      }
      // Three calls, each on the last one's result.
      std::vector<float> want(x[0].size());
      std::vector<std::vector<float>> sums = x;
      for (int call = 0; call < 3; ++call) {
        for (size_t i = 0; i < count; ++i) {
          float s = sums[0][i];
          for (int r = 1; r < ranks; ++r) s += sums[size_t(r)][i];
          want[i] = s;
        }
        for (auto& v : sums) v = want;
      }
      on_every_rank(ranks, streams, [&](int r, cudaStream_t s) {
        DSV4_CUDA_CHECK(cudaMemcpyAsync(dx[size_t(r)], x[size_t(r)].data(), count * sizeof(float),
                                        cudaMemcpyHostToDevice, s));
        if (graph == 0) {
          for (int call = 0; call < 3; ++call) group.all_reduce(r, dx[size_t(r)], count, s);
          return;
        }
        DSV4_CUDA_CHECK(cudaStreamSynchronize(s));  // the upload is not part of the recording
        cudaGraph_t g;
        cudaGraphExec_t exec;
        DSV4_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        group.all_reduce(r, dx[size_t(r)], count, s);
        DSV4_CUDA_CHECK(cudaStreamEndCapture(s, &g));
        DSV4_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
        for (int call = 0; call < 3; ++call) DSV4_CUDA_CHECK(cudaGraphLaunch(exec, s));
        DSV4_CUDA_CHECK(cudaStreamSynchronize(s));
        DSV4_CUDA_CHECK(cudaGraphExecDestroy(exec));
        DSV4_CUDA_CHECK(cudaGraphDestroy(g));
      });
      for (int r = 0; r < ranks; ++r) {
        std::vector<float> got(count);
        DSV4_CUDA_CHECK(cudaSetDevice(r));
        DSV4_CUDA_CHECK(cudaMemcpy(got.data(), dx[size_t(r)], count * sizeof(float), cudaMemcpyDeviceToHost));
        DSV4_CUDA_CHECK(cudaFree(dx[size_t(r)]));
        // NCCL adds in its own order: exact for two ranks.
        if (ranks == 2) {
          for (size_t i = 0; i < count; ++i)
            ASSERT_EQ(got[i], want[i]) << "rank " << r << " element " << i << " of " << count << " graph " << graph;
        } else {
          EXPECT_TRUE(compare(got, want, {1e-3, 1e-5}, "NCCL, rank " + std::to_string(r)));
        }
      }
    }
  }
  for (int r = 0; r < ranks; ++r) {
    DSV4_CUDA_CHECK(cudaSetDevice(r));
    DSV4_CUDA_CHECK(cudaStreamDestroy(streams[size_t(r)]));
  }
#endif
}

TEST(CudaComm, AnAbortedGroupReleasesAWaitingRank) {
  DSV4_REQUIRE_GPUS(2);
#if DSV4_HAVE_CUDA
  cuda::NcclGroup group({0, 1});
  DSV4_CUDA_CHECK(cudaSetDevice(0));
  cudaStream_t s;
  DSV4_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float* x;
  DSV4_CUDA_CHECK(cudaMalloc(&x, 4096 * sizeof(float)));
  group.all_reduce(0, x, 4096, s);  // rank 1 never arrives
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady) << "rank 0 waits for rank 1";
  group.abort();
  DSV4_CUDA_CHECK(cudaStreamSynchronize(s));  // returns: the wait ended
  EXPECT_THROW(group.all_reduce(0, x, 4096, s), Error) << "an aborted group refuses new calls";
  DSV4_CUDA_CHECK(cudaFree(x));
  DSV4_CUDA_CHECK(cudaStreamDestroy(s));
#endif
}

}  // namespace
}  // namespace dsv4::test
