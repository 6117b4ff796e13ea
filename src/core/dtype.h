// Element types as safetensors names them, and the scalar conversions every backend shares.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tetra {

enum class DType : uint8_t {
  BOOL, U8, I8, U16, I16, U32, I32, U64, I64,
  F16, BF16, F32, F64, C64,
  F8_E4M3, F8_E5M2, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ,
  F4, F6_E2M3, F6_E3M2,
};

// Bits per element (F4 = 4, F6 = 6; every other type a whole number of bytes).
int dtype_bits(DType t);
std::string_view dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);

// ---- scalar conversions (bit-exact, round-to-nearest-even where rounding happens) ----

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// E4M3 (float8_e4m3fn): bias 7, max 448, no infinities, 0x7f/0xff are NaN.
float e4m3_to_f32(uint8_t v);
// Round-to-nearest-even; values beyond 448 saturate to 448 (as a float8_e4m3fn cast of a
// value already clamped to the range, which is how NVFP4 scales are produced).
uint8_t f32_to_e4m3(float f);

float e5m2_to_f32(uint8_t v);

// E8M0: a power of two 2^(v-127); 0xff is NaN.
inline float e8m0_to_f32(uint8_t v) {
  return v == 0xff ? NAN : std::ldexp(1.0f, int(v) - 127);
}

// E2M1 (FP4) code table; bit 3 is the sign.
inline constexpr float kE2m1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
inline float e2m1_to_f32(uint8_t nibble) { return kE2m1Values[nibble & 0xf]; }

}  // namespace tetra
