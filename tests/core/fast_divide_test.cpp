// FastDivisor against the `/` and `%` it replaces: every divisor a KV block size may take, with
// every small dividend and random ones up to 2^31, and random divisors up to 2^31.
#include <gtest/gtest.h>

#include <random>

#include "core/fast_divide.h"

namespace tetra {
namespace {

void expect_divides(const FastDivisor& f, uint32_t n) {
  const uint32_t q = f.quotient(n);
  ASSERT_EQ(q, n / f.divisor) << n << " / " << f.divisor;
  ASSERT_EQ(f.remainder(n, q), n % f.divisor) << n << " % " << f.divisor;
}

TEST(FastDivide, EveryBlockSizeEveryKeyUpTo65536) {
  for (uint32_t d = 1; d <= 1024; ++d) {
    const FastDivisor f(d);
    for (uint32_t n = 0; n <= 65536; ++n) expect_divides(f, n);
  }
}

TEST(FastDivide, LargeDividendsAndDivisors) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> dividend(0, 0x7fffffffu), divisor(1, 0x80000000u);
  for (uint32_t d : {1u, 2u, 3u, 7u, 16u, 1000u, 1024u, 0x7fffffffu, 0x80000000u}) {
    const FastDivisor f(d);
    for (uint32_t n : {0u, 1u, d - 1, d, 0x7ffffffeu, 0x7fffffffu}) expect_divides(f, n);
    for (int i = 0; i < 100000; ++i) expect_divides(f, dividend(rng));
  }
  for (int i = 0; i < 2000; ++i) {
    const FastDivisor f(divisor(rng));
    for (int j = 0; j < 100; ++j) expect_divides(f, dividend(rng));
    expect_divides(f, 0x7fffffffu);
  }
}

}  // namespace
}  // namespace tetra
