// gemm family benchmark: the tensor-core path at V4-Flash prefill shapes, BF16 and FP8 weights, n = 512 and 4096
// tokens. Per case: the op (cuda::gemm_tensor_core: rounding the fp32 activations + the GEMM) and the GEMM alone
// on activations already rounded (cuda::tc_gemm — what cuBLAS is handed), as µs per call and
// TFLOP/s = 2·n·N·K / time. CUDA events around each call after warm-up, L2 flushed before each. The yardstick
// (cuBLAS / cuBLASLt through PyTorch) is bench/gemm/yardstick.py, run in the same GPU session:
// `yardstick.py --ours <this output>` prints both side by side with the ratios.
//
//   bench_gemm [--iters N] [--only FMT:N:SHAPE]     (--only fp8:4096:wq_a: one case, e.g. under ncu)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/event_timing.h"
#include "cuda/common/check.h"
#include "cuda/cuda_ops.h"
#include "cuda/gemm/gemm.h"
#include "cuda/gemm/tc_gemm.h"

namespace dsv4 {
namespace {

struct Shape {
  const char* name;
  int64_t rows, cols;  // W [N, K]
  bool bf16_only;      // the lm head ships in BF16
};

// V4-Flash projections: wq_a, wq_b, wo_b, wkv, shared expert w1 (w3 alike) and w2, lm head.
constexpr Shape kShapes[] = {
    {"wq_a", 1024, 4096, false},  {"wq_b", 32768, 1024, false},    {"wo_b", 4096, 8192, false},
    {"wkv", 512, 4096, false},    {"shared_w1", 2048, 4096, false}, {"shared_w2", 4096, 2048, false},
    {"lm_head", 129280, 4096, true},
};

__device__ uint32_t hash32(uint64_t i) {
  i = (i ^ (i >> 33)) * 0xFF51AFD7ED558CCDull;
  i = (i ^ (i >> 33)) * 0xC4CEB9FE1A85EC53ull;
  return uint32_t(i >> 32);
}

// Uniform-ish values in [-1, 1) as fp32, bf16 bits or finite e4m3 codes.
__global__ void fill_f32(float* p, int64_t count, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = float(hash32(seed + uint64_t(i))) * 0x1p-31f - 1.0f;
}
__global__ void fill_bf16(uint16_t* p, int64_t count, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = float(hash32(seed + uint64_t(i))) * 0x1p-31f - 1.0f;
    p[i] = uint16_t(__float_as_uint(v) >> 16);
  }
}
__global__ void fill_e4m3(uint8_t* p, int64_t count, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const uint8_t code = uint8_t(hash32(seed + uint64_t(i)));
    p[i] = (code & 0x7F) == 0x7F ? uint8_t(code ^ 1) : code;  // 0x7F / 0xFF are NaN
  }
}
__global__ void fill_const(float* p, int64_t count, float v) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = v;
}

void* device_buffer(size_t bytes) {
  void* p = nullptr;
  DSV4_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

std::string case_key(bool fp8, int64_t n, const Shape& s) {
  return std::string(fp8 ? "fp8" : "bf16") + ":" + std::to_string(n) + ":" + s.name;
}

// Whether --only names one of the cases run() times (checked before any GPU work).
bool names_a_case(const std::string& only) {
  for (const bool fp8 : {false, true})
    for (const int64_t n : {512, 4096})
      for (const Shape& s : kShapes)
        if (!(fp8 && s.bf16_only) && case_key(fp8, n, s) == only) return true;
  return false;
}

void run(int iters, const std::string& only) {
  if (!only.empty() && !names_a_case(only))
    throw std::runtime_error("--only " + only + " names no case: FMT bf16 or fp8, N 512 or 4096, SHAPE wq_a, wq_b, "
                             "wo_b, wkv, shared_w1, shared_w2 or lm_head (bf16 only)");
  ModelConfig config;
  CudaOps ops(config);
  const cudaStream_t stream = ops.stream();
  std::printf("# bench_gemm on %s (%d SMs); op = rounding + GEMM, gemm = GEMM alone; mean µs of %d calls after "
              "warm-up, L2 flushed\n",
              ops.props().name, ops.props().multiProcessorCount, iters);
  const size_t flush_bytes = size_t(4) * size_t(ops.props().l2CacheSize);
  void* flush = device_buffer(flush_bytes);

  for (const bool fp8 : {false, true})
    for (const int64_t n : {512, 4096})
      for (const Shape& s : kShapes) {
        if (fp8 && s.bf16_only) continue;
        if (!only.empty() && case_key(fp8, n, s) != only) continue;
        cuda::DeviceWeight w;
        w.format = fp8 ? cuda::WFormat::kFP8 : cuda::WFormat::kBF16;
        w.rows = s.rows;
        w.cols = s.cols;
        auto* data = static_cast<uint8_t*>(device_buffer(size_t(s.rows * w.row_bytes())));
        float* scale = nullptr;
        if (fp8) {
          w.scale_cols = cuda::ceil_div(s.cols, 128);
          const int64_t count = cuda::ceil_div(s.rows, 128) * w.scale_cols;
          scale = static_cast<float*>(device_buffer(size_t(count) * 4));
          fill_const<<<64, 256, 0, stream>>>(scale, count, 1e-3f);
          fill_e4m3<<<4096, 256, 0, stream>>>(data, s.rows * s.cols, 11);
        } else {
          fill_bf16<<<4096, 256, 0, stream>>>(reinterpret_cast<uint16_t*>(data), s.rows * s.cols, 11);
        }
        DSV4_LAUNCH_CHECK();
        w.data = data;
        w.scale_f32 = scale;
        auto* x = static_cast<float*>(device_buffer(size_t(n * s.cols) * 4));
        auto* y = static_cast<float*>(device_buffer(size_t(n * s.rows) * 4));
        fill_f32<<<4096, 256, 0, stream>>>(x, n * s.cols, 7);
        DSV4_LAUNCH_CHECK();

        const cuda::GemmParams p{x, s.cols, w, n, y, s.rows, 1};
        const double flop = 2.0 * double(n) * double(s.rows) * double(s.cols);
        if (!cuda::tc_covers(p, ops)) {
          std::printf("fmt=%s n=%lld shape=%s declined by the tensor-core path\n", fp8 ? "fp8" : "bf16",
                      (long long)n, s.name);
        } else {
          // Mean µs of `call` over iters, after 2 warm-up calls (which also grow the workspaces).
          const auto time_us = [&](const auto& call) {
            call();
            call();
            const std::vector<double> ms = bench::flushed_ms(stream, flush, flush_bytes, iters, call);
            return 1e3 * std::accumulate(ms.begin(), ms.end(), 0.0) / iters;
          };
          const double op_us = time_us([&] { cuda::gemm_tensor_core(p, ops); });
          const cuda::TcActivations rounded = cuda::tc_round_activations(p, ops);
          const double gemm_us = time_us([&] { cuda::tc_gemm(p, rounded, ops); });
          std::printf("fmt=%s n=%lld shape=%s N=%lld K=%lld us=%.1f tflops=%.1f gemm_us=%.1f gemm_tflops=%.1f\n",
                      fp8 ? "fp8" : "bf16", (long long)n, s.name, (long long)s.rows, (long long)s.cols, op_us,
                      flop / op_us * 1e-6, gemm_us, flop / gemm_us * 1e-6);
        }
        std::fflush(stdout);
        DSV4_CUDA_CHECK(cudaStreamSynchronize(stream));
        for (void* b : {static_cast<void*>(data), static_cast<void*>(scale), static_cast<void*>(x),
                        static_cast<void*>(y)})
          DSV4_CUDA_CHECK(cudaFree(b));
      }
  DSV4_CUDA_CHECK(cudaFree(flush));
}

}  // namespace
}  // namespace dsv4

int main(int argc, char** argv) {
  int iters = 10;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
    else {
      std::fprintf(stderr, "usage: bench_gemm [--iters N] [--only FMT:N:SHAPE]\n");
      return 2;
    }
  }
  try {
    dsv4::run(iters > 0 ? iters : 1, only);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemm: %s\n", e.what());
    return 1;
  }
  return 0;
}
