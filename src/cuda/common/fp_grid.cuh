// Rounding onto the FP8 e4m3 and FP4 e2m1 grids with power-of-two block scales, bit-identical to the CPU's
// simulation (src/cpu/quant.cpp, core/dtype.cpp), and the exact codes of values on those grids. Shared by the
// quant family (the simulation points) and the compact caches (attention/kv_cache.cu), so a value stored in a
// compact cache is exactly the simulated value.
//
// Rounding is arithmetic: within a binade the grid is uniform, so rintf(q / step) · step (exact scalings by powers
// of two) is the nearest grid value, ties to the even code — the same choice as the CPU's table search.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace dsv4::cuda {

// ceil(log2(a)) for a > 0 from the IEEE bits: exponent + (mantissa != 0), as core/dtype.cpp computes it.
__device__ __forceinline__ int ceil_log2_bits(float a) {
  const uint32_t u = __float_as_uint(a);
  return int((u >> 23) & 0xFF) - 127 + ((u & 0x7FFFFF) != 0 ? 1 : 0);
}

// floor(log2|q|) for finite q, −127 for zero and fp32 subnormals (they sit below every grid's lowest binade).
__device__ __forceinline__ int floor_log2_bits(float q) { return int((__float_as_uint(q) >> 23) & 0xFF) - 127; }

// Nearest value of a grid with `mantissa_bits` explicit mantissa bits whose lowest normal binade is
// 2^min_exp (below it the grid stays uniform: subnormals), ties to even. |q| must not exceed the grid's max.
__device__ __forceinline__ float round_to_grid(float q, int mantissa_bits, int min_exp) {
  const int step_exp = max(floor_log2_bits(q), min_exp) - mantissa_bits;
  return ldexpf(rintf(ldexpf(q, -step_exp)), step_exp);
}

// e4m3: 3 mantissa bits, binades from 2^−6, max 448; NaN becomes the positive quiet NaN, as the CPU's code
// 0x7F decodes.
__device__ __forceinline__ float round_e4m3(float q) {
  if (isnan(q)) return __int_as_float(0x7fc00000);
  return round_to_grid(q, 3, -6);
}

// e2m1: 1 mantissa bit, binades from 2^0 (0.5 is the subnormal step), max 6. A NaN stays NaN (the CPU's
// table search happens to map it to ±0; a NaN here is an upstream bug either way).
__device__ __forceinline__ float round_e2m1(float q) { return round_to_grid(q, 1, 0); }

// std::clamp's semantics (a NaN passes through), unlike fminf/fmaxf which would turn it into a bound.
__device__ __forceinline__ float clamp_like_std(float v, float lo, float hi) { return v < lo ? lo : (hi < v ? hi : v); }

__device__ __forceinline__ float warp_max_f32(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The block scales of the two simulations: 2^ceil(log2(max(amax, floor) / grid max)).
__device__ __forceinline__ int e4m3_block_exponent(float amax) { return ceil_log2_bits(fmaxf(amax, 1e-4f) / 448.0f); }
__device__ __forceinline__ int e2m1_block_exponent(float amax) {
  return ceil_log2_bits(fmaxf(amax, 6.0f * 0x1p-126f) / 6.0f);
}

// ---- codes of values already on a grid (|q| ≤ the grid's max; a NaN encodes as the format's NaN / zero)

__device__ __forceinline__ uint8_t e4m3_code(float q) {
  const uint32_t sign = signbit(q) ? 0x80u : 0u;
  const float a = fabsf(q);
  if (isnan(q)) return 0x7F;
  if (a < 0x1p-6f) return uint8_t(sign | uint32_t(a * 0x1p9f));  // subnormal: m · 2^−9
  const int e = floor_log2_bits(a);
  const uint32_t mant = uint32_t(ldexpf(a, -e) * 8.0f) - 8u;
  return uint8_t(sign | (uint32_t(e + 7) << 3) | mant);
}

__device__ __forceinline__ float e4m3_value(uint32_t code) {
  if ((code & 0x7Fu) == 0x7Fu) return __int_as_float(0x7fc00000);  // e4m3fn's only NaN
  const uint32_t exp = (code >> 3) & 15u, mant = code & 7u;
  const float a = exp == 0 ? float(mant) * 0x1p-9f : __uint_as_float(((exp + 120u) << 23) | (mant << 20));
  return (code & 0x80u) ? -a : a;
}

__device__ __forceinline__ uint8_t e2m1_code(float q) {
  const uint32_t sign = signbit(q) ? 8u : 0u;
  const float a = fabsf(q);  // one of 0, 0.5, 1, 1.5, 2, 3, 4, 6
  const uint32_t code = a < 2.0f ? uint32_t(a * 2.0f) : (a < 4.0f ? 4u + uint32_t(a - 2.0f) : (a < 6.0f ? 6u : 7u));
  return uint8_t(sign | code);
}

__device__ __forceinline__ float e2m1_value(uint32_t code) {
  const uint32_t e = (code >> 1) & 3u, m = code & 1u;
  const float a = e == 0 ? 0.5f * float(m) : float(2u + m) * float(1u << e) * 0.25f;
  return (code & 8u) ? -a : a;
}

// ---- fast numerics (docs/design/fast-numerics.md §7): the bf16 point between ops and DeepSeek's act_quant

// v rounded to bf16 (nearest even) and widened back: core/dtype.h's round_bf16, bit for bit (NaN stays NaN).
__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
__device__ __forceinline__ float round_bf16_if(bool fast, float v) { return fast ? round_bf16(v) : v; }

// One value of an act_quant'ed block, dequantised: e4m3_RNE(clamp(v · 2^−e, ±448)) · 2^e with e the block's
// e4m3_block_exponent (exact in fp32) — src/cpu/quant.cpp's fp8_round_trip.
__device__ __forceinline__ float e4m3_round_trip(float v, int e) {
  return ldexpf(round_e4m3(clamp_like_std(ldexpf(v, -e), -448.0f, 448.0f)), e);
}

// One warp's 128 consecutive columns of a row act_quant'ed: lane l holds columns 4l .. 4l + 3 of the block (v,
// bf16-valued) and gets their e4m3 codes (column 4l + i in byte i) and the block's exponent e (scale 2^e, e in
// [−22, 120]: a normal float). The values code · 2^e are e4m3_round_trip's; the whole warp calls.
__device__ __forceinline__ uint32_t act_quant_codes_warp(const float (&v)[4], int& e) {
  const float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
  e = e4m3_block_exponent(warp_max_f32(amax));
  const float down = __uint_as_float(uint32_t(127 - e) << 23);
  const __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v[0] * down, v[1] * down), __NV_SATFINITE, __NV_E4M3);
  const __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v[2] * down, v[3] * down), __NV_SATFINITE, __NV_E4M3);
  return uint32_t(lo) | (uint32_t(hi) << 16);
}

// act_quant_codes_warp into E4m3Rows form (model/ops.h): this lane's codes to codes[0 .. 3] (4-byte aligned), the
// block's scale 2^e to *scale (lane 0).
__device__ __forceinline__ void act_quant_store_warp(const float (&v)[4], uint8_t* codes, float* scale) {
  int e;
  *reinterpret_cast<uint32_t*>(codes) = act_quant_codes_warp(v, e);
  if (threadIdx.x % 32 == 0) *scale = __uint_as_float(uint32_t(127 + e) << 23);
}

// 2^(byte − 127), the E8M0 scale (byte ≥ 1: the simulations never produce a smaller scale).
__device__ __forceinline__ float e8m0_value(uint32_t byte) { return __uint_as_float(byte << 23); }

// Two e4m3 bytes (the low 16 bits, low byte first) as an f16 pair, exactly (hardware cvt on sm_89+).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two & 0xFFFFu), __NV_E4M3);
  return uint32_t(h.x) | (uint32_t(h.y) << 16);
}

// Two e4m3 bytes (low byte first) to floats, exactly.
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two & 0xFFFFu), __NV_E4M3);
  return __half22float2(__half2(h));
}

// Fast numerics' act_quant of 4 values sharing the block exponent e (e4m3_block_exponent): v · 2^−e to e4m3 by
// the conversion instruction (round to nearest even, saturating at ±448 = the clamp) and back, × 2^e —
// e4m3_round_trip, bit for bit, in a few instructions.
__device__ __forceinline__ float4 act_quant4(float4 v, int e) {
  const float down = __uint_as_float(uint32_t(127 - e) << 23), up = __uint_as_float(uint32_t(127 + e) << 23);
  const __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v.x * down, v.y * down), __NV_SATFINITE, __NV_E4M3);
  const __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v.z * down, v.w * down), __NV_SATFINITE, __NV_E4M3);
  const float2 a = e4m3x2_to_float2(lo), b = e4m3x2_to_float2(hi);
  return make_float4(a.x * up, a.y * up, b.x * up, b.y * up);
}

}  // namespace dsv4::cuda
