// A checkpoint matrix on the device, still in its checkpoint precision (never expanded to BF16/FP32).
// Plain struct, passed by value into kernels; host-safe (the decoders are in dequant.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace dsv4::cuda {

// Device storage formats (uploads normalise the checkpoint's: F16 → F32, F32 block scales stay F32,
// E8M0 FP8 block scales are widened to F32, FP4 scales are kept as E8M0 bytes).
enum class WFormat : uint8_t {
  kF32,   // [rows, cols] float
  kBF16,  // [rows, cols] bf16
  kFP8,   // [rows, cols] e4m3 bytes; scale_f32 [ceil(rows/128), ceil(cols/128)] row-major (block 128×128)
  kFP4,   // [rows, cols/2] bytes, element 2j in the low nibble; scale_e8m0 [rows, cols/32]
};

struct DeviceWeight {
  WFormat format = WFormat::kF32;
  int64_t rows = 0, cols = 0;
  const uint8_t* data = nullptr;      // compact rows: row r at data + r · row_bytes()
  const float* scale_f32 = nullptr;   // kFP8
  const uint8_t* scale_e8m0 = nullptr;  // kFP4
  int64_t scale_cols = 0;             // kFP8: ceil(cols/128); kFP4: cols/32
  // The MoE expert kernels' tensor-core layout (moe/weight_mma.cuh; CudaOps::to_mma_layout), made in place, so no
  // other op may read the matrix (linear refuses it): mma_tiles, the MMA tile order instead of compact rows (data
  // and FP4 scales); mma_bits, an FP4 matrix's words in the MMA bit order.
  bool mma_tiles = false;
  bool mma_bits = false;
  // kFP4, found at upload: the range of the E8M0 scale bytes, and the largest max − min over the four scales of
  // a row's 128-column block (255 when cols is not a multiple of 128): what the MoE kernels' paths require
  // (moe/moe.cu), without reading the checkpoint's scales again.
  uint8_t scale_lo = 0, scale_hi = 0, scale_span = 255;

  __host__ __device__ int64_t row_bytes() const {
    switch (format) {
      case WFormat::kF32: return cols * 4;
      case WFormat::kBF16: return cols * 2;
      case WFormat::kFP8: return cols;
      default: return cols / 2;
    }
  }
};

}  // namespace dsv4::cuda
