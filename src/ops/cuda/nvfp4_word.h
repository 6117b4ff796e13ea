// The device word of the MoE experts' NVFP4 codes (moe_internal.h's layout): eight values of a
// row in one 32-bit word, their bits placed so the kernels turn a word into four bf16 pairs
// with few integer instructions. Host and device code alike, so the CPU tests check the very
// functions the kernels run.
//
// A checkpoint word holds value i at bits 4i..4i+3: the 2-bit exponent and 1-bit mantissa
// (the "magnitude", bits 0..2 of the nibble) under the sign (bit 3). A bf16 pair reads a
// value's magnitude at bits 6..8 (22..24: the exponent's two low bits and the mantissa's top
// bit) and its sign at bit 15 (31) as the e2m1 value times 2^-126, e = 0 being the bf16
// subnormal; the kernels' block-scale multiply puts the 2^126 back. So the device word keeps
// values 2o and 2o+1 of pair o (0..3) with their magnitudes at bits 3o..3o+2 and 16+3o.. and
// their signs at 12 + (o ^ 1) and 28 + (o ^ 1). Pair o is then
//   (q rotated left by 6 - 3o) & 0x01c001c0  |  (q rotated left by 3 - (o ^ 1)) & 0x80008000,
// and for pairs 1 and 2 the two rotations are one: four pairs in 6 logic operations and 5
// shifts, where the earlier order (a whole nibble per value, shifted into place) took 15.
// wgmma's lanes each need a different pair (their own t): the same form with per-lane
// rotations, 4 instructions a pair, as the earlier order took.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace tetra::ops::cuda {

// Where the bits of value i (0..7) of a device word are.
struct Nvfp4ValueBits {
  int mantissa, exp_lo, exp_hi, sign;
};

TETRA_HOST_DEVICE constexpr Nvfp4ValueBits nvfp4_value_bits(int i) {
  const int half = 16 * (i & 1), o = i >> 1;
  return {3 * o + half, 3 * o + 1 + half, 3 * o + 2 + half, 12 + (o ^ 1) + half};
}

// The checkpoint word in device order.
TETRA_HOST_DEVICE constexpr uint32_t nvfp4_device_word(uint32_t checkpoint_word) {
  uint32_t out = 0;
  for (int i = 0; i < 8; ++i) {
    const uint32_t n = (checkpoint_word >> (4 * i)) & 0xfu;
    const Nvfp4ValueBits b = nvfp4_value_bits(i);
    out |= (n & 1u) << b.mantissa | ((n >> 1) & 1u) << b.exp_lo | ((n >> 2) & 1u) << b.exp_hi |
           ((n >> 3) & 1u) << b.sign;
  }
  return out;
}

// The checkpoint's 4-bit code of value i of a device word.
TETRA_HOST_DEVICE constexpr uint32_t nvfp4_device_code(uint32_t device_word, int i) {
  const Nvfp4ValueBits b = nvfp4_value_bits(i);
  return ((device_word >> b.mantissa) & 1u) | ((device_word >> b.exp_lo) & 1u) << 1 |
         ((device_word >> b.exp_hi) & 1u) << 2 | ((device_word >> b.sign) & 1u) << 3;
}

inline constexpr uint32_t kNvfp4MagnitudeBits = 0x01c001c0u;  // bf16 pair bits 6..8, 22..24
inline constexpr uint32_t kNvfp4SignBits = 0x80008000u;       // bits 15, 31

// Rotations of pair o that bring its magnitudes and its signs into place.
TETRA_HOST_DEVICE constexpr uint32_t nvfp4_magnitude_rotation(int pair) { return uint32_t(6 - 3 * pair) & 31u; }
TETRA_HOST_DEVICE constexpr uint32_t nvfp4_sign_rotation(int pair) { return uint32_t(3 - (pair ^ 1)); }

// q rotated left by r (0..31): one funnel shift on the device.
TETRA_HOST_DEVICE inline uint32_t nvfp4_rotl(uint32_t q, uint32_t r) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_l(q, q, r);
#else
  r &= 31u;
  return r == 0 ? q : (q << r) | (q >> (32u - r));
#endif
}

// Values 2p and 2p+1 of a device word as a raw bf16 pair (each the e2m1 value times 2^-126).
// The rotations are constants here: pairs 0..2 shift left, pair 3's magnitudes shift right.
// Written out rather than as the per-lane form below with constant rotations: given that, nvcc
// keeps funnel shifts on the integer pipe and two ANDs for pairs 1 and 2 (the fused kernel at
// glm5 T = 1 measured 8% slower, docs/PERF.md).
template <int kPair>
TETRA_HOST_DEVICE constexpr uint32_t nvfp4_pair_raw(uint32_t q) {
  static_assert(kPair >= 0 && kPair < 4, "a word holds four pairs");
  constexpr uint32_t kMag = nvfp4_magnitude_rotation(kPair), kSign = nvfp4_sign_rotation(kPair);
  if constexpr (kMag == kSign) {
    return (q << kMag) & (kNvfp4MagnitudeBits | kNvfp4SignBits);
  } else {
    const uint32_t mag = kPair < 3 ? q << kMag : q >> (32u - kMag);
    return (mag & kNvfp4MagnitudeBits) | ((q << kSign) & kNvfp4SignBits);
  }
}

// The same for a pair chosen at run time (one per lane, as wgmma's A fragments want it).
struct Nvfp4PairDecode {
  uint32_t magnitude_rotation, sign_rotation;
};

TETRA_HOST_DEVICE constexpr Nvfp4PairDecode nvfp4_pair_decode(int pair) {
  return {nvfp4_magnitude_rotation(pair), nvfp4_sign_rotation(pair)};
}

TETRA_HOST_DEVICE inline uint32_t nvfp4_pair_raw(uint32_t q, const Nvfp4PairDecode& d) {
  return (nvfp4_rotl(q, d.magnitude_rotation) & kNvfp4MagnitudeBits) |
         (nvfp4_rotl(q, d.sign_rotation) & kNvfp4SignBits);
}

}  // namespace tetra::ops::cuda
