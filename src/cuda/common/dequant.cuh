// Device-side decoders of the checkpoint formats, shared by every kernel family (spec §3.3).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "cuda/common/device_weight.h"

namespace dsv4::cuda {

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

__device__ __forceinline__ float e4m3_bits_to_f32(uint8_t b) {
  __nv_fp8_e4m3 v;
  v.__x = b;
  return float(v);
}

__device__ __forceinline__ float e8m0_bits_to_f32(uint8_t b) {
  // 2^(b − 127); b = 0 is 2^−127 (a subnormal float), b = 255 is NaN.
  if (b == 0) return __uint_as_float(0x00400000u);
  if (b == 255) return __uint_as_float(0x7fc00000u);
  return __uint_as_float(uint32_t(b) << 23);
}

__device__ __forceinline__ float e2m1_to_f32(uint32_t code) {
  // sign | exponent(2) | mantissa(1): 0, 0.5, 1, 1.5, 2, 3, 4, 6. Arithmetic, not a table: a local array
  // would live in the stack frame.
  const uint32_t e = (code >> 1) & 3, m = code & 1;
  const float mag = e == 0 ? 0.5f * float(m) : __uint_as_float((e + 126u) << 23) * (1.0f + 0.5f * float(m));
  return (code & 8) ? -mag : mag;
}

// Element (r, c) decoded to fp32: for generic and reference kernels; hot loops decode 16 bytes at a time.
__device__ __forceinline__ float weight_at(const DeviceWeight& w, int64_t r, int64_t c) {
  const uint8_t* row = w.data + r * w.row_bytes();
  switch (w.format) {
    case WFormat::kF32: return reinterpret_cast<const float*>(row)[c];
    case WFormat::kBF16: return bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(row)[c]);
    case WFormat::kFP8: return e4m3_bits_to_f32(row[c]) * w.scale_f32[(r / 128) * w.scale_cols + c / 128];
    default: {
      const uint8_t byte = row[c / 2];
      const float s = e8m0_bits_to_f32(w.scale_e8m0[r * w.scale_cols + c / 32]);
      return e2m1_to_f32((c & 1) ? (byte >> 4) : (byte & 0xF)) * s;
    }
  }
}

}  // namespace dsv4::cuda
