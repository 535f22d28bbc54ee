// Storage formats of checkpoint tensors and the scalar conversions between them and fp32.
// Every conversion is exact where the format allows it and round-to-nearest-even otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dsv4 {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF8E4M3,  // fp8 e4m3fn: bias 7, max 448, no infinities, 0x7F/0xFF = NaN
  kF8E8M0,  // ue8m0 scale: 2^(b - 127), 0xFF = NaN
  kI8,      // also the container of packed fp4 e2m1 experts (two values per byte, low nibble first)
  kU8,
  kI32,
  kI64,
};

// Bytes of one stored element (packed fp4 is stored as I8, one byte per two values).
size_t dtype_size(DType t);
const char* dtype_name(DType t);  // the safetensors spelling, e.g. "F8_E4M3"
// Parses a safetensors dtype label; returns false for labels dsv4 does not read.
bool parse_dtype(const std::string& label, DType* out);

float bf16_to_f32(uint16_t bits);
uint16_t f32_to_bf16(float value);  // round to nearest even; NaN stays NaN
float round_bf16(float value);      // the bf16 round trip: bf16_to_f32(f32_to_bf16(value))
float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float value);   // round to nearest even, overflow to inf

float e4m3_to_f32(uint8_t bits);
uint8_t f32_to_e4m3(float value);   // round to nearest even, saturating at ±448 (NaN → 0x7F)
float e2m1_to_f32(uint8_t code);    // low 4 bits used
uint8_t f32_to_e2m1(float value);   // round to nearest even, saturating at ±6
float e8m0_to_f32(uint8_t bits);

// ceil(log2(a)) for a > 0, computed from the IEEE bits as the reference does: exponent + (mantissa != 0).
int ceil_log2(float a);

}  // namespace dsv4
