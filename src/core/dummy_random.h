// Counter-based random values for dummy weights (--load-format dummy): value i of a tensor
// drawn from `seed` is a pure function of (seed, i), so every backend draws the same
// weights and a dummy model is the same model on the CPU and on the GPU. constexpr so CUDA
// kernels call it too (nvcc --expt-relaxed-constexpr).
#pragma once

#include <cstdint>

namespace tetra {

constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

constexpr uint64_t dummy_bits(uint64_t seed, uint64_t index) {
  return splitmix64(splitmix64(seed) + index);
}

// About N(0, 1): the sum of four uniforms (Irwin-Hall), centred and scaled. Its tails stop
// at +-3.46, which dummy weights do not miss; it needs no log or cos, so it is constexpr.
constexpr float dummy_normal(uint64_t seed, uint64_t index) {
  const uint64_t h = dummy_bits(seed, index);
  float sum = 0.0f;
  for (int k = 0; k < 4; ++k) sum += (float((h >> (16 * k)) & 0xffffu) + 0.5f) * (1.0f / 65536.0f);
  return (sum - 2.0f) * 1.7320508f;
}

// A byte uniform in [lo, lo + span), span in 1..256.
constexpr uint8_t dummy_byte(uint64_t seed, uint64_t index, int lo, int span) {
  return uint8_t(lo + int(dummy_bits(seed, index) % uint64_t(span)));
}

}  // namespace tetra
