// norm_rope family: the rotation of one RoPE pair, shared by the kernels that fuse RoPE into another op
// (norm_rope, the attention output's de-rotation). The arithmetic of rope_kernel and the CPU: fp32 angle,
// fp64 sin/cos rounded to fp32, unfused fp32 products and sums.
#pragma once

#include <cstdint>

namespace dsv4::cuda {

// (cos, sin) of the angle pos · inv_freq, the sine negated when `inverse`.
__device__ __forceinline__ float2 rope_cos_sin(int64_t pos, float inv_freq, bool inverse) {
  const float angle = __fmul_rn(float(pos), inv_freq);
  double sd, cd;
  sincos(double(angle), &sd, &cd);
  return make_float2(float(cd), inverse ? -float(sd) : float(sd));
}

// (a, b) rotated by the angle whose (cos, sin) is cs.
__device__ __forceinline__ void rotate(float& a, float& b, float2 cs) {
  const float a0 = a, b0 = b;
  a = __fsub_rn(__fmul_rn(a0, cs.x), __fmul_rn(b0, cs.y));
  b = __fadd_rn(__fmul_rn(a0, cs.y), __fmul_rn(b0, cs.x));
}

// (a, b) rotated by pos · inv_freq, or by its negative when `inverse`.
__device__ __forceinline__ void rotate_pair(float& a, float& b, int64_t pos, float inv_freq, bool inverse) {
  rotate(a, b, rope_cos_sin(pos, inv_freq, inverse));
}

}  // namespace dsv4::cuda
