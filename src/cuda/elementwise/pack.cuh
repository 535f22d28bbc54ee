// Vector access for the memory-bound kernels of the core families (elementwise, norm_rope, hc): a Pack<N> of
// fp32 moves as one 16-byte (N = 4) or 4-byte (N = 1) access, and weight_pack<N> decodes N consecutive
// elements of a checkpoint matrix with one load of its storage format. Kernels are templated on N; the
// launchers pick N = 4 only when every pointer and row stride involved is 16-byte aligned.
#pragma once

#include <cstdint>

#include "cuda/common/dequant.cuh"
#include "cuda/common/device_weight.h"

namespace dsv4::cuda {

template <int N>
struct alignas(sizeof(float) * N) Pack {
  float v[N];
};

template <int N>
__device__ __forceinline__ Pack<N> load_pack(const float* p) {
  return *reinterpret_cast<const Pack<N>*>(p);
}

template <int N>
__device__ __forceinline__ void store_pack(float* p, const Pack<N>& v) {
  *reinterpret_cast<Pack<N>*>(p) = v;
}

// True when p can be accessed as Pack<4>.
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Elements c .. c+N−1 of row r, decoded to fp32 exactly as weight_at() does (N = 4 requires c % 4 == 0 and
// cols % 4 == 0, so that a row start, an FP8 128-column and an FP4 32-column scale block never split a pack).
template <int N>
__device__ __forceinline__ Pack<N> weight_pack(const DeviceWeight& w, int64_t r, int64_t c) {
  Pack<N> out;
  if constexpr (N == 1) {
    out.v[0] = weight_at(w, r, c);
  } else {
    static_assert(N == 4, "weight_pack decodes 1 or 4 elements");
    const uint8_t* row = w.data + r * w.row_bytes();
    switch (w.format) {
      case WFormat::kF32:
        out = *reinterpret_cast<const Pack<4>*>(row + 4 * c);
        break;
      case WFormat::kBF16: {
        const uint2 b = *reinterpret_cast<const uint2*>(row + 2 * c);
        out.v[0] = bf16_bits_to_f32(uint16_t(b.x & 0xFFFF));
        out.v[1] = bf16_bits_to_f32(uint16_t(b.x >> 16));
        out.v[2] = bf16_bits_to_f32(uint16_t(b.y & 0xFFFF));
        out.v[3] = bf16_bits_to_f32(uint16_t(b.y >> 16));
        break;
      }
      case WFormat::kFP8: {
        const uint32_t b = *reinterpret_cast<const uint32_t*>(row + c);
        const float s = w.scale_f32[(r / 128) * w.scale_cols + c / 128];
#pragma unroll
        for (int i = 0; i < 4; ++i) out.v[i] = e4m3_bits_to_f32(uint8_t(b >> (8 * i))) * s;
        break;
      }
      default: {  // kFP4: two bytes hold elements c .. c+3, low nibble first
        const uint32_t b = *reinterpret_cast<const uint16_t*>(row + c / 2);
        const float s = e8m0_bits_to_f32(w.scale_e8m0[r * w.scale_cols + c / 32]);
#pragma unroll
        for (int i = 0; i < 4; ++i) out.v[i] = e2m1_to_f32((b >> (4 * i)) & 0xF) * s;
        break;
      }
    }
  }
  return out;
}

}  // namespace dsv4::cuda
