// The comm family (src/cuda/comm): the GPU ranks' all-reduce (NCCL) against the CPU sum in rank order, on every
// visible GPU (at least 2; skipped, visibly, otherwise; at most 8). Odd sizes, a V4 row and batches of rows,
// repeated calls on their own results, calls replayed from a CUDA graph, and a rank that never arrives: the
// other ends once the group is aborted. Then CudaOps' deferred all-reduce of a sub-block's output: summed inside
// hc_post_mix over the peer exchange where its slots hold the rows (V4: 64), by NCCL otherwise, in every case the
// bits one GPU computes from the summed rows; one rank in the exchange against a peer the test plays (what
// compute-sanitizer can run); and an aborted group releases a rank waiting in the exchange.
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "gpu.h"

#if DSV4_HAVE_CUDA
#include "cuda/comm/nccl_group.h"
#include "cuda/common/check.h"
#include "core/dtype.h"
#endif

namespace dsv4::test {
namespace {

#if DSV4_HAVE_CUDA
// Devices 0 .. n−1 of the visible GPUs (at most 8): one rank each.
std::vector<int> visible_gpus() {
  int n = 0;
  DSV4_CUDA_CHECK(cudaGetDeviceCount(&n));
  std::vector<int> devices(static_cast<size_t>(std::min(n, 8)));
  for (size_t r = 0; r < devices.size(); ++r) devices[r] = int(r);
  return devices;
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
  const std::vector<int> devices = visible_gpus();
  const int ranks = int(devices.size());
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

#if DSV4_HAVE_CUDA
// A sub-block boundary's constant inputs: hc_pre_norm's weights (fn F32, entries ~ 1/sqrt(hc·D)) and gain.
struct Boundary {
  ModelConfig config;
  std::vector<float> fn_data;
  HcWeights w;
  std::vector<float> gamma;
};
Boundary boundary(int64_t hc, int64_t dim, std::mt19937_64& rng) {
  Boundary b;
  b.config.dim = dim;
  b.config.hc_mult = hc;
  b.config.hc_sinkhorn_iters = 20;
  b.config.hc_eps = 1e-6;
  b.config.norm_eps = 1e-6;
  const int64_t K = hc * dim, M = (2 + hc) * hc;
  b.fn_data = random_floats(size_t(M * K), rng, -std::sqrt(3.0f / float(K)), std::sqrt(3.0f / float(K)));
  b.w.fn.dtype = DType::kF32;
  b.w.fn.rows = M;
  b.w.fn.cols = K;
  b.w.fn.row_stride = K * 4;
  b.w.fn.data = reinterpret_cast<const uint8_t*>(b.fn_data.data());
  b.w.base = random_floats(size_t(M), rng);
  b.w.scale = random_floats(3, rng, 0.5f, 2.0f);
  b.gamma = random_floats(size_t(dim), rng, 0.5f, 1.5f);
  return b;
}

void upload(CudaOps& ops, const Boundary& b) {
  ops.upload(b.w.fn);
  ops.upload(b.w.base);
  ops.upload(b.w.scale);
  ops.upload(b.gamma);
  settle();
}

// How a step's all-reduce reaches its consumer: hc_post then hc_pre_norm on the same streams (the model's order:
// fused, the exchange where its slots hold the rows), hc_post then a read of the streams (hc_post's own kernel,
// NCCL first), or a read of the rows themselves (NCCL).
enum class Consumer { kPreNorm, kPost, kRead };

// One step's outputs, as read back: the rows (kRead) or the streams X and hc_pre_norm's x, xn, post, comb.
struct StepOutputs {
  std::vector<float> f, X, x, xn, post, comb;
};

struct StepInputs {
  int64_t n;
  Consumer consumer;
  std::vector<std::vector<float>> shares;  // a rank's f
  std::vector<float> X, post, comb;        // the same on every rank, as in the model
};

// Runs a step on `ops` with rows f (a rank's share, all_reduce'd first where `reduce`).
StepOutputs run_step(CudaOps& ops, const Boundary& b, const StepInputs& in, const std::vector<float>& f, bool reduce) {
  const int64_t n = in.n, D = b.config.dim, hc = b.config.hc_mult;
  float* df = to_device(ops, f);
  float* dX = to_device(ops, in.X);
  float* dpost = to_device(ops, in.post);
  float* dcomb = to_device(ops, in.comb);
  float* dx = poisoned(ops, size_t(n * D));
  float* dxn = poisoned(ops, size_t(n * D));
  if (reduce) ops.all_reduce(df, size_t(n * D));
  StepOutputs out;
  if (in.consumer == Consumer::kRead) {
    out.f = to_host(ops, df, f.size());
    return out;
  }
  ops.hc_post(df, dpost, dcomb, n, dX);
  if (in.consumer == Consumer::kPreNorm) {
    ops.hc_pre_norm(dX, b.w, b.gamma, n, D, dx, dxn, dpost, dcomb);
    out.x = to_host(ops, dx, size_t(n * D));
    out.xn = to_host(ops, dxn, size_t(n * D));
    out.post = to_host(ops, dpost, size_t(n * hc));
    out.comb = to_host(ops, dcomb, size_t(n * hc * hc));
  }
  out.X = to_host(ops, dX, in.X.size());
  return out;
}

::testing::AssertionResult same_bits(const std::vector<float>& got, const std::vector<float>& want,
                                     const std::string& what) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": " << got.size() << " values, want " << want.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], 4) != 0)
      return ::testing::AssertionFailure() << what << "[" << i << "] " << got[i] << ", want " << want[i];
  return ::testing::AssertionSuccess();
}

template <class T>
std::vector<T> read_device(const T* p, size_t n) {
  std::vector<T> host(n);
  DSV4_CUDA_CHECK(cudaMemcpy(host.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

// Rank r's count of exchange calls, per slot (PeerSlots::calls).
std::vector<unsigned> exchange_calls(const cuda::NcclGroup& group, int r) {
  return read_device(group.peers()->slots(r).calls, cuda::kPeerSlots);
}

// Aborts the group unless disarmed within `seconds`: a test whose rank would wait forever ends, and fails.
class Watchdog {
 public:
  Watchdog(cuda::NcclGroup& group, int seconds)
      : thread_([this, &group, seconds] {
          std::unique_lock<std::mutex> lock(mutex_);
          if (!done_.wait_for(lock, std::chrono::seconds(seconds), [this] { return disarmed_; })) {
            fired_ = true;
            group.abort();
          }
        }) {}
  ~Watchdog() { disarm(); }
  bool disarm() {  // whether it had fired
    {
      std::lock_guard<std::mutex> lock(mutex_);
      disarmed_ = true;
    }
    done_.notify_all();
    if (thread_.joinable()) thread_.join();
    return fired_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  bool disarmed_ = false, fired_ = false;
  std::thread thread_;
};
#endif

// Every rank runs the model's sub-block boundary on its share of the rows: all_reduce, hc_post, hc_pre_norm (or
// a read). The outputs must be, bit for bit, what one GPU computes from the rows summed in rank order — on every
// rank: the ranks' streams stay identical. Where the GPUs reach each other and the exchange's slots hold the rows
// (128-column slices × rows ≤ kPeerSlots: 64 rows at dim 4096), hc_post_mix sums the shares itself — up to 8 rows
// its one-row blocks, 9, 20 and 64 the tiled kernel; 70 rows at dim 4096 take NCCL and the tiled kernel; the
// other consumers flush to NCCL.
// Steps of mixed sizes repeat, so the slots' call counts advance through grids of different sizes; dim 260 leaves
// a partial 128-column slice.
// NCCL's own order is exact for two ranks; beyond two, its paths are held to 1e-5 relative instead.
TEST(CudaComm, ReducedSubBlockOutputMatchesOneGpu) {
  DSV4_REQUIRE_GPUS(2);
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  const std::vector<int> devices = visible_gpus();
  const int ranks = int(devices.size());
  const std::pair<int64_t, int64_t> shapes[] = {{4, 4096}, {2, 260}};  // (hc, dim)
  for (const auto& [hc, dim] : shapes) {
    const Boundary b = boundary(hc, dim, rng);
    auto group = std::make_shared<cuda::NcclGroup>(devices);
    if (cuda::PeerExchange::possible(devices)) {
      ASSERT_NE(group->peers(), nullptr) << "peer access, and no exchange";
    }
    std::vector<std::unique_ptr<CudaOps>> ops;
    for (int r = 0; r < ranks; ++r) {
      ops.push_back(std::make_unique<CudaOps>(b.config, r, group, r));
      upload(*ops.back(), b);
    }
    DSV4_CUDA_CHECK(cudaSetDevice(0));
    CudaOps one(b.config, 0);
    upload(one, b);
    std::vector<StepInputs> steps;
    for (int64_t n : {1, 3, 8, 1, 9, 2, 8, 20, 64, 1, 70})
      for (Consumer consumer : {Consumer::kPreNorm, Consumer::kPreNorm, Consumer::kPost, Consumer::kRead}) {
        StepInputs s{n, consumer, {}, random_floats(size_t(n * hc * dim), rng),
                     random_floats(size_t(n * hc), rng, 0.0f, 2.0f), random_floats(size_t(n * hc * hc), rng)};
        for (int r = 0; r < ranks; ++r) s.shares.push_back(random_floats(size_t(n * dim), rng, -4.0f, 4.0f));
        steps.push_back(std::move(s));
      }
    std::vector<std::vector<StepOutputs>> got(static_cast<size_t>(ranks));
    std::vector<std::string> errors(static_cast<size_t>(ranks));
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
      threads.emplace_back([&, r] {
        try {
          ops[size_t(r)]->bind_thread();
          for (const StepInputs& s : steps)
            got[size_t(r)].push_back(run_step(*ops[size_t(r)], b, s, s.shares[size_t(r)], true));
        } catch (const std::exception& e) {
          errors[size_t(r)] = e.what();
          group->abort();
        }
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < ranks; ++r) ASSERT_EQ(errors[size_t(r)], "") << "rank " << r;
    if (group->peers()) {
      // Which path ran: every rank's count of exchange calls per block slot is the fused steps within the slots whose
      // grid (128-column slices × rows) reaches that slot.
      std::vector<unsigned> want(cuda::kPeerSlots, 0);
      for (const StepInputs& s : steps)
        if (s.consumer == Consumer::kPreNorm && (dim + 127) / 128 * s.n <= cuda::kPeerSlots)
          for (int64_t slot = 0; slot < (dim + 127) / 128 * s.n; ++slot) ++want[size_t(slot)];
      for (int r = 0; r < ranks; ++r)
        EXPECT_EQ(exchange_calls(*group, r), want) << "rank " << r << "'s exchange calls per slot, dim " << dim;
    }
    one.bind_thread();
    for (size_t i = 0; i < steps.size(); ++i) {
      const StepInputs& s = steps[i];
      std::vector<float> sum = s.shares[0];
      for (int r = 1; r < ranks; ++r)
        for (size_t k = 0; k < sum.size(); ++k) sum[k] += s.shares[size_t(r)][k];
      const StepOutputs want = run_step(one, b, s, sum, false);
      const bool exchanged =
          group->peers() && s.consumer == Consumer::kPreNorm && (dim + 127) / 128 * s.n <= cuda::kPeerSlots;
      const bool exact = exchanged || ranks == 2;
      for (int r = 0; r < ranks; ++r) {
        const std::string what = cat("hc ", hc, " dim ", dim, " step ", i, " n ", s.n, " consumer ", int(s.consumer),
                                     exchanged ? " (exchange)" : " (NCCL)", " rank ", r);
        const StepOutputs& g = got[size_t(r)][i];
        const auto check = [&](const std::vector<float>& a, const std::vector<float>& w, const char* name) {
          if (exact) {
            EXPECT_TRUE(same_bits(a, w, cat(name, " ", what)));
          } else {
            EXPECT_TRUE(compare(a, w, Tolerance{1e-5, 1e-5}, cat(name, " ", what)));
          }
        };
        check(g.f, want.f, "f");
        check(g.X, want.X, "X");
        check(g.x, want.x, "x");
        check(g.xn, want.xn, "xn");
        check(g.post, want.post, "post");
        check(g.comb, want.comb, "comb");
      }
    }
  }
#endif
}

// Rank 0 runs the exchange alone against a peer the test plays: before each call, rank 1's packets (its share's
// slices, each value beside this call's flag) are already in rank 0's inbox, so hc_post_mix waits for nothing.
// This is how compute-sanitizer, which runs one kernel at a time, checks the exchange kernel (tools/gpu-check
// --sanitize). Checks the packets rank 0 leaves in rank 1's inbox (its share's values, the flag), rank 0's count of
// calls per slot, and the outputs' bits against one GPU's from the summed rows, over calls of 1, 8, 3, 20 (the
// tiled kernel) and 2 rows (the slots' counts advance unevenly, both parities of the inbox are used) and a partial
// last slice (dim 260).
TEST(CudaComm, OneRankRunsTheExchangeAgainstAScriptedPeer) {
  DSV4_REQUIRE_GPUS(2);
#if DSV4_HAVE_CUDA
  if (!cuda::PeerExchange::possible({0, 1})) GTEST_SKIP() << "GPUs 0 and 1 cannot reach each other's memory";
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  const std::pair<int64_t, int64_t> shapes[] = {{4, 4096}, {2, 260}};  // (hc, dim)
  for (const auto& [hc, dim] : shapes) {
    const Boundary b = boundary(hc, dim, rng);
    auto group = std::make_shared<cuda::NcclGroup>(std::vector<int>{0, 1});
    ASSERT_NE(group->peers(), nullptr);
    const cuda::PeerSlots mine = group->peers()->slots(0);
    DSV4_CUDA_CHECK(cudaSetDevice(0));
    CudaOps ops(b.config, 0, group, 0);
    upload(ops, b);
    CudaOps one(b.config, 0);
    upload(one, b);
    const size_t words = size_t(cuda::peer_inbox_word(2, 0, 2, 0, 0, 0));
    const int64_t chunks = (dim + 127) / 128;
    // Lane `lane`'s packet of slot (t, chunk) for a share [n, dim] under `flag`: its two 16-byte words.
    const auto packet = [&](const std::vector<float>& share, int64_t slot, int lane, unsigned flag, uint4* w) {
      const int64_t t = slot / chunks, col = slot % chunks * 128 + 4 * lane;
      uint32_t v[4];
      std::memcpy(v, &share[size_t(t * dim + col)], sizeof(v));
      w[0] = make_uint4(v[0], flag, v[1], flag);
      w[1] = make_uint4(v[2], flag, v[3], flag);
    };
    std::vector<unsigned> calls(cuda::kPeerSlots, 0);
    for (int64_t n : {1, 8, 3, 20, 2}) {
      const std::string what = cat("hc ", hc, " dim ", dim, " n ", n);
      StepInputs in{n, Consumer::kPreNorm, {}, random_floats(size_t(n * hc * dim), rng),
                    random_floats(size_t(n * hc), rng, 0.0f, 2.0f), random_floats(size_t(n * hc * hc), rng)};
      for (int r = 0; r < 2; ++r) in.shares.push_back(random_floats(size_t(n * dim), rng, -4.0f, 4.0f));
      // Rank 1's side: its packets for this call in rank 0's inbox (the lanes whose columns lie inside dim).
      std::vector<uint4> inbox = read_device(mine.inbox[0], words);
      const int64_t slots = chunks * n;
      for (int64_t slot = 0; slot < slots; ++slot) {
        const unsigned call = ++calls[size_t(slot)];
        for (int lane = 0; lane < cuda::kPeerLanes; ++lane)
          if (slot % chunks * 128 + 4 * lane < dim)
            packet(in.shares[1], slot, lane, call,
                   &inbox[size_t(cuda::peer_inbox_word(int(call & 1), int(slot), 2, 1, lane, 0))]);
      }
      DSV4_CUDA_CHECK(cudaMemcpy(mine.inbox[0], inbox.data(), words * sizeof(uint4), cudaMemcpyHostToDevice));

      ops.bind_thread();
      Watchdog watchdog(*group, 600);  // compute-sanitizer's pace; a rank that waits for rank 1 fails here
      const StepOutputs got = run_step(ops, b, in, in.shares[0], true);
      ASSERT_FALSE(watchdog.disarm()) << what << ": rank 0 waited for the scripted peer";
      std::vector<float> sum = in.shares[0];
      for (size_t k = 0; k < sum.size(); ++k) sum[k] += in.shares[1][k];
      one.bind_thread();
      const StepOutputs want = run_step(one, b, in, sum, false);
      EXPECT_TRUE(same_bits(got.X, want.X, "X " + what));
      EXPECT_TRUE(same_bits(got.x, want.x, "x " + what));
      EXPECT_TRUE(same_bits(got.xn, want.xn, "xn " + what));
      EXPECT_TRUE(same_bits(got.post, want.post, "post " + what));
      EXPECT_TRUE(same_bits(got.comb, want.comb, "comb " + what));

      // What rank 0 left in rank 1's inbox, and its own counts.
      EXPECT_EQ(exchange_calls(*group, 0), calls) << what;
      const std::vector<uint4> inbox1 = read_device(mine.inbox[1], words);
      for (int64_t slot = 0; slot < slots; ++slot)
        for (int lane = 0; lane < cuda::kPeerLanes; ++lane) {
          if (slot % chunks * 128 + 4 * lane >= dim) continue;
          const unsigned call = calls[size_t(slot)];
          uint4 w[2];
          packet(in.shares[0], slot, lane, call, w);
          const int64_t i = cuda::peer_inbox_word(int(call & 1), int(slot), 2, 0, lane, 0);
          ASSERT_EQ(std::memcmp(&inbox1[size_t(i)], w, sizeof(w)), 0) << what << " slot " << slot << " lane " << lane;
        }
    }
  }
#endif
}

// A rank waiting in hc_post_mix's exchange for a rank that never comes ends once the group is aborted.
TEST(CudaComm, AnAbortedGroupReleasesARankInTheExchange) {
  DSV4_REQUIRE_GPUS(2);
#if DSV4_HAVE_CUDA
  if (!cuda::PeerExchange::possible({0, 1})) GTEST_SKIP() << "GPUs 0 and 1 cannot reach each other's memory";
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  const Boundary b = boundary(4, 4096, rng);
  auto group = std::make_shared<cuda::NcclGroup>(std::vector<int>{0, 1});
  ASSERT_NE(group->peers(), nullptr);
  CudaOps ops(b.config, 0, group, 0);
  upload(ops, b);
  const int64_t n = 1, D = b.config.dim, hc = b.config.hc_mult;
  float* f = to_device(ops, random_floats(size_t(n * D), rng));
  float* X = to_device(ops, random_floats(size_t(n * hc * D), rng));
  float* post = to_device(ops, random_floats(size_t(n * hc), rng));
  float* comb = to_device(ops, random_floats(size_t(n * hc * hc), rng));
  float* x = ops.alloc(size_t(n * D));
  float* xn = ops.alloc(size_t(n * D));
  settle();
  ops.all_reduce(f, size_t(n * D));  // rank 1 never arrives
  ops.hc_post(f, post, comb, n, X);
  ops.hc_pre_norm(X, b.w, b.gamma, n, D, x, xn, post, comb);
  cudaStream_t s = ops.stream();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady) << "rank 0 waits for rank 1";
  group->abort();
  DSV4_CUDA_CHECK(cudaStreamSynchronize(s));  // returns: the wait ended
  EXPECT_THROW(ops.all_reduce(f, size_t(n * D)), Error) << "an aborted group refuses new calls";
#endif
}

}  // namespace
}  // namespace dsv4::test
