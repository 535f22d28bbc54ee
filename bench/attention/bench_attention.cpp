// Decode attention of V4-Flash (64 heads × 512, window 128, one query row) on a CSA layer (window + 512
// selected entries) and an HCA layer (window + every visible entry) at 4K / 32K / 128K context, against the
// HBM floor: bytes of KV actually read / the copy bandwidth (measure_copy_bandwidth, as dsv4 bench: 2 GiB
// D2D, read + write, best of 5). Cold = L2 flushed before every call (decode's real case: 43 layers of KV do not stay
// in L2); hot = back-to-back calls. Also: a sweep of the key-split count, and the lightning indexer at the
// same contexts. Then sparse decode of a batch of sequences (CSA at 32K, each with its own compact FP8 caches,
// as the model stores them) in reference numerics (the fp32 kernel) and fast numerics (the tensor-core kernels;
// the table names the one that ran), against the floor of the bytes it moves and with its TFLOP/s (4 · B · H ·
// keys · d: QKᵀ and P·V).
//
//   bench_attention [--iters N] [--profile]
// --profile: one direct call each of CSA decode attention at 32K, the indexer at 32K and the sparse decode of 64
// sequences in fast numerics in one split, nothing else (for ncu).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/event_timing.h"
#include "core/dtype.h"
#include "cuda/attention/attention.h"
#include "cuda/bandwidth.h"
#include "cuda/common/check.h"
#include "cuda/cuda_ops.h"

namespace {

using namespace dsv4;

constexpr int64_t kHeads = 64, kHeadDim = 512, kWindow = 128, kTopK = 512;
constexpr int64_t kIndexHeads = 64, kIndexDim = 128;

// µs per call of fn(), averaged over `iters` calls.
struct Timing {
  double cold = 0.0;   // CUDA graph of one call, L2 flushed before each (decode's real case)
  double graph = 0.0;  // the same graph replayed back to back (no host launch cost, warm L2)
  double hot = 0.0;    // direct stream launches back to back (warm L2, host launch cost included)
};

template <class Fn>
Timing measure(CudaOps& ops, Fn&& fn, int iters, void* flush, size_t flush_bytes) {
  cudaStream_t s = ops.stream();
  for (int i = 0; i < 3; ++i) fn();  // warm-up: workspaces and one-time kernel attributes settle here
  DSV4_CUDA_CHECK(cudaStreamSynchronize(s));
  const bench::CapturedGraph graph(s, fn);
  Timing r;
  const std::vector<double> cold = bench::flushed_ms(s, flush, flush_bytes, iters, [&] { graph.launch(s); });
  r.cold = 1e3 * std::accumulate(cold.begin(), cold.end(), 0.0) / iters;
  bench::EventTimer timer;
  timer.start(s);
  for (int i = 0; i < iters; ++i) graph.launch(s);
  r.graph = 1e3 * timer.stop_ms(s) / iters;
  timer.start(s);
  for (int i = 0; i < iters; ++i) fn();
  r.hot = 1e3 * timer.stop_ms(s) / iters;
  return r;
}


std::vector<float> random_floats(size_t n, std::mt19937_64& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

float* to_device(CudaOps& ops, const std::vector<float>& h) {
  float* d = ops.alloc(h.size());
  DSV4_CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
  DSV4_CUDA_CHECK(cudaDeviceSynchronize());  // the ops' stream does not wait for the legacy stream
  return d;
}

// Sparse decode of B sequences in one call: CSA at 32K (window 128 + 512 selected of 8192 entries), each
// sequence with its own q, output, selection and compact FP8 caches. q and out as the model hands them over:
// fp32 in reference numerics, bf16 rows in fast numerics. Floor bytes: the selected and window rows (compact
// rows), q and out.
void sparse_decode_batches(CudaOps& ops, const float* sinks, std::mt19937_64& rng, int iters, void* flush,
                           size_t flush_bytes, double copy_gbs, bool profile) {
  const int64_t context = 32768, t = context - 1, entries_n = context / 4, max_batch = 128;
  const std::vector<float> host_ring = random_floats(size_t(kWindow * kHeadDim), rng);
  const std::vector<float> host_entries = random_floats(size_t(entries_n * kHeadDim), rng);
  std::vector<AttentionParams> batch, batch_bf16;
  for (int64_t b = 0; b < max_batch; ++b) {
    AttentionParams p;
    const std::vector<float> q = random_floats(size_t(kHeads * kHeadDim), rng, -2.0f, 2.0f);
    p.q = to_device(ops, q);
    float* ring = ops.alloc_cache(CacheFormat::kFp8Kv, kWindow, kHeadDim);
    ops.write_cache(ring, kWindow, kHeadDim, host_ring.data());
    float* entries = ops.alloc_cache(CacheFormat::kFp8Kv, entries_n, kHeadDim);
    ops.write_cache(entries, entries_n, kHeadDim, host_entries.data());
    std::vector<int32_t> ids(static_cast<size_t>(entries_n));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(size_t(kTopK));
    int32_t* selected = ops.alloc_i32(size_t(kTopK));
    DSV4_CUDA_CHECK(cudaMemcpy(selected, ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    p.window = ring;
    p.ring_slots = kWindow;
    p.window_size = kWindow;
    p.entries = entries;
    p.selected = selected;
    p.top_k = kTopK;
    p.ratio = 4;
    p.sinks = sinks;  // the host address main uploaded
    p.pos0 = t;
    p.n = 1;
    p.heads = kHeads;
    p.head_dim = kHeadDim;
    p.scale = float(1.0 / std::sqrt(double(kHeadDim)));
    p.out = ops.alloc(size_t(kHeads * kHeadDim));
    batch.push_back(p);
    std::vector<uint16_t> q_bits(q.size());
    for (size_t k = 0; k < q.size(); ++k) q_bits[k] = f32_to_bf16(q[k]);
    const Bf16Rows q_rows = ops.alloc_bf16(kHeads, kHeadDim), out_rows = ops.alloc_bf16(kHeads, kHeadDim);
    DSV4_CUDA_CHECK(cudaMemcpy(q_rows.data, q_bits.data(), q_bits.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
    p.q = nullptr;
    p.q_bf16 = q_rows.data;
    p.out = nullptr;
    p.out_bf16 = out_rows.data;
    batch_bf16.push_back(p);
  }
  DSV4_CUDA_CHECK(cudaDeviceSynchronize());
  if (profile) {
    ops.set_numerics(Numerics::kFast);
    cuda::attention_split_kv(ops, std::span<const AttentionParams>(batch_bf16.data(), 64), 1);
    DSV4_CUDA_CHECK(cudaStreamSynchronize(ops.stream()));
    return;
  }
  std::printf("\n| sparse decode, CSA 32K | numerics | kernel | batch | splits | cold µs | floor µs | %% of floor | "
              "TFLOP/s |\n|---|---|---|---|---|---|---|---|---|\n");
  const int64_t keys = kWindow + kTopK;
  std::vector<std::string> sweeps;
  const double row_bytes = double(ops.compact_cache(batch[0].window)->row_bytes);
  for (const Numerics numerics : {Numerics::kReference, Numerics::kFast}) {
    ops.set_numerics(numerics);
    const bool fast = numerics == Numerics::kFast;
    const double io_bytes = 2.0 * kHeads * kHeadDim * (fast ? 2 : sizeof(float));
    for (int64_t b : {1, 8, 64, 128}) {
      std::span<const AttentionParams> some((fast ? batch_bf16 : batch).data(), size_t(b));
      const auto run = [&] { ops.attention(some); };
      const Timing tm = measure(ops, run, std::max(1, iters / 4), flush, flush_bytes);
      const double bytes = double(b) * (double(keys) * row_bytes + io_bytes);
      const double floor_us = bytes / (copy_gbs * 1e3);
      const double tflops = 4.0 * double(b * kHeads * keys * kHeadDim) / (tm.cold * 1e6);
      std::printf("| | %s | %s | %lld | %d | %.2f | %.2f | %.1f%% | %.0f |\n",
                  numerics == Numerics::kFast ? "fast" : "reference", cuda::attention_kernel(ops, some),
                  static_cast<long long>(b),
                  cuda::attention_default_splits(ops, some), tm.cold, floor_us, 100.0 * floor_us / tm.cold, tflops);
      if (numerics != Numerics::kFast) continue;
      std::string sweep = "  fast, batch " + std::to_string(b) + ", cold µs per split count:";
      for (int splits : {1, 2, 3, 4, 5, 8, 10}) {
        const auto run_s = [&] { cuda::attention_split_kv(ops, some, splits); };
        char cell[32];
        std::snprintf(cell, sizeof cell, " %d:%.1f", splits, measure(ops, run_s, std::max(1, iters / 4), flush, flush_bytes).cold);
        sweep += cell;
      }
      sweeps.push_back(sweep);
    }
  }
  for (const std::string& line : sweeps) std::printf("%s\n", line.c_str());
  ops.set_numerics(Numerics::kReference);
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 200;
  bool profile = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) iters = std::max(1, std::atoi(argv[++i]));
    else if (std::strcmp(argv[i], "--profile") == 0) profile = true;
    else {
      std::fprintf(stderr, "usage: bench_attention [--iters N] [--profile]\n");
      return 1;
    }
  }
  try {
    ModelConfig config;
    config.dim = 4096;
    config.rope_dim = 64;
    CudaOps ops(config);
    std::mt19937_64 rng(7);
    const double copy_gbs = profile ? 1.0 : measure_copy_bandwidth() / 1e9;
    const size_t flush_bytes = size_t(512) << 20;  // > 10× the 50 MB L2
    void* flush = nullptr;
    DSV4_CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
    std::printf("# attention decode, %s (%d SMs), copy bandwidth %.0f GB/s (2 GiB D2D, read + write)\n\n",
                ops.props().name, ops.props().multiProcessorCount, copy_gbs);

    const std::vector<float> sinks = random_floats(kHeads, rng);
    ops.upload(sinks);
    const int64_t max_context = 131072;
    float* q = to_device(ops, random_floats(size_t(kHeads * kHeadDim), rng, -2.0f, 2.0f));
    float* ring = to_device(ops, random_floats(size_t(kWindow * kHeadDim), rng));
    float* entries = to_device(ops, random_floats(size_t(max_context / 4 * kHeadDim), rng));
    float* out = ops.alloc(size_t(kHeads * kHeadDim));
    int32_t* selected = ops.alloc_i32(size_t(kTopK));

    if (!profile) {  // the floor of any one-op graph here: a 4-byte memset
      const auto tiny = [&] { DSV4_CUDA_CHECK(cudaMemsetAsync(flush, 0, 4, ops.stream())); };
      const Timing f = measure(ops, tiny, iters, flush, flush_bytes);
      std::printf("one 4-byte memset: cold %.2f µs, graph replay %.2f µs, stream %.2f µs\n\n", f.cold, f.graph,
                  f.hot);
    }
    std::printf("| layer | context | keys | KV bytes | splits | cold µs | cold GB/s | %% of copy BW | graph µs | "
                "stream µs | best splits (cold µs) |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    struct Row {
      const char* layer;
      int64_t context;
    };
    std::vector<std::string> sweeps;
    for (const Row r : {Row{"CSA", 4096}, Row{"CSA", 32768}, Row{"CSA", 131072}, Row{"HCA", 4096},
                        Row{"HCA", 32768}, Row{"HCA", 131072}}) {
      if (profile && (std::strcmp(r.layer, "CSA") != 0 || r.context != 32768)) continue;
      const bool csa = std::strcmp(r.layer, "CSA") == 0;
      const int64_t t = r.context - 1, ratio = csa ? 4 : 128, visible = (t + 1) / ratio;
      if (csa) {  // a spread-out selection, as the indexer's would be
        std::vector<int32_t> ids(static_cast<size_t>(visible));
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        ids.resize(size_t(kTopK));
        DSV4_CUDA_CHECK(cudaMemcpy(selected, ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
        DSV4_CUDA_CHECK(cudaDeviceSynchronize());
      }
      AttentionParams p;
      p.q = q;
      p.window = ring;
      p.ring_slots = kWindow;
      p.window_size = kWindow;
      p.entries = entries;
      p.selected = csa ? selected : nullptr;
      p.top_k = kTopK;
      p.ratio = ratio;
      p.sinks = sinks.data();
      p.pos0 = t;
      p.n = 1;
      p.heads = kHeads;
      p.head_dim = kHeadDim;
      p.scale = float(1.0 / std::sqrt(double(kHeadDim)));
      p.out = out;
      const int64_t keys = cuda::attention_keys(p, t);
      const double kv_bytes = double(keys * kHeadDim) * sizeof(float);
      const int splits = cuda::attention_default_splits(ops, std::span<const AttentionParams>(&p, 1));
      const auto run = [&] { ops.attention(std::span<const AttentionParams>(&p, 1)); };
      if (profile) {
        run();
        DSV4_CUDA_CHECK(cudaStreamSynchronize(ops.stream()));
        continue;
      }
      const Timing tm = measure(ops, run, iters, flush, flush_bytes);
      const double cold = tm.cold;
      std::string sweep = std::string(r.layer) + " " + std::to_string(r.context / 1024) + "K:";
      int best_splits = splits;
      double best = cold;
      for (int s : {1, 4, 8, 16, 24, 33, 40, 48, 66, 80, 100, 132}) {
        const auto run_s = [&] { cuda::attention_split_kv(ops, std::span<const AttentionParams>(&p, 1), s); };
        const double us = measure(ops, run_s, std::max(1, iters / 2), flush, flush_bytes).cold;
        char cell[48];
        std::snprintf(cell, sizeof cell, " %d:%.1f", s, us);
        sweep += cell;
        if (us < best) {
          best = us;
          best_splits = s;
        }
      }
      sweeps.push_back(sweep);
      const double gbs = kv_bytes / (cold * 1e3);
      std::printf("| %s | %lldK | %lld | %.2f MB | %d | %.2f | %.0f | %.1f%% | %.2f | %.2f | %d (%.2f) |\n",
                  r.layer, static_cast<long long>(r.context / 1024), static_cast<long long>(keys), kv_bytes / 1e6,
                  splits, cold, gbs, 100.0 * gbs / copy_gbs, tm.graph, tm.hot, best_splits, best);
    }
    std::printf("\nsplit sweep, cold µs per split count:\n");
    for (const std::string& s : sweeps) std::printf("  %s\n", s.c_str());

    // Lightning indexer, decode: 64 heads × 128 over every visible entry, top 512.
    std::printf("\n| indexer | context | entries | key bytes | cold µs | GB/s | graph µs | stream µs |\n"
                "|---|---|---|---|---|---|---|---|\n");
    float* iq = to_device(ops, random_floats(size_t(kIndexHeads * kIndexDim), rng));
    float* iw = to_device(ops, random_floats(size_t(kIndexHeads), rng, -0.02f, 0.02f));
    float* ikeys = to_device(ops, random_floats(size_t(max_context / 4 * kIndexDim), rng));
    for (int64_t context : {4096, 32768, 131072}) {
      if (profile && context != 32768) continue;
      IndexerParams ip;
      ip.q = iq;
      ip.weights = iw;
      ip.keys = ikeys;
      ip.pos0 = context - 1;
      ip.n = 1;
      ip.heads = kIndexHeads;
      ip.head_dim = kIndexDim;
      ip.ratio = 4;
      ip.top_k = kTopK;
      ip.selected = selected;
      const auto run = [&] { ops.indexer_topk(std::span<const IndexerParams>(&ip, 1)); };
      if (profile) {
        run();
        DSV4_CUDA_CHECK(cudaStreamSynchronize(ops.stream()));
        continue;
      }
      const Timing tm = measure(ops, run, iters, flush, flush_bytes);
      const double bytes = double(context / 4 * kIndexDim) * sizeof(float);
      std::printf("| CSA | %lldK | %lld | %.2f MB | %.2f | %.0f | %.2f | %.2f |\n",
                  static_cast<long long>(context / 1024), static_cast<long long>(context / 4), bytes / 1e6, tm.cold,
                  bytes / (tm.cold * 1e3), tm.graph, tm.hot);
    }
    sparse_decode_batches(ops, sinks.data(), rng, iters, flush, flush_bytes, copy_gbs, profile);
    DSV4_CUDA_CHECK(cudaFree(flush));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_attention: %s\n", e.what());
    return 1;
  }
  return 0;
}
