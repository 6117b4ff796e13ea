// Division by a divisor known only at run time but fixed for a whole launch (a KV block size),
// as one high multiply and a shift: a kernel's integer division by a variable is a
// reciprocal-and-correct sequence of some twenty instructions.
//
// For 1 <= d <= 2^31 with l = ceil(log2 d) and m = ceil(2^(31 + l) / d) (which fits 32 bits),
// floor(n / d) = floor(n m / 2^(31 + l)) for every 0 <= n < 2^31: m exceeds 2^(31 + l) / d by
// less than 1, so n m / 2^(31 + l) exceeds n / d by less than 2^-l <= 1 / d, never enough to
// reach the next integer. tests/core/fast_divide_test.cpp checks it against `/`.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace tetra {

struct FastDivisor {
  uint32_t divisor = 1, multiplier = 0;
  int shift = 0;  // of the high word of n * multiplier: l - 1 (unused for a divisor of 1)

  FastDivisor() = default;
  explicit FastDivisor(uint32_t d) : divisor(d) {
    int l = 0;
    while ((uint64_t(1) << l) < d) ++l;
    if (l > 0) {
      multiplier = uint32_t(((uint64_t(1) << (31 + l)) + d - 1) / d);
      shift = l - 1;
    }
  }

  // floor(n / divisor), n in [0, 2^31).
  TETRA_HOST_DEVICE uint32_t quotient(uint32_t n) const {
    if (divisor == 1) return n;
#if defined(__CUDA_ARCH__)
    return __umulhi(n, multiplier) >> shift;
#else
    return uint32_t((uint64_t(n) * multiplier) >> 32) >> shift;
#endif
  }
  TETRA_HOST_DEVICE uint32_t remainder(uint32_t n, uint32_t q) const { return n - q * divisor; }
};

}  // namespace tetra
