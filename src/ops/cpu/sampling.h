// Backend::sample on the CPU, the reference for every other backend, and the arithmetic of the
// sampling rule that every backend shares.
//
// The rule (for one row of raw logits l[0, V) and its SamplingRow r):
//   1. z = l, except at each of the row's penalty entries (a token of the prompt or of the
//      output, with its count in the output): there, with repetition penalty rp != 1, first
//      l / rp where l > 0 and l * rp elsewhere (vLLM's rule; a finite result stays finite),
//      then, for a count above 0, minus presence + frequency * count (output tokens only, as
//      in OpenAI's API and vLLM).
//   2. temperature <= 0: the first index of max(z).
//   3. Otherwise: candidates C = { z >= the top_k-th largest z } (all when top_k is 0 or >= V;
//      ties at the threshold stay); each candidate weighs p = exp((z - max z) * (1 / T)); with
//      top_p < 1, N = { z in C >= theta_p }, theta_p the largest value whose mass at or above
//      it reaches top_p of C's mass (else N = C); u from uniform_double(seed, position); the
//      token is the first id of N, in id order, whose running mass exceeds u * mass(N) (the
//      last id of N if none does).
//   4. logprob = l[token] - logsumexp(l); 5. the n_top_logprobs largest raw logits, by value
//      descending then id ascending, with theirs.
//
// Bit-identical backends: a candidate's weight is computed with the same IEEE float operations
// everywhere (exp_nonpositive below, never a library exp, never fused into an FMA) and then
// rounded to a multiple of 2^-40, so masses add as integers: exactly, in any order, on any
// thread. The CPU and the CUDA kernel therefore pick the same token for the same row, bit for
// bit; a parity failure is a bug, never rounding. Rounding a weight to 2^-40 moves any token's
// probability by less than 2^-41 of the top token's.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/philox.h"
#include "core/tensor.h"
#include "ops/ops.h"

// GCC fuses a * b + c across statements when the target has FMA (-march=native); the shared
// arithmetic must round every operation on its own, as the device's _rn intrinsics do.
#if !defined(__CUDA_ARCH__) && defined(__GNUC__) && !defined(__clang__) && defined(__FMA__)
#define TETRA_SAMPLING_UNFUSED __attribute__((optimize("fp-contract=off")))
#else
#define TETRA_SAMPLING_UNFUSED
#endif

namespace tetra {
class ThreadPool;
}

namespace tetra::ops::sampling {

// Weights are fixed point with this many fractional bits: a weight is at most 1 (the top
// token's), so a row of up to 2^20 candidates sums below 2^60.
inline constexpr int kMassFractionBits = 40;

// IEEE single operations rounded one at a time. nvcc contracts a * b + c into an FMA unless
// the _rn intrinsics are used.
TETRA_HOST_DEVICE inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
TETRA_HOST_DEVICE inline float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
TETRA_HOST_DEVICE inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TETRA_HOST_DEVICE inline float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// The bits of a float and back.
TETRA_HOST_DEVICE inline uint32_t bits_of(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
#endif
}
TETRA_HOST_DEVICE inline float float_of(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
#endif
}

// e^a for a <= 0, within about 1 ulp: Cephes' expf (Cody-Waite reduction by ln 2, a degree-5
// polynomial). a below -80 (and -inf) counts as -80: e^-80 is far below the 2^-41 that a
// weight can still show, and 2^k stays a normal float, so no subnormal is ever formed and a
// device flushing them to zero computes the same bits. The clamp compares bits (the larger a
// negative float's magnitude, the larger its bits) because GCC vectorizes that loop and not
// a float comparison.
TETRA_HOST_DEVICE TETRA_SAMPLING_UNFUSED inline float exp_nonpositive(float a) {
  constexpr uint32_t kMinus80 = 0xC2A00000u;
  const uint32_t bits = bits_of(a);
  a = float_of(bits < kMinus80 ? bits : kMinus80);
  // Adding and removing 1.5 * 2^23 rounds to the nearest integer in plain float arithmetic.
  const float k = sub_rn(add_rn(mul_rn(a, 1.44269504088896341f), 12582912.0f), 12582912.0f);
  const float r = sub_rn(sub_rn(a, mul_rn(k, 0.693359375f)), mul_rn(k, -2.12194440e-4f));
  const float r2 = mul_rn(r, r);
  float y = 1.9875691500e-4f;
  y = add_rn(mul_rn(y, r), 1.3981999507e-3f);
  y = add_rn(mul_rn(y, r), 8.3334519073e-3f);
  y = add_rn(mul_rn(y, r), 4.1665795894e-2f);
  y = add_rn(mul_rn(y, r), 1.6666665459e-1f);
  y = add_rn(mul_rn(y, r), 5.0000001201e-1f);
  y = add_rn(add_rn(mul_rn(y, r2), r), 1.0f);
  return mul_rn(y, float_of(uint32_t(int(k) + 127) << 23));  // times 2^k
}

// A weight p in [0, 1] as an integer count of 2^-40, rounded half up: floor(p * 2^40 + 0.5).
// Computed as p * 2^20 = whole + fraction, then floor(fraction * 2^20 + 0.5): every float step
// is exact (each value fits 24 bits), and the loop over it vectorizes without 64-bit floats.
TETRA_HOST_DEVICE inline uint64_t mass_of(float p) {
  const float scaled = mul_rn(p, 0x1p20f);
  const int32_t whole = int32_t(scaled);
  const float fraction = sub_rn(scaled, float(whole));
  const int32_t low = int32_t(add_rn(mul_rn(fraction, 0x1p20f), 0.5f));
  return (uint64_t(uint32_t(whole)) << 20) + uint32_t(low);
}

// The repetition penalty of one logit: l / penalty where l > 0, else l * penalty. A finite
// logit stays finite (a huge penalty would overflow it to -inf, and a row whose every token
// were -inf would have nothing left to draw); -inf stays -inf.
TETRA_HOST_DEVICE inline float repetition_penalized(float logit, float penalty) {
  constexpr float kMax = 3.40282347e+38f;  // FLT_MAX
  const float z = logit > 0 ? div_rn(logit, penalty) : mul_rn(logit, penalty);
  if (z > kMax) return kMax;
  return z < -kMax && logit >= -kMax ? -kMax : z;
}

// Step 1 at one penalty entry: the repetition penalty (rp == 1 leaves l as it is), then for a
// token generated `count` > 0 times z - (presence + frequency * count), the sum rounded once.
TETRA_HOST_DEVICE inline float penalized(float logit, int32_t count, float repetition, float presence,
                                         float frequency) {
  const float z = repetition != 1.0f ? repetition_penalized(logit, repetition) : logit;
  if (count <= 0) return z;
#if defined(__CUDA_ARCH__)
  return __fsub_rn(z, __fmaf_rn(frequency, __int2float_rn(count), presence));
#else
  return z - std::fma(frequency, float(count), presence);
#endif
}

// 1 / T, once per row: weights multiply by it, a division per token being far slower.
TETRA_HOST_DEVICE inline float inverse_temperature(float temperature) { return div_rn(1.0f, temperature); }

// (z - max z) / T as (z - max z) * (1 / T), the exponent of a candidate's weight; monotone in z.
TETRA_HOST_DEVICE inline float scaled_logit(float z, float max_z, float inv_temperature) {
  return mul_rn(sub_rn(z, max_z), inv_temperature);
}

// A candidate's weight exp((z - max z) / T) in units of 2^-40.
TETRA_HOST_DEVICE inline uint64_t token_mass(float z, float max_z, float inv_temperature) {
  return mass_of(exp_nonpositive(scaled_logit(z, max_z, inv_temperature)));
}

// The mass the nucleus must reach: ceil(top_p * total), at least 1 and at most total.
TETRA_HOST_DEVICE inline uint64_t top_p_need(float top_p, uint64_t total) {
  const uint64_t need = uint64_t(ceil(double(top_p) * double(total)));
  return need < 1 ? 1 : (need > total ? total : need);
}

// The draw's target: the token is the first whose running mass exceeds it (an integer
// running mass exceeds u * kept exactly when it exceeds floor(u * kept)).
TETRA_HOST_DEVICE inline uint64_t draw_target(double u, uint64_t kept_mass) {
  return uint64_t(u * double(kept_mass));
}

}  // namespace tetra::ops::sampling

namespace tetra::ops::cpu {

// One token per row of logits F32 [R, V] (host memory) under rows[r] (ops.h's SamplingRow),
// written to out[r]. penalty_ids / penalty_counts [n_penalties] hold, at each row's
// [penalty_begin, penalty_begin + penalty_count), the distinct ids its penalties touch and how
// often each was generated (0: a prompt token only the repetition penalty reads).
// Rows run in parallel over `pool` (null: on the calling thread). Throws tetra::Error on a bad
// argument, before any row is written, and on a row holding NaN or +inf, or no logit that
// is finite after its penalties.
void sample_rows(ThreadPool* pool, TensorView logits, const SamplingRow* rows,
                 const int32_t* penalty_ids, const int32_t* penalty_counts, int64_t n_penalties,
                 SampledToken* out);

}  // namespace tetra::ops::cpu
