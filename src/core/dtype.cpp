#include "core/dtype.h"

#include <array>
#include <utility>

namespace tetra {
namespace {

struct DTypeInfo {
  DType type;
  std::string_view name;
  int bits;
};

constexpr std::array<DTypeInfo, 22> kDTypes = {{
    {DType::BOOL, "BOOL", 8},        {DType::U8, "U8", 8},
    {DType::I8, "I8", 8},            {DType::U16, "U16", 16},
    {DType::I16, "I16", 16},         {DType::U32, "U32", 32},
    {DType::I32, "I32", 32},         {DType::U64, "U64", 64},
    {DType::I64, "I64", 64},         {DType::F16, "F16", 16},
    {DType::BF16, "BF16", 16},       {DType::F32, "F32", 32},
    {DType::F64, "F64", 64},         {DType::C64, "C64", 64},
    {DType::F8_E4M3, "F8_E4M3", 8},  {DType::F8_E5M2, "F8_E5M2", 8},
    {DType::F8_E8M0, "F8_E8M0", 8},  {DType::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8},
    {DType::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8}, {DType::F4, "F4", 4},
    {DType::F6_E2M3, "F6_E2M3", 6},  {DType::F6_E3M2, "F6_E3M2", 6},
}};

const DTypeInfo& info(DType t) { return kDTypes[static_cast<size_t>(t)]; }

}  // namespace

int dtype_bits(DType t) { return info(t).bits; }
std::string_view dtype_name(DType t) { return info(t).name; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& d : kDTypes)
    if (d.name == name) return d.type;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const int exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    float v = std::ldexp(float(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | (uint32_t(exp - 15 + 127) << 23) | (mant << 13));
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;  // rounds to infinity
  if (a < 6.103515625e-05f) {               // subnormal range: multiples of 2^-24
    const float q = std::nearbyint(a * 16777216.0f);  // round-half-even (default mode)
    return sign | uint16_t(q);
  }
  uint32_t v = std::bit_cast<uint32_t>(a);
  v += 0xfffu + ((v >> 13) & 1u);
  const int exp = int(v >> 23) - 127 + 15;
  return sign | uint16_t(exp << 10) | uint16_t((v >> 13) & 0x3ff);
}

float e4m3_to_f32(uint8_t v) {
  const bool neg = v & 0x80;
  const int exp = (v >> 3) & 0xf;
  const int mant = v & 0x7;
  float r;
  if (exp == 0xf && mant == 0x7) return NAN;
  if (exp == 0) r = std::ldexp(float(mant), -9);  // subnormal: mant/8 * 2^-6
  else r = std::ldexp(1.0f + float(mant) / 8.0f, exp - 7);
  return neg ? -r : r;
}

uint8_t f32_to_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate
  // Find the binade; subnormals share the spacing 2^-9 of the smallest normal binade.
  int e;
  std::frexp(a, &e);   // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1;     // a in [2^exp, 2^(exp+1))
  if (exp < -6) exp = -6;
  const float step = std::ldexp(1.0f, exp - 3);       // 3 mantissa bits
  const float q = std::nearbyint(a / step) * step;    // exact: a/step is representable
  if (q == 0.0f) return sign;
  int qe;
  std::frexp(q, &qe);
  int qexp = qe - 1;
  if (qexp < -6) {  // subnormal
    return sign | uint8_t(std::lround(q / std::ldexp(1.0f, -9)));
  }
  const int mant = int(std::lround((q / std::ldexp(1.0f, qexp) - 1.0f) * 8.0f));
  return sign | uint8_t((qexp + 7) << 3) | uint8_t(mant);
}

float e5m2_to_f32(uint8_t v) { return f16_to_f32(uint16_t(v) << 8); }

}  // namespace tetra
