// Reading and writing the backend's float-like element types in kernels: activations are
// BF16, some outputs F32, stored weights BF16, F16 or F32, an FP8 KV cache E4M3. The dtype is
// a kernel argument; branching on it is uniform across the grid.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "core/dtype.h"

namespace tetra::ops::cuda {

// E4M3 (float8_e4m3fn) to f32: bias 7, subnormals below exponent 1, 0x7f/0xff NaN.
__device__ __forceinline__ float e4m3_to_float(uint8_t v) {
  const uint32_t sign = uint32_t(v & 0x80) << 24;
  const int exp = (v >> 3) & 0xf, man = v & 7;
  if (exp == 0xf && man == 7) return __uint_as_float(0x7fc00000u);
  float mag = exp == 0 ? float(man) * 0.001953125f  // man / 8 * 2^-6
                       : __uint_as_float(uint32_t(exp - 7 + 127) << 23) * (1.0f + float(man) * 0.125f);
  return __uint_as_float(__float_as_uint(mag) | sign);
}

// f32 to E4M3, round to nearest even, saturating at +-448 (NaN stays NaN): core/dtype.h's
// f32_to_e4m3, which the CPU backend's FP8 cache uses.
__device__ __forceinline__ uint8_t float_to_e4m3(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float load_float(const void* p, int64_t i, DType dt) {
  switch (dt) {
    case DType::BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::F16: return __half2float(static_cast<const __half*>(p)[i]);
    case DType::F8_E4M3: return e4m3_to_float(static_cast<const uint8_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void store_float(void* p, int64_t i, DType dt, float v) {
  switch (dt) {
    case DType::BF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v); break;
    case DType::F16: static_cast<__half*>(p)[i] = __float2half(v); break;
    case DType::F8_E4M3: static_cast<uint8_t*>(p)[i] = float_to_e4m3(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

// The element types a kernel templated on its type (F32 or BF16) reads and writes: f32 in,
// rounded to nearest even once on the way out.
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// v as a tensor of `dt` holds it: what store_float then load_float would give back.
__device__ __forceinline__ float round_to(DType dt, float v) {
  switch (dt) {
    case DType::BF16: return __bfloat162float(__float2bfloat16(v));
    case DType::F16: return __half2float(__float2half(v));
    case DType::F8_E4M3: return e4m3_to_float(float_to_e4m3(v));
    default: return v;
  }
}

// Rope's rotation of a pair (x1, x2) by (c, s), its roundings written out: x1 c - x2 s as two
// products and a subtraction, x2 c + x1 s as a product and an fma. Every kernel that rotates
// (rope, the fused attention-input steps) calls these, so none depends on where the compiler
// would contract a product into an fma, and their results are the same bits.
__device__ __forceinline__ float rotate_first(float x1, float x2, float c, float s) {
  return __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
}
__device__ __forceinline__ float rotate_second(float x1, float x2, float c, float s) {
  return __fmaf_rn(x2, c, __fmul_rn(x1, s));
}

// What a KV cache of `dt` stores for v: an FP8 cache holds v / scale (ops::KvCacheLayer's
// per-tensor k_scale or v_scale); the others hold v itself, as the CPU backend's do.
__device__ __forceinline__ float to_cache_value(float v, DType dt, float scale) {
  return dt == DType::F8_E4M3 ? v / scale : v;
}

__device__ __forceinline__ float bf16_bits_to_float(uint16_t b) {
  return __uint_as_float(uint32_t(b) << 16);
}

// E2M1 (FP4): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, computed (a table indexed at
// run time would sit in local memory).
__device__ __forceinline__ float e2m1_to_float(uint32_t nibble) {
  const uint32_t e = (nibble >> 1) & 3, f = nibble & 1;
  const float v = e == 0 ? 0.5f * float(f) : __uint_as_float((e + 126) << 23) * (1.0f + 0.5f * float(f));
  return (nibble & 8) ? -v : v;
}

}  // namespace tetra::ops::cuda
