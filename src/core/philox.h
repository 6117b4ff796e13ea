// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator. Its output is a pure function of (key, counter), so a token drawn at
// a sequence position gets the same bits on the CPU and the GPU, in any batch, in any order.
// Header-only and free of CUDA headers: nvcc compiles the same functions for the device.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace tetra {

struct PhiloxCounter {
  uint32_t v[4];
};
struct PhiloxKey {
  uint32_t v[2];
};

inline constexpr uint32_t kPhiloxMul0 = 0xD2511F53u;   // round multipliers
inline constexpr uint32_t kPhiloxMul1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxWeyl0 = 0x9E3779B9u;  // key increments between rounds
inline constexpr uint32_t kPhiloxWeyl1 = 0xBB67AE85u;
inline constexpr int kPhiloxRounds = 10;

// Random123's philox4x32_R(10, counter, key): the key is bumped before rounds 2..10.
TETRA_HOST_DEVICE inline PhiloxCounter philox4x32_10(PhiloxCounter ctr, PhiloxKey key) {
  for (int round = 0; round < kPhiloxRounds; ++round) {
    if (round > 0) {
      key.v[0] += kPhiloxWeyl0;
      key.v[1] += kPhiloxWeyl1;
    }
    const uint64_t prod0 = uint64_t(kPhiloxMul0) * ctr.v[0];
    const uint64_t prod1 = uint64_t(kPhiloxMul1) * ctr.v[2];
    ctr = PhiloxCounter{{uint32_t(prod1 >> 32) ^ ctr.v[1] ^ key.v[0], uint32_t(prod1),
                         uint32_t(prod0 >> 32) ^ ctr.v[3] ^ key.v[1], uint32_t(prod0)}};
  }
  return ctr;
}

// The sampling rule's one uniform per token: a double in [0, 1) with 53 random bits, keyed by
// the request's seed at counter (position, 0). Every backend draws through this function.
TETRA_HOST_DEVICE inline double uniform_double(uint64_t seed, int64_t position) {
  const uint64_t pos = uint64_t(position);
  const PhiloxCounter out = philox4x32_10(PhiloxCounter{{uint32_t(pos), uint32_t(pos >> 32), 0u, 0u}},
                                          PhiloxKey{{uint32_t(seed), uint32_t(seed >> 32)}});
  const uint64_t bits53 = (uint64_t(out.v[0]) << 21) ^ (out.v[1] >> 11);
  return double(bits53) * 0x1p-53;
}

}  // namespace tetra
