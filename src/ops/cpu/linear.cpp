// Linear layers on the CPU: each weight row is decoded from its stored format (BF16, F16,
// F32, NVFP4, FP8) into a small f32 buffer inside the loop, so no layer is ever expanded whole.
#include <algorithm>
#include <vector>

#include "formats/nvfp4.h"
#include "ops/cpu/cpu_backend.h"

namespace tetra::ops::cpu {

void decode_weight_row(const LinearWeight& w, int64_t row, float* out) {
  const int64_t k = w.n_in;
  if (k == 0) return;  // a rank's empty part of a split layer (fewer NVFP4 blocks than ranks)
  switch (w.format) {
    case WeightFormat::Dense:
      for (int64_t i = 0; i < k; ++i) out[i] = load_f32(w.weight, row * k + i);
      return;
    case WeightFormat::Nvfp4:
      // Block by block, in ModelOpt's order: e2m1 * f32(f32(scale) * weight_scale_2).
      nvfp4::dequantize_row(w.weight.as<const uint8_t>() + row * (k / 2),
                            w.block_scale.as<const uint8_t>() + row * (k / 16), w.global_scale, k, out);
      return;
    case WeightFormat::Fp8: {
      const uint8_t* codes = w.weight.as<const uint8_t>() + row * k;
      for (int64_t i = 0; i < k; ++i) out[i] = e4m3_to_f32(codes[i]) * w.global_scale;
      return;
    }
  }
}

namespace {

// Eight independent partial sums let the compiler vectorize without -ffast-math.
float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

}  // namespace

void linear_f32(ThreadPool* pool, const float* x, int64_t n_tokens, const LinearWeight& w,
                float* out) {
  const int64_t n_out = w.n_out, n_in = w.n_in;
  const bool has_bias = !w.bias.empty();
  pool->parallel_for(n_out, 8, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(n_in));
    for (int64_t r = r0; r < r1; ++r) {
      decode_weight_row(w, r, row.data());
      const float b = has_bias ? load_f32(w.bias, r) : 0.0f;
      for (int64_t t = 0; t < n_tokens; ++t)
        out[t * n_out + r] = dot(x + t * n_in, row.data(), n_in) + b;
    }
  });
}

}  // namespace tetra::ops::cpu
