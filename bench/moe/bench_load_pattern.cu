// moe family benchmark: the expert kernels' weight loads alone, in row order and in the MMA tile order
// (cuda/moe/weight_mma.cuh) — the measurement behind storing the expert matrices tiled (docs/PERFORMANCE.md §2).
// The expert kernels' grid (264 blocks of 8 warps, two per SM), items of two 16-row FP4 tiles (w1 and w3 of
// 4096 columns: 2048-byte rows), the 8 warps splitting each item's 32 K groups, U groups loaded per round, and
// optionally the item barrier; the loaded words are XOR-consumed. Best of 18 timed launches, L2 flushed.
//
//   bench_load_pattern
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "common/event_timing.h"
#include "cuda/common/check.h"
#include "cuda/moe/weight_mma.cuh"

namespace dsv4 {
namespace {

using cuda::moe::kTileGroupBytes;
using cuda::moe::kTileRows;
using cuda::moe::load_stream16;  // the expert kernels' load
using cuda::moe::mma_tile_unit;

constexpr int kRowBytes = 2048;
constexpr int kGroups = kRowBytes / kTileGroupBytes;  // 32
constexpr int kItems = 896;                            // expert_up's items at n = 1 (6 experts + shared)

// Item i reads tiles i and kItems + i; block b takes an equal contiguous range of items.
template <bool kTiled, int U, bool kBarrier>
__global__ void __launch_bounds__(256, 2) load_items(const uint8_t* w, unsigned* sink) {
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32), g = lane / 4, c = lane % 4;
  const int begin = int(int64_t(kItems) * blockIdx.x / gridDim.x), end = int(int64_t(kItems) * (blockIdx.x + 1) / gridDim.x);
  constexpr int kGroupsPerWarp = kGroups / 8;
  unsigned acc = 0;
  for (int item = begin; item < end; ++item) {
    const int64_t tiles[2] = {item, kItems + item};
    for (int G0 = warp * kGroupsPerWarp; G0 < (warp + 1) * kGroupsPerWarp; G0 += U) {
      uint4 v[U][2][2];
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int G = G0 + u;
            const int64_t offset = kTiled ? 16 * mma_tile_unit(tiles[i], G, h, lane, kGroups)
                                          : (tiles[i] * kTileRows + g + 8 * h) * kRowBytes + 16 * (4 * G + c);
            v[u][i][h] = load_stream16(w + offset);
          }
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) acc ^= v[u][i][h].x ^ v[u][i][h].y ^ v[u][i][h].z ^ v[u][i][h].w;
    }
    if (kBarrier) __syncthreads();
  }
  if (acc == 0x9E3779B9u) *sink = acc;  // never true for the constant fill: keeps the loads
}

template <class Kernel>
float best_us(Kernel kernel, const uint8_t* w, unsigned* sink, uint8_t* flush, size_t flush_bytes) {
  const std::vector<double> ms = bench::flushed_ms(nullptr, flush, flush_bytes, 20, [&] {
    kernel<<<264, 256>>>(w, sink);
    DSV4_CUDA_CHECK(cudaGetLastError());
  });
  return float(*std::min_element(ms.begin() + 2, ms.end()) * 1e3);  // the first two warm up
}

int run() {
  const size_t bytes = size_t(2 * kItems) * kTileRows * kRowBytes;  // 58.7 MB
  const size_t flush_bytes = size_t(256) << 20;
  uint8_t *w = nullptr, *flush = nullptr;
  unsigned* sink = nullptr;
  DSV4_CUDA_CHECK(cudaMalloc(&w, bytes));
  DSV4_CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
  DSV4_CUDA_CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  DSV4_CUDA_CHECK(cudaMemset(w, 1, bytes));
  struct Case {
    const char* name;
    float us;
  } cases[] = {
      {"row order, 2 groups per round, item barrier (before)", best_us(load_items<false, 2, true>, w, sink, flush, flush_bytes)},
      {"row order, 4 groups per round, item barrier", best_us(load_items<false, 4, true>, w, sink, flush, flush_bytes)},
      {"row order, 2 groups per round, no barrier", best_us(load_items<false, 2, false>, w, sink, flush, flush_bytes)},
      {"tile order, 2 groups per round, item barrier (now)", best_us(load_items<true, 2, true>, w, sink, flush, flush_bytes)},
      {"tile order, 4 groups per round, item barrier", best_us(load_items<true, 4, true>, w, sink, flush, flush_bytes)},
      {"tile order, 2 groups per round, no barrier", best_us(load_items<true, 2, false>, w, sink, flush, flush_bytes)},
  };
  std::printf("| loads (%.1f MB) | us | GB/s |\n|---|---:|---:|\n", bytes / 1e6);
  for (const Case& c : cases) std::printf("| %s | %.1f | %.0f |\n", c.name, c.us, bytes / (c.us * 1e3));
  DSV4_CUDA_CHECK(cudaFree(w));
  DSV4_CUDA_CHECK(cudaFree(flush));
  DSV4_CUDA_CHECK(cudaFree(sink));
  return 0;
}

}  // namespace
}  // namespace dsv4

int main() { return dsv4::run(); }
