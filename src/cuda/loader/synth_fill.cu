#include "cuda/loader/synth_fill.h"

#include <algorithm>

#include "core/error.h"
#include "cuda/common/check.h"

namespace dsv4::cuda {
namespace {

// One thread per (row, 8-byte word of the tensor that the row's slice touches): a slice that starts mid-word
// touches one word more than row_bytes / 8. Each thread makes its word and writes the bytes inside the slice.
__global__ void synth_fill_kernel(SynthFillParams p) {
  const int64_t words_per_row = p.row_bytes / 8 + 2;
  const int64_t total = p.rows * words_per_row;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / words_per_row;
    const uint64_t start = p.first + uint64_t(r * p.src_stride);  // the row's first byte in the tensor
    const uint64_t w = start / 8 + uint64_t(i % words_per_row);
    const uint64_t lo = max(w * 8, start), hi = min(w * 8 + 8, start + uint64_t(p.row_bytes));
    if (lo >= hi) continue;
    const uint64_t word = synth_word(p.fill, w);
    uint8_t* d = p.dst + r * p.dst_pitch + (lo - start);
    if (hi - lo == 8 && (reinterpret_cast<uintptr_t>(d) & 7) == 0) {
      *reinterpret_cast<uint64_t*>(d) = word;
    } else {
      for (uint64_t b = lo; b < hi; ++b) d[b - lo] = uint8_t(word >> (8 * (b - w * 8)));
    }
  }
}

}  // namespace

void synth_fill(const SynthFillParams& p, cudaStream_t stream) {
  DSV4_CHECK(p.dst && p.fill.table && p.rows >= 0 && p.row_bytes >= 0 && p.dst_pitch >= p.row_bytes &&
                 p.src_stride >= 0 && (p.fill.entry_bytes == 1 || p.fill.entry_bytes == 2 || p.fill.entry_bytes == 4),
             "synth_fill: bad parameters");
  if (p.rows == 0 || p.row_bytes == 0) return;
  const int64_t work = p.rows * (p.row_bytes / 8 + 2);
  const int threads = 256;
  constexpr int64_t kMaxBlocks = 4096;  // a grid-stride loop: any grid covers the work; this one fills the GPU
  const int blocks = int(std::min<int64_t>((work + threads - 1) / threads, kMaxBlocks));
  synth_fill_kernel<<<blocks, threads, 0, stream>>>(p);
  DSV4_LAUNCH_CHECK();
}

}  // namespace dsv4::cuda
