// Dummy weights on the CPU, value for value what the CUDA backend draws (core/dummy_random.h).
#include "core/dummy_random.h"
#include "ops/cpu/cpu_backend.h"

namespace tetra::ops::cpu {

void fill_random(TensorView t, const RandomFill& fill, uint64_t seed) {
  const int64_t n = t.numel();
  if (fill.kind == RandomFill::Bytes) {
    TETRA_CHECK(dtype_bits(t.dtype) == 8 || t.dtype == DType::U8, "random bytes need a byte tensor, not ",
                dtype_name(t.dtype));
    TETRA_CHECK(fill.span >= 1 && fill.lo >= 0 && fill.lo + fill.span <= 256, "random bytes out of range");
    auto* p = t.as<uint8_t>();
    for (int64_t i = 0; i < n; ++i) p[i] = dummy_byte(seed, uint64_t(i), fill.lo, fill.span);
    return;
  }
  const float offset = fill.kind == RandomFill::NearOne ? 1.0f : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = offset + fill.scale * dummy_normal(seed, uint64_t(i));
    switch (t.dtype) {
      case DType::F32: t.as<float>()[i] = v; break;
      case DType::BF16: t.as<uint16_t>()[i] = f32_to_bf16(v); break;
      case DType::F16: t.as<uint16_t>()[i] = f32_to_f16(v); break;
      case DType::F8_E4M3: t.as<uint8_t>()[i] = f32_to_e4m3(v); break;  // a random FP8 KV cache
      default: fail("random values need an F32, BF16, F16 or F8_E4M3 tensor, not ", dtype_name(t.dtype));
    }
  }
}

}  // namespace tetra::ops::cpu
