// NVFP4 rounding, packing and block decoding against hand-computed values and ModelOpt's rules.
#include "formats/nvfp4.h"

#include "core/thread_pool.h"

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace tetra {
namespace {

using namespace nvfp4;

float code_value(uint8_t code) { return e2m1_to_f32(code); }

TEST(Nvfp4, TiesRoundAsModelOptCastFp4) {
  // (input, expected code): ModelOpt's tie table, values in codes 0..7 = 0 .5 1 1.5 2 3 4 6.
  const std::pair<float, uint8_t> cases[] = {
      {0.0f, 0},  {0.25f, 0}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4}, {2.5f, 4},
      {3.5f, 6},  {5.0f, 6},  {0.5f, 1},  {1.0f, 2},  {1.5f, 3},  {2.0f, 4},
      {3.0f, 5},  {4.0f, 6},  {6.0f, 7},  {5.0001f, 7}, {7.5f, 7}, {1e30f, 7},
  };
  for (auto [x, code] : cases) {
    EXPECT_EQ(e2m1_code(x), code) << x;
    EXPECT_EQ(e2m1_code(-x), x == 0.0f ? 0 : (code | 8)) << -x;
  }
}

TEST(Nvfp4, NegativeValuesThatRoundToZeroKeepTheSignBit) {
  EXPECT_EQ(e2m1_code(-0.1f), 8);
  EXPECT_EQ(e2m1_code(-0.25f), 8);
  EXPECT_EQ(e2m1_code(-1e-30f), 8);
  EXPECT_EQ(e2m1_code(-0.0f), 0);  // -0.0 < 0 is false in ModelOpt's sign test
  EXPECT_EQ(e2m1_code(0.1f), 0);
}

TEST(Nvfp4, OffTieValuesRoundToTheNearestGridValue) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-7.0f, 7.0f);
  for (int i = 0; i < 100000; ++i) {
    const float x = u(rng);
    const uint8_t c = e2m1_code(x);
    float best = 1e9f;
    for (int k = 0; k < 16; ++k) best = std::min(best, std::fabs(x - code_value(uint8_t(k))));
    EXPECT_EQ(std::fabs(x - code_value(c)), best) << x;
    EXPECT_EQ(bool(c & 8), x < 0.0f) << x;
  }
}

TEST(Nvfp4, PackingPutsTheEvenIndexInTheLowNibble) {
  EXPECT_EQ(pack_pair(0x3, 0xA), 0xA3);
  EXPECT_EQ(unpack_even(0xA3), 0x3);
  EXPECT_EQ(unpack_odd(0xA3), 0xA);
  // A row [1, -6, 0.5, 0, ...] with block scale 1.0 and global scale 1.0.
  std::vector<float> w(16, 0.0f);
  w[0] = 1.0f, w[1] = -6.0f, w[2] = 0.5f;
  uint8_t packed[8], scale;
  const float gs = global_scale_from_amax(6.0f);
  quantize_row(w.data(), 16, gs, packed, &scale);
  EXPECT_EQ(scale, f32_to_e4m3(448.0f));
  EXPECT_EQ(packed[0], pack_pair(2, 15));
  EXPECT_EQ(packed[1], pack_pair(1, 0));
}

TEST(Nvfp4, BlockScalesFollowModelOpt) {
  // A zero block scale becomes 1.0; tiny ones clamp to the smallest subnormal 2^-9 (0x01);
  // large ones saturate at 448 (0x7e).
  EXPECT_EQ(block_scale_code(0.0f, 0.5f), f32_to_e4m3(1.0f));
  EXPECT_EQ(block_scale_code(1e-30f, 1.0f), 0x01);
  EXPECT_EQ(block_scale_code(6.0f * 0x1p-10f, 1.0f), 0x01);  // 2^-10: clamped, not rounded to 0
  EXPECT_EQ(block_scale_code(6.0f * 3 * 0x1p-9f, 1.0f), 0x03);  // exact subnormal 3 * 2^-9
  EXPECT_EQ(block_scale_code(6.0f * 448.0f, 1.0f), 0x7e);
  EXPECT_EQ(block_scale_code(1e30f, 1.0f), 0x7e);
  // An all-zero tensor has a zero global scale; its blocks get 1.0 instead of 0/0.
  EXPECT_EQ(block_scale_code(0.0f, 0.0f), f32_to_e4m3(1.0f));
}

TEST(Nvfp4, AllZeroTensorQuantizesToZeroCodes) {
  std::vector<float> w(32, 0.0f);
  w[3] = -0.0f;
  std::vector<uint8_t> packed(16), scales(2);
  quantize_row(w.data(), 32, global_scale_from_amax(0.0f), packed.data(), scales.data());
  for (uint8_t b : packed) EXPECT_EQ(b, 0);
  for (uint8_t s : scales) EXPECT_EQ(s, f32_to_e4m3(1.0f));
  std::vector<float> out(32, 1.0f);
  dequantize_row(packed.data(), scales.data(), 0.0f, 32, out.data());
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

TEST(Nvfp4, SingleHugeOutlierKeepsSubnormalScalesElsewhere) {
  std::vector<float> w(64, 1e-3f);
  w[40] = 3e4f;
  const float gs = global_scale_from_amax(3e4f);
  std::vector<uint8_t> packed(32), scales(4);
  quantize_row(w.data(), 64, gs, packed.data(), scales.data());
  EXPECT_EQ(scales[2], 0x7e);                     // the outlier's block: 448
  EXPECT_EQ(unpack_even(packed[20]), 7);          // element 40 is 6 * 448 * gs = amax
  for (int b : {0, 1, 3}) EXPECT_EQ(scales[b], 0x01) << b;  // clamped to 2^-9
  // 1e-3 / (2^-9 * gs) ~= 0.0459 -> code 0: the small values vanish, as in ModelOpt.
  EXPECT_EQ(packed[0], 0);
  std::vector<float> out(64);
  dequantize_row(packed.data(), scales.data(), gs, 64, out.data());
  EXPECT_NEAR(out[40], 3e4f, 3e4f * 1e-6f);
}

TEST(Nvfp4, DequantizedRowsReproduceTheQuantizerGrid) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  const int64_t n = 256;
  std::vector<float> w(n);
  for (float& v : w) v = bf16_to_f32(f32_to_bf16(nd(rng)));
  float amax = 0;
  for (float v : w) amax = std::max(amax, std::fabs(v));
  const float gs = global_scale_from_amax(amax);
  std::vector<uint8_t> packed(n / 2), scales(n / 16);
  quantize_row(w.data(), n, gs, packed.data(), scales.data());
  std::vector<float> out(n);
  dequantize_row(packed.data(), scales.data(), gs, n, out.data());
  for (int64_t i = 0; i < n; ++i) {
    const float m = block_multiplier(scales[i / 16], gs);
    const uint8_t code = i % 2 ? unpack_odd(packed[i / 2]) : unpack_even(packed[i / 2]);
    EXPECT_EQ(out[i], e2m1_to_f32(code) * m);
    EXPECT_EQ(code, e2m1_code(w[i] / m)) << i;
    // The block's grid spacing is at most 2 * m (between 4 and 6), so the error is <= m.
    EXPECT_LE(std::fabs(out[i] - w[i]), m * 1.0001f) << i;
  }
  // dot_row decodes block by block and agrees with the dequantized row.
  std::vector<float> x(n);
  for (float& v : x) v = nd(rng);
  double ref = 0;
  for (int64_t i = 0; i < n; ++i) ref += double(x[i]) * out[i];
  EXPECT_NEAR(dot_row(x.data(), packed.data(), scales.data(), gs, n), ref, 1e-6);
}

TEST(Nvfp4, QuantizeTensorReadsBf16RowsAndChecksShapes) {
  std::vector<uint16_t> bf(2 * 32);
  for (size_t i = 0; i < bf.size(); ++i) bf[i] = f32_to_bf16(float(int(i) - 20) * 0.25f);
  TensorView t{bf.data(), DType::BF16, Shape{2, 32}};
  const float amax = tensor_amax(t, "w");
  EXPECT_EQ(amax, 43 * 0.25f);
  std::vector<uint8_t> packed(32), scales(4);
  quantize_tensor(t, global_scale_from_amax(amax), packed, scales);
  std::vector<float> row(32), ref_packed_row(32);
  row_to_f32(t, 1, row.data());
  EXPECT_EQ(row[0], 12 * 0.25f);
  std::vector<uint8_t> p2(16), s2(2);
  quantize_row(row.data(), 32, global_scale_from_amax(amax), p2.data(), s2.data());
  EXPECT_TRUE(std::equal(p2.begin(), p2.end(), packed.begin() + 16));
  EXPECT_TRUE(std::equal(s2.begin(), s2.end(), scales.begin() + 2));
  std::vector<uint8_t> small(3);
  EXPECT_THROW(quantize_tensor(t, 1.0f, small, scales), Error);
  TensorView odd{bf.data(), DType::BF16, Shape{4, 8}};
  std::vector<uint8_t> p3(16), s3(2);
  EXPECT_THROW(quantize_tensor(odd, 1.0f, p3, s3), Error);  // 8 is not a multiple of 16
  bf[5] = 0x7fc0;  // NaN
  EXPECT_THROW(tensor_amax(t, "w"), Error);
}

TEST(Nvfp4, ThreadsGiveTheSameBytesAndFindTheFirstNan) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> bf(301 * 64);
  for (auto& v : bf) v = f32_to_bf16(nd(rng));
  TensorView t{bf.data(), DType::BF16, Shape{301, 64}};
  ThreadPool pool(4);
  const float amax = tensor_amax(t, "w");
  EXPECT_EQ(tensor_amax(t, "w", &pool), amax);
  std::vector<uint8_t> p1(301 * 32), s1(301 * 4), p2(301 * 32), s2(301 * 4);
  quantize_tensor(t, global_scale_from_amax(amax), p1, s1);
  quantize_tensor(t, global_scale_from_amax(amax), p2, s2, &pool);
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(s1, s2);
  bf[250 * 64 + 9] = 0x7f80;  // +Inf
  bf[120 * 64 + 3] = 0xffc0;  // NaN, the first one
  try {
    tensor_amax(t, "w", &pool);
    FAIL() << "NaN not found";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 120, column 3"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tetra
