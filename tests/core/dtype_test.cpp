#include <gtest/gtest.h>

#include <cmath>

#include "core/dtype.h"

namespace tetra {
namespace {

TEST(DType, NamesRoundTrip) {
  for (auto name : {"BOOL", "U8", "I8", "F16", "BF16", "F32", "F64", "I64", "F8_E4M3", "F8_E8M0",
                    "F4", "F6_E2M3", "C64"}) {
    auto t = dtype_from_name(name);
    ASSERT_TRUE(t.has_value()) << name;
    EXPECT_EQ(dtype_name(*t), name);
  }
  EXPECT_FALSE(dtype_from_name("F128").has_value());
  EXPECT_EQ(dtype_bits(DType::F4), 4);
  EXPECT_EQ(dtype_bits(DType::F6_E3M2), 6);
  EXPECT_EQ(dtype_bits(DType::BF16), 16);
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even mantissa.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(bf16_to_f32(0xc040), -3.0f);
}

TEST(DType, E4m3EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_to_f32(uint8_t(c));
    if (std::isnan(v)) continue;
    if (v == 0.0f) {
      EXPECT_EQ(f32_to_e4m3(v) & 0x7f, 0) << c;
      continue;
    }
    EXPECT_EQ(f32_to_e4m3(v), c) << c << " " << v;
  }
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(f32_to_e4m3(1000.0f), 0x7e);  // saturates
  // Halfway between 1.0 (0x38) and 1.125 (0x39) goes to the even code.
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3a);
  // Halfway between the two smallest subnormals 2^-9 and 2^-8: ties to even (2^-8).
  EXPECT_EQ(f32_to_e4m3(1.5f * std::ldexp(1.0f, -9)), 0x02);
}

TEST(DType, F16Conversions) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  for (int c = 0; c < 0x7c00; c += 7) EXPECT_EQ(f32_to_f16(f16_to_f32(uint16_t(c))), c) << c;
}

TEST(DType, E2m1Table) {
  EXPECT_EQ(e2m1_to_f32(7), 6.0f);
  EXPECT_EQ(e2m1_to_f32(0xf), -6.0f);
  EXPECT_TRUE(std::signbit(e2m1_to_f32(8)));
}

}  // namespace
}  // namespace tetra
