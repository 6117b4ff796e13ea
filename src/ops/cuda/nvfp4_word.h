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
//   values 2o and 2o+1 (o = 0, 1, 2): magnitude at bits 3o..3o+2 and 16+3o.., sign at 3o+9 and
//     16+3o+9, so that pair o is (q << (6 - 3o)) & 0x81c081c0: a shift and an AND;
//   values 6 and 7 in the bits left over: exponent at 10..11 (+16), mantissa at 13, sign at 14,
//     which take three shifts and three logic operations (no placement of these four bits does
//     it with fewer than three shifts).
// Eight values cost 11 integer instructions, where the earlier order (a whole nibble per
// value, shifted into place) took 15.
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
  if (o < 3) return {3 * o + half, 3 * o + 1 + half, 3 * o + 2 + half, 3 * o + 9 + half};
  return {13 + half, 10 + half, 11 + half, 14 + half};
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

// Values 2p and 2p+1 of a device word as a raw bf16 pair (each the e2m1 value times 2^-126).
template <int kPair>
TETRA_HOST_DEVICE constexpr uint32_t nvfp4_pair_raw(uint32_t q) {
  static_assert(kPair >= 0 && kPair < 4, "a word holds four pairs");
  if constexpr (kPair < 3) {
    return (q << (6 - 3 * kPair)) & 0x81c081c0u;
  } else {
    return ((q >> 3) & 0x01800180u) | ((q >> 7) & 0x00400040u) | ((q << 1) & 0x80008000u);
  }
}

// The same for a pair chosen at run time (one per lane, as wgmma's A fragments want it): the
// general form of both cases above, its shifts and masks fixed per lane.
struct Nvfp4PairDecode {
  uint32_t left, right_a, right_b;
  uint32_t mask_left, mask_a, mask_b;
};

TETRA_HOST_DEVICE constexpr Nvfp4PairDecode nvfp4_pair_decode(int pair) {
  if (pair < 3) return {uint32_t(6 - 3 * pair), 0, 0, 0x81c081c0u, 0, 0};
  return {1, 3, 7, 0x80008000u, 0x01800180u, 0x00400040u};
}

TETRA_HOST_DEVICE constexpr uint32_t nvfp4_pair_raw(uint32_t q, const Nvfp4PairDecode& d) {
  return ((q << d.left) & d.mask_left) | ((q >> d.right_a) & d.mask_a) | ((q >> d.right_b) & d.mask_b);
}

}  // namespace tetra::ops::cuda
