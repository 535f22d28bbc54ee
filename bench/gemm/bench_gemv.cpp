// Decode GEMV bandwidth: cuda::gemv on the V4-Flash decode shapes at n = 1 and 8, against the device's
// copy bandwidth (measure_copy_bandwidth, as dsv4 bench: 2 GiB D2D, read + write, best of 5). Weights rotate over enough
// copies to exceed twice the L2, so every call streams from HBM; calls are replayed from a CUDA graph, so
// µs is device time per call including the kernel boundary. Prints a markdown table.
//
//   bench_gemv [--trials N] [--only NAME] [--n ROWS] [--fast]
//
// --fast: the calls as fast numerics makes them (x bf16-valued; FP8 act_quant'ed with bf16 outputs, or multiplied
// in bf16 where grouped, as wo_a), so 5..16 rows take the tensor-core GEMVs (gemv_mma.cu) as in the decode step.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/event_timing.h"
#include "core/error.h"
#include "cuda/bandwidth.h"
#include "cuda/common/check.h"
#include "cuda/gemm/gemm.h"

namespace {

using dsv4::cuda::DeviceWeight;
using dsv4::cuda::WFormat;

struct Shape {
  const char* name;
  WFormat format;
  int64_t rows, cols, groups;
};

const Shape kShapes[] = {
    {"wq_b", WFormat::kFP8, 32768, 1024, 1},
    {"wo_b", WFormat::kFP8, 4096, 8192, 1},
    {"wkv", WFormat::kFP8, 512, 4096, 1},
    {"wo_a (8 groups)", WFormat::kFP8, 8192, 4096, 8},
    {"lm head", WFormat::kBF16, 129280, 4096, 1},
    {"expert w1", WFormat::kFP4, 2048, 4096, 1},
    {"expert w2", WFormat::kFP4, 4096, 2048, 1},
    // Streaming rate of each decode on long matrices (many rows per block), and the bytes of wq_b in BF16.
    {"stream", WFormat::kFP8, 129280, 4096, 1},
    {"stream", WFormat::kFP4, 129280, 4096, 1},
    {"stream", WFormat::kF32, 32768, 4096, 1},
    {"bf16 like wq_b", WFormat::kBF16, 16384, 1024, 1},
    {"bf16 like wo_b", WFormat::kBF16, 4096, 4096, 1},
};

const char* format_name(WFormat f) {
  switch (f) {
    case WFormat::kF32: return "F32";
    case WFormat::kBF16: return "BF16";
    case WFormat::kFP8: return "FP8";
    default: return "FP4";
  }
}

void* device_bytes(const std::vector<uint8_t>& host) {
  void* d = nullptr;
  DSV4_CUDA_CHECK(cudaMalloc(&d, host.size()));
  DSV4_CUDA_CHECK(cudaMemcpy(d, host.data(), host.size(), cudaMemcpyHostToDevice));
  return d;
}

// A weight with random finite codes and unit-ish scales; returns its total bytes (data + scales).
int64_t make_weight(const Shape& s, std::mt19937_64& rng, DeviceWeight* w, std::vector<void*>* owned) {
  w->format = s.format;
  w->rows = s.rows;
  w->cols = s.cols;
  std::vector<uint8_t> data(size_t(s.rows * w->row_bytes()));
  for (size_t i = 0; i < data.size(); i += 8) {
    const uint64_t r = rng();
    std::memcpy(data.data() + i, &r, std::min<size_t>(8, data.size() - i));
  }
  if (s.format == WFormat::kBF16 || s.format == WFormat::kF32)  // keep the exponent tame: no NaN / Inf
    for (size_t i = s.format == WFormat::kBF16 ? 1 : 3; i < data.size(); i += s.format == WFormat::kBF16 ? 2 : 4)
      data[i] = uint8_t((data[i] & 0x80) | 0x3C);
  if (s.format == WFormat::kFP8)
    for (auto& b : data)
      if ((b & 0x7F) == 0x7F) b ^= 1;
  w->data = static_cast<const uint8_t*>(device_bytes(data));
  owned->push_back(const_cast<uint8_t*>(w->data));
  int64_t bytes = int64_t(data.size());
  if (s.format == WFormat::kFP8) {
    w->scale_cols = (s.cols + 127) / 128;
    std::vector<float> sc(size_t((s.rows + 127) / 128 * w->scale_cols), 0.01f);
    std::vector<uint8_t> raw(sc.size() * 4);
    std::memcpy(raw.data(), sc.data(), raw.size());
    w->scale_f32 = static_cast<const float*>(device_bytes(raw));
    owned->push_back(const_cast<float*>(w->scale_f32));
    bytes += int64_t(raw.size());
  } else if (s.format == WFormat::kFP4) {
    w->scale_cols = s.cols / 32;
    std::vector<uint8_t> raw(size_t(s.rows * w->scale_cols), 120);
    w->scale_e8m0 = static_cast<const uint8_t*>(device_bytes(raw));
    owned->push_back(const_cast<uint8_t*>(w->scale_e8m0));
    bytes += int64_t(raw.size());
  }
  return bytes;
}

// Seconds per call of `body(i)`, i rotating over a batch: warm-up, then the batch captured in a CUDA graph
// (as the decode step runs; no host launch overhead) and the median over trials of graph replays.
template <class Body>
double time_calls(cudaStream_t stream, int batch, int trials, Body body) {
  for (int i = 0; i < batch; ++i) body(i);  // warm-up
  const dsv4::bench::CapturedGraph graph(stream, [&] {
    for (int i = 0; i < batch; ++i) body(i);
  });
  graph.launch(stream);
  dsv4::bench::EventTimer timer;
  std::vector<double> t;
  for (int trial = 0; trial < trials; ++trial) {
    timer.start(stream);
    graph.launch(stream);
    t.push_back(timer.stop_ms(stream) * 1e-3 / batch);
  }
  return dsv4::bench::median(t);
}

}  // namespace

int main(int argc, char** argv) {
  int trials = 21;
  std::string only;  // run only shapes whose name contains this
  std::vector<int64_t> ns = {1, 8};
  bool fast = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--trials") == 0 && i + 1 < argc) trials = std::max(1, std::atoi(argv[++i]));
    else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
    else if (std::strcmp(argv[i], "--n") == 0 && i + 1 < argc) ns = {std::max(1, std::atoi(argv[++i]))};
    else if (std::strcmp(argv[i], "--fast") == 0) fast = true;
    else {
      std::fprintf(stderr, "usage: bench_gemv [--trials N] [--only NAME] [--n ROWS] [--fast]\n");
      return 1;
    }
  }
  try {
    cudaDeviceProp prop{};
    DSV4_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t stream;
    DSV4_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    const double copy_bw = dsv4::measure_copy_bandwidth();  // read + write, 2 GiB device to device

    std::printf("## gemv on %s (%d SMs, L2 %d MB)%s: copy bandwidth %.0f GB/s (D2D 2 GiB, read + write)\n\n",
                prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, fast ? ", fast numerics" : "",
                copy_bw * 1e-9);
    std::printf("| shape | format | n | MB read | µs | GB/s | %% of copy |\n|---|---|---|---|---|---|---|\n");
    std::mt19937_64 rng(1);
    for (const int64_t n : ns)
      for (const Shape& s : kShapes) {
        if (!only.empty() && std::string(s.name).find(only) == std::string::npos) continue;
        std::vector<void*> owned;
        DeviceWeight first;
        const int64_t weight_bytes = make_weight(s, rng, &first, &owned);
        // Copies: together more than twice the L2, so no call finds its weight cached.
        const int copies = int(std::clamp<int64_t>(2 * int64_t(prop.l2CacheSize) / weight_bytes + 1, 1, 64));
        std::vector<dsv4::cuda::GemmParams> calls;
        float *x = nullptr, *y = nullptr;
        const int64_t ldx = s.groups * s.cols;
        DSV4_CUDA_CHECK(cudaMalloc(&x, size_t(n * ldx) * sizeof(float)));
        DSV4_CUDA_CHECK(cudaMalloc(&y, size_t(n * s.rows) * sizeof(float)));
        DSV4_CUDA_CHECK(cudaMemset(x, 0, size_t(n * ldx) * sizeof(float)));
        for (int c = 0; c < copies; ++c) {
          DeviceWeight w = first;
          if (c > 0) make_weight(s, rng, &w, &owned);
          dsv4::cuda::GemmParams call{x, ldx, w, n, y, s.rows, s.groups};
          if (fast && s.format != WFormat::kFP4) {
            call.x_bf16 = true;
            call.quant_x = s.format == WFormat::kFP8 && s.groups == 1;
            call.bf16_out = s.format == WFormat::kFP8;
          }
          calls.push_back(call);
        }
        // Split-K scratch as the engine provides it (CudaOps workspaces): arrival counters start at zero.
        const dsv4::cuda::GemvScratchSize need = dsv4::cuda::gemv_scratch_size(calls[0]);
        dsv4::cuda::GemvScratch scratch{nullptr, need.partial_floats, nullptr, need.arrival_count};
        DSV4_CUDA_CHECK(cudaMalloc(&scratch.partials, std::max<size_t>(need.partial_floats, 1) * sizeof(float)));
        DSV4_CUDA_CHECK(cudaMalloc(&scratch.arrivals, std::max<size_t>(need.arrival_count, 1) * sizeof(int32_t)));
        DSV4_CUDA_CHECK(cudaMemset(scratch.arrivals, 0, std::max<size_t>(need.arrival_count, 1) * sizeof(int32_t)));
        owned.push_back(scratch.partials);
        owned.push_back(scratch.arrivals);
        const int batch = std::max(copies, 20);
        const double t = time_calls(stream, batch, trials,
                                    [&](int i) { dsv4::cuda::gemv(calls[size_t(i % copies)], scratch, stream); });
        const double bytes = double(weight_bytes) + 4.0 * double(n) * double(ldx + s.rows);
        const std::string shape = std::string(s.name) + " [" + std::to_string(s.rows) + ", " + std::to_string(s.cols) + "]";
        std::printf("| %s | %s | %lld | %.1f | %.1f | %.0f | %.0f%% |\n", shape.c_str(), format_name(s.format),
                    static_cast<long long>(n), bytes * 1e-6, t * 1e6, bytes / t * 1e-9, 100.0 * bytes / t / copy_bw);
        for (void* p : owned) DSV4_CUDA_CHECK(cudaFree(p));
        DSV4_CUDA_CHECK(cudaFree(x));
        DSV4_CUDA_CHECK(cudaFree(y));
      }
    DSV4_CUDA_CHECK(cudaStreamDestroy(stream));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemv: %s\n", e.what());
    return 1;
  }
  return 0;
}
