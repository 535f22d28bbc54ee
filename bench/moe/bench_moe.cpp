// bench_moe: the V4-Flash MoE layer in fast numerics (D 4096, 256 FP4 experts of width 2048, top-6, FP8 shared expert, BF16
// gate) on the CUDA backend, decode steps of n tokens. Reports µs per CudaOps::moe call (L2 flushed before
// each), the weight bytes the step must read (distinct selected experts × w1, w3, w2 with their scales, plus
// the shared expert and the gate), the achieved GB/s and its share of the copy bandwidth measured in the same
// process (measure_copy_bandwidth, as dsv4 bench: 2 GiB device to device, read + write, best of 5).
//
// Also: the call replayed as a one-call CUDA graph (no host launch cost between the kernels, as in a decode
// step whose launches run ahead under PDL; flushed likewise), the same call back to back without the flush (L2 warm where it fits) and
// the host time per call.
//
// Each n runs on the item kernels (the shared expert on them too: "items"; or alone on the grouped GEMMs:
// "items + shared grouped") and on the grouped FP8 GEMM path (experts_grouped.cu): "grouped" with its default
// routed tiles (and wgmma where grouped_takes_wgmma: experts_wgmma.cu), "grouped, tiles of 64" with routed tiles of
// kGroupedTokens pairs on wgmma at every n, the same two on mma.sync alone ("..., mma.sync"), and "grouped, decode
// tiles" with routed tiles of kGroupedDecodeTokens pairs on wgmma at every n, and "grouped, wide tiles" with routed
// tiles of kGroupedWideTokens (experts_wide.cu) from one pair an expert on average; each forced (moe_grouped.h), for
// the crossovers. --paths picks some of them (a comma list of their numbers 0..7 in that order). The grouped rows
// also give the FLOP floor: 2 × (n·k + n) pairs × 3 × D × I at the dense FP8 peak of an H100 SXM (1979 TFLOP/s).
//
// --inter N gives the experts width N instead (a rank's slice under tensor parallelism: 1024 at --tp 2, 512
// at --tp 4), shared expert included. --ep R runs the layer as rank r (--rank, default 0) of R expert-parallel
// ranks: routed experts [r·E/R, (r+1)·E/R), and the shared expert on rank 0 only (model/parallel.h); the byte
// count takes only those.
//
//   bench_moe [--inter N] [--ep R [--rank r]] [--paths 0,1,2,3,4,5,6,7] [iterations=50] [n ...=1 8 64]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/event_timing.h"
#include "core/dtype.h"
#include "core/random.h"
#include "cuda/bandwidth.h"
#include "cuda/common/check.h"
#include "cuda/cuda_ops.h"
#include "cuda/moe/moe_grouped.h"

namespace {

using namespace dsv4;


// Random matrices in checkpoint layouts; storage owned by the bench.
struct Storage {
  std::vector<std::unique_ptr<std::vector<uint8_t>>> blobs;
  SplitMix64 rng{12345};
  uint8_t* blob(size_t n) {
    blobs.push_back(std::make_unique<std::vector<uint8_t>>(n));
    rng.fill(blobs.back()->data(), n);
    return blobs.back()->data();
  }
  Weight fp4(int64_t rows, int64_t cols) {
    Weight w;
    w.dtype = DType::kI8;
    w.rows = rows;
    w.cols = cols;
    w.data = blob(size_t(rows * cols / 2));
    w.row_stride = cols / 2;
    uint8_t* s = blob(size_t(rows * cols / 32));
    for (int64_t i = 0; i < rows * cols / 32; ++i) s[i] = uint8_t(120 + s[i] % 3);
    w.scale = s;
    w.scale_dtype = DType::kF8E8M0;
    w.scale_block_rows = 1;
    w.scale_block_cols = 32;
    w.scale_stride = cols / 32;
    return w;
  }
  Weight fp8(int64_t rows, int64_t cols) {
    Weight w;
    w.dtype = DType::kF8E4M3;
    w.rows = rows;
    w.cols = cols;
    uint8_t* d = blob(size_t(rows * cols));
    for (int64_t i = 0; i < rows * cols; ++i)
      if ((d[i] & 0x7F) == 0x7F) d[i] ^= 1;
    w.data = d;
    w.row_stride = cols;
    const int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
    uint8_t* s = blob(size_t(sr * sc));
    for (int64_t i = 0; i < sr * sc; ++i) s[i] = uint8_t(117 + s[i] % 3);
    w.scale = s;
    w.scale_dtype = DType::kF8E8M0;
    w.scale_block_rows = w.scale_block_cols = 128;
    w.scale_stride = sc;
    return w;
  }
  Weight bf16(int64_t rows, int64_t cols) {
    Weight w;
    w.dtype = DType::kBF16;
    w.rows = rows;
    w.cols = cols;
    auto* d = reinterpret_cast<uint16_t*>(blob(size_t(rows * cols * 2)));
    for (int64_t i = 0; i < rows * cols; ++i) d[i] = f32_to_bf16(float(int(d[i] % 2001) - 1000) * 3e-5f);
    w.data = reinterpret_cast<const uint8_t*>(d);
    w.row_stride = cols * 2;
    return w;
  }
};

size_t weight_bytes(const Weight& w) {
  size_t b = size_t(w.rows * w.row_stride);
  if (w.dtype == DType::kI8) b += size_t(w.rows * (w.cols / 32));
  if (w.dtype == DType::kF8E4M3) b += size_t(((w.rows + 127) / 128) * ((w.cols + 127) / 128)) * 4;  // f32 on device
  return b;
}

// The experts in [e0, e1) the step selects (host replica of the router: same formula, fp32), for the byte count.
size_t distinct_experts(const MoeWeights& w, const std::vector<float>& x, int64_t n, int64_t D, int64_t E, int64_t k,
                        int64_t e0, int64_t e1) {
  std::set<int> chosen;
  std::vector<float> biased(static_cast<size_t>(E));
  std::vector<int> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      float z = 0;
      for (int64_t i = 0; i < D; ++i) {
        uint16_t b;
        std::memcpy(&b, w.gate.data + e * w.gate.row_stride + 2 * i, 2);
        z += bf16_to_f32(b) * x[size_t(t * D + i)];
      }
      biased[size_t(e)] = std::sqrt(z > 20 ? z : std::log1p(std::exp(z))) + w.gate_bias[size_t(e)];
    }
    for (int e = 0; e < int(E); ++e) order[size_t(e)] = e;
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int a, int b) { return biased[size_t(a)] > biased[size_t(b)]; });
    for (int64_t j = 0; j < k; ++j)
      if (order[size_t(j)] >= e0 && order[size_t(j)] < e1) chosen.insert(order[size_t(j)]);
  }
  return chosen.size();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t inter = 2048, ranks = 1, rank = 0;
  constexpr int kPaths = 8;
  bool run_path[kPaths] = {true, true, true, true, true, true, true, true};
  int first = 1;
  for (; first + 1 < argc && std::strncmp(argv[first], "--", 2) == 0; first += 2) {
    const std::string name = argv[first];
    const int64_t v = std::atoll(argv[first + 1]);
    if (name == "--inter") {
      inter = v;
    } else if (name == "--ep") {
      ranks = v;
    } else if (name == "--rank") {
      rank = v;
    } else if (name == "--paths") {
      std::fill(std::begin(run_path), std::end(run_path), false);
      for (const char* c = argv[first + 1]; *c; ++c) {
        if (*c == ',') continue;
        if (*c < '0' || *c >= '0' + kPaths) {
          std::fprintf(stderr, "bench_moe: --paths takes path numbers 0..%d, got %s\n", kPaths - 1, argv[first + 1]);
          return 1;
        }
        run_path[*c - '0'] = true;
      }
    } else {
      std::fprintf(stderr, "bench_moe: unknown option %s\n", argv[first]);
      return 1;
    }
  }
  if (inter < 128 || inter % 128 != 0 || ranks < 1 || 256 % ranks != 0 || rank < 0 || rank >= ranks) {
    std::fprintf(stderr, "bench_moe: --inter %lld must be a multiple of 128, --ep %lld divide 256, --rank %lld lie "
                 "below --ep\n", (long long)inter, (long long)ranks, (long long)rank);
    return 1;
  }
  const int iterations = argc > first ? std::max(1, std::atoi(argv[first])) : 50;
  std::vector<int64_t> steps;
  for (int i = first + 1; i < argc; ++i) steps.push_back(std::max(1, std::atoi(argv[i])));
  if (steps.empty()) steps = {1, 8, 64};
  try {
    ModelConfig c;
    c.dim = 4096;
    c.moe_inter_dim = inter;
    c.n_routed_experts = 256;
    c.n_experts_per_tok = 6;
    c.swiglu_limit = 10.0;
    c.routed_scaling_factor = 1.5;
    const int64_t D = c.dim, I = c.moe_inter_dim, E = c.n_routed_experts, k = c.n_experts_per_tok;
    const int64_t e0 = rank * E / ranks, e1 = (rank + 1) * E / ranks;  // this rank's experts

    std::fprintf(stderr, "building %lld FP4 experts...\n", (long long)(e1 - e0));
    Storage st;
    MoeWeights w;
    w.gate = st.bf16(E, D);
    w.experts.resize(size_t(E));
    for (int64_t i = e0; i < e1; ++i) {
      ExpertWeights& e = w.experts[size_t(i)];
      e.w1 = st.fp4(I, D);
      e.w3 = st.fp4(I, D);
      e.w2 = st.fp4(D, I);
    }
    if (rank == 0) w.shared = {st.fp8(I, D), st.fp8(I, D), st.fp8(D, I)};
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> bias_dist(-0.05f, 0.05f), x_dist(-1.0f, 1.0f);
    w.gate_bias.resize(size_t(E));
    for (float& b : w.gate_bias) b = bias_dist(rng);

    CudaOps ops(c);
    ops.set_numerics(Numerics::kFast);  // the CUDA default of dsv4; the grouped path needs it
    std::fprintf(stderr, "uploading...\n");
    ops.upload(w.gate);
    for (int64_t i = e0; i < e1; ++i) {
      const ExpertWeights& e = w.experts[size_t(i)];
      ops.upload(e.w1);
      ops.upload(e.w3);
      ops.upload(e.w2);
    }
    if (rank == 0) {
      ops.upload(w.shared.w1);
      ops.upload(w.shared.w3);
      ops.upload(w.shared.w2);
    }
    ops.upload(w.gate_bias);
    cudaStream_t s = ops.stream();

    // Yardstick: the copy bandwidth dsv4 bench measures (read + write, 2 GiB device to device).
    const double copy_gbs = measure_copy_bandwidth() / 1e9;
    void* flush = nullptr;
    const size_t flush_bytes = size_t(256) << 20;  // several times the L2
    DSV4_CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
    bench::EventTimer timer;

    const size_t shared_bytes =
        rank == 0 ? weight_bytes(w.shared.w1) + weight_bytes(w.shared.w3) + weight_bytes(w.shared.w2) : 0;
    const size_t expert_bytes = weight_bytes(w.experts[size_t(e0)].w1) * 2 + weight_bytes(w.experts[size_t(e0)].w2);
    const size_t gate_bytes = weight_bytes(w.gate);

    std::printf("## V4-Flash MoE decode (experts of width %lld, %lld of %lld on this rank%s) on %s (%d SMs), copy "
                "bandwidth %.0f GB/s (2 GiB D2D, read + write)\n\n",
                (long long)I, (long long)(e1 - e0), (long long)E, rank == 0 ? " and the shared one" : "",
                ops.props().name, ops.props().multiProcessorCount, copy_gbs);
    std::printf("| n | path | µs (median of %d) | distinct experts | MB read | GB/s | %% of copy | µs in a graph | %% of copy "
                "in a graph | µs back to back | host µs | TFLOP/s | FLOP floor µs (1979 TFLOP/s) | × floor |\n", iterations);
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    static const char* const kPathNames[kPaths] = {"items", "items + shared grouped", "grouped",
                                                   "grouped, tiles of 64", "grouped, tiles of 64, mma.sync",
                                                   "grouped, mma.sync", "grouped, decode tiles", "grouped, wide tiles"};
    for (int64_t n : steps)
    for (int path = 0; path < kPaths; ++path) {
      static std::vector<float> x;  // the same step on every path
      static size_t experts = 0;
      if (path == 0) {
        x.resize(size_t(n * D));
        for (float& v : x) v = x_dist(rng);
        experts = distinct_experts(w, x, n, D, E, k, e0, e1);
      }
      if (!run_path[path]) continue;
      constexpr int64_t kNever = int64_t(1) << 40;
      cuda::moe::set_grouped_min_tokens(path >= 2 ? 1 : kNever);
      cuda::moe::set_shared_grouped_min_tokens(path == 1 ? 1 : kNever);
      cuda::moe::set_grouped_small_tile_max_pairs(path == 3 || path == 4 ? 0 : -1);
      cuda::moe::set_grouped_decode_tile_max_pairs(path == 6 ? kNever : path == 3 ? 0 : -1);
      cuda::moe::set_grouped_wgmma(path < 4 || path >= 6);
      cuda::moe::set_grouped_wgmma_min_pairs(path == 3 ? 1 : 0);
      cuda::moe::set_grouped_wide_tile_min_pairs(path == 7 ? 1 : path == 2 ? -1 : 0);
      float* dx = ops.alloc(x.size());
      float* dout = ops.alloc(x.size());
      DSV4_CUDA_CHECK(cudaStreamSynchronize(s));
      DSV4_CUDA_CHECK(cudaMemcpy(dx, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
      for (int i = 0; i < 3; ++i) ops.moe(w, dx, nullptr, n, dout);
      const auto call = [&] { ops.moe(w, dx, nullptr, n, dout); };
      const double us = bench::median(bench::flushed_ms(s, flush, flush_bytes, iterations, call)) * 1e3;
      const bench::CapturedGraph graph(s, call);
      const double graph_us =
          bench::median(bench::flushed_ms(s, flush, flush_bytes, iterations, [&] { graph.launch(s); })) * 1e3;
      // Back to back: `iterations` calls between two events; the host time is the enqueue cost per call.
      DSV4_CUDA_CHECK(cudaStreamSynchronize(s));
      const auto t0 = std::chrono::steady_clock::now();
      timer.start(s);
      for (int i = 0; i < iterations; ++i) call();
      const double host_us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iterations;
      const double chain_ms = timer.stop_ms(s);
      const double bytes = double(experts * expert_bytes + shared_bytes + gate_bytes);
      const double gbs = bytes / (us * 1e-6) / 1e9;
      const double graph_gbs = bytes / (graph_us * 1e-6) / 1e9;
      const double flop = 2.0 * double(n * k + n) * 3.0 * double(D) * double(I);
      const double floor_us = flop / 1979e12 * 1e6;
      std::printf("| %lld | %s | %.1f | %zu | %.1f | %.0f | %.0f%% | %.1f | %.0f%% | %.1f | %.1f | %.1f | %.1f | %.1f |\n",
                  (long long)n, kPathNames[path], us, experts, bytes / 1e6, gbs, 100.0 * gbs / copy_gbs,
                  graph_us, 100.0 * graph_gbs / copy_gbs, chain_ms * 1e3 / iterations, host_us, flop / (us * 1e-6) / 1e12,
                  floor_us, us / floor_us);
      std::fflush(stdout);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_moe: %s\n", e.what());
    return 1;
  }
}
