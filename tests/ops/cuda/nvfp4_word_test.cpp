// The MoE experts' NVFP4 device word (ops/cuda/nvfp4_word.h), checked on the CPU: the word
// order keeps every value's code, and the pair decodes the kernels run give each value's e2m1
// number (times 2^-126) for every code in every position. The GPU tests check the kernels
// against the dequantized weights; this checks the bit algebra they rest on.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "core/dtype.h"
#include "ops/cuda/nvfp4_word.h"

namespace tetra::ops::cuda {
namespace {

// A raw bf16 (its 16 bits) times 2^126, which the kernels' scale multiply puts back.
double raw_bf16_value(uint32_t bits) { return std::ldexp(double(bf16_to_f32(uint16_t(bits))), 126); }

uint32_t pair_raw(uint32_t q, int pair) {
  switch (pair) {
    case 0: return nvfp4_pair_raw<0>(q);
    case 1: return nvfp4_pair_raw<1>(q);
    case 2: return nvfp4_pair_raw<2>(q);
    default: return nvfp4_pair_raw<3>(q);
  }
}

TEST(Nvfp4Word, IsAPermutationOfTheBits) {
  std::set<uint32_t> seen;
  for (int b = 0; b < 32; ++b) {
    const uint32_t out = nvfp4_device_word(1u << b);
    ASSERT_EQ(__builtin_popcount(out), 1) << "checkpoint bit " << b;
    seen.insert(out);
  }
  EXPECT_EQ(seen.size(), 32u);
}

TEST(Nvfp4Word, KeepsEveryValuesCode) {
  std::mt19937 rng(3);
  for (int n = 0; n < 10000; ++n) {
    const uint32_t w = uint32_t(rng());
    const uint32_t q = nvfp4_device_word(w);
    for (int i = 0; i < 8; ++i) ASSERT_EQ(nvfp4_device_code(q, i), (w >> (4 * i)) & 0xfu) << std::hex << w << " value " << i;
  }
}

// Every code in every position, beside random neighbours: the pair holding it decodes to its
// e2m1 number (sign included: code 8 is -0), in both the compile-time and the per-lane form.
TEST(Nvfp4Word, PairsDecodeToTheE2m1Values) {
  std::mt19937 rng(5);
  for (int i = 0; i < 8; ++i)
    for (uint32_t code = 0; code < 16; ++code)
      for (int n = 0; n < 64; ++n) {
        const uint32_t w = (uint32_t(rng()) & ~(0xfu << (4 * i))) | code << (4 * i);
        const uint32_t q = nvfp4_device_word(w);
        const int pair = i / 2, half = i % 2;
        const uint32_t fixed = pair_raw(q, pair), lane = nvfp4_pair_raw(q, nvfp4_pair_decode(pair));
        ASSERT_EQ(fixed, lane) << "pair " << pair;
        const uint32_t bits = (fixed >> (16 * half)) & 0xffffu;
        const double want = e2m1_to_f32(uint8_t(code));
        ASSERT_EQ(raw_bf16_value(bits), want) << "value " << i << " code " << code;
        ASSERT_EQ(std::signbit(raw_bf16_value(bits)), bool(code & 8u)) << "value " << i << " code " << code;
      }
}

// The four pairs read disjoint bits that cover the word: no bit is decoded twice or dropped.
TEST(Nvfp4Word, PairsUseEachBitOnce) {
  for (int b = 0; b < 32; ++b) {
    int hits = 0;
    for (int p = 0; p < 4; ++p) hits += pair_raw(1u << b, p) != 0;
    EXPECT_EQ(hits, 1) << "device bit " << b;
  }
}

}  // namespace
}  // namespace tetra::ops::cuda
