// W4A8 expert linears on the CPU (--moe-activation-dtype fp8_e4m3): the maths a Hopper kernel
// with E4M3 tensor-core MMAs computes from NVFP4 weights, here in plain f32 so that its
// accuracy can be measured against W4A16 before any kernel exists.
//
// Activations: one scale per token per 128 input channels, amax / 448, the values e4m3(x / s)
// (DeepSeek-V3's FP8 recipe: a kernel finds the amax inside the tile that produces those 128
// channels, so no pass over the whole row is needed).
// Weights: the E4M3 MMA takes no per-16 scale, so each NVFP4 value is folded with its block
// scale into one E4M3 byte, e4m3(e2m1 * block_scale * 2^-e_row). e2m1 * block_scale is exact in
// f16/f32 (at most 5 significant bits), so the cast is the only rounding (up to 2^-4 of the
// value, on the codes 1.5, 3 and 6); 2^e_row puts the row's largest product in [224, 448), and
// 2^e_row * weight_scale_2 multiplies the row's sums at the end. The stream keeps its 4-bit
// bytes: the folding happens in registers, not at prepare time.
#include <algorithm>
#include <cmath>
#include <vector>

#include "formats/nvfp4.h"
#include "ops/cpu/cpu_backend.h"

namespace tetra::ops::cpu {
namespace {

float round_to_e4m3(float x) { return e4m3_to_f32(f32_to_e4m3(x)); }

// The exponent e with the row's largest |e2m1 * block_scale| * 2^-e in [224, 448); 0 for a
// row of zero scales.
int row_exponent(const uint8_t* block_scales, int64_t n_blocks) {
  float largest = 0;
  for (int64_t b = 0; b < n_blocks; ++b) largest = std::max(largest, e4m3_to_f32(block_scales[b]));
  if (largest == 0) return 0;
  int e = 0;
  std::frexp(nvfp4::kE2m1Max * largest / nvfp4::kE4m3Max, &e);  // 6 * largest / 448 in [2^(e-1), 2^e)
  return e;
}

// Row `row` as the E4M3 MMA reads it (the folded bytes, decoded to f32), and the multiplier of
// its sums, 2^e_row * weight_scale_2.
float fold_weight_row(const LinearWeight& w, int64_t row, float* out) {
  const int64_t k = w.n_in, n_blocks = k / nvfp4::kBlockSize;
  const uint8_t* scales = w.block_scale.as<const uint8_t>() + row * n_blocks;
  const int e = row_exponent(scales, n_blocks);
  // The NVFP4 row under a global scale of 2^-e: e2m1 * (block_scale * 2^-e), each product exact.
  nvfp4::dequantize_row(w.weight.as<const uint8_t>() + row * (k / 2), scales, std::ldexp(1.0f, -e), k, out);
  for (int64_t i = 0; i < k; ++i) out[i] = round_to_e4m3(out[i]);
  return std::ldexp(w.global_scale, e);
}

}  // namespace

Fp8Activations quantize_activations_fp8(const float* x, int64_t n_tokens, int64_t n_in) {
  const int64_t groups = (n_in + kFp8ActivationGroup - 1) / kFp8ActivationGroup;
  Fp8Activations a{.values = std::vector<float>(size_t(n_tokens * n_in)),
                   .scales = std::vector<float>(size_t(n_tokens * groups)),
                   .n_in = n_in,
                   .groups = groups};
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k0 = g * kFp8ActivationGroup, k1 = std::min(n_in, k0 + kFp8ActivationGroup);
      float amax = 0;
      for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::abs(x[t * n_in + k]));
      const float s = amax > 0 ? amax / nvfp4::kE4m3Max : 1.0f;
      a.scales[size_t(t * groups + g)] = s;
      for (int64_t k = k0; k < k1; ++k) a.values[size_t(t * n_in + k)] = round_to_e4m3(x[t * n_in + k] / s);
    }
  return a;
}

void linear_w4a8(ThreadPool* pool, const float* x, int64_t n_tokens, const LinearWeight& w, float* out) {
  TETRA_CHECK(w.format == WeightFormat::Nvfp4, "W4A8 linears take NVFP4 weights");
  const int64_t n_out = w.n_out, n_in = w.n_in;
  const Fp8Activations a = quantize_activations_fp8(x, n_tokens, n_in);
  const bool has_bias = !w.bias.empty();
  pool->parallel_for(n_out, 8, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(n_in));
    for (int64_t r = r0; r < r1; ++r) {
      const float row_multiplier = fold_weight_row(w, r, row.data());
      const float b = has_bias ? load_f32(w.bias, r) : 0.0f;
      for (int64_t t = 0; t < n_tokens; ++t) {
        // Each group's sum is scaled as the MMA's f32 accumulator would be promoted.
        float acc = 0;
        for (int64_t g = 0; g < a.groups; ++g) {
          const int64_t k0 = g * kFp8ActivationGroup, k1 = std::min(n_in, k0 + kFp8ActivationGroup);
          float part = 0;
          for (int64_t k = k0; k < k1; ++k) part += a.values[size_t(t * n_in + k)] * row[size_t(k)];
          acc += part * a.scales[size_t(t * a.groups + g)];
        }
        out[t * n_out + r] = acc * row_multiplier + b;
      }
    }
  });
}

}  // namespace tetra::ops::cpu
