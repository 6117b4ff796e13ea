// NVFP4 as NVIDIA Model Optimizer (ModelOpt) writes it (FORMATS.md §3.2): E2M1 codes packed
// two a byte, one E4M3 scale per 16 elements along the input dimension, one F32 global scale
// per tensor. The rounding here reproduces ModelOpt's export bit for bit
// (modelopt/torch/quantization/qtensor/nvfp4_tensor.py: get_weights_scaling_factor_2,
// get_weights_scaling_factor, _cast_fp4, quantize); tools/nvfp4_ref.py is the same algorithm
// in numpy and the tests compare the two byte for byte.
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace tetra {
class ThreadPool;
}

namespace tetra::nvfp4 {

inline constexpr int kBlockSize = 16;           // elements per E4M3 block scale, along n_in
inline constexpr int kBlockBytes = kBlockSize / 2;  // packed bytes per block
inline constexpr float kE2m1Max = 6.0f;
inline constexpr float kE4m3Max = 448.0f;
// ModelOpt clamps a block scale to [2^-9, 448] before the E4M3 cast (_cast_per_block_scale_to_fp8,
// since May 2026) so that a block far below the tensor's amax keeps a non-zero (subnormal) scale;
// older exports cast without the clamp, giving such blocks (scale < 2^-10) a zero scale.
inline constexpr float kE4m3MinSubnormal = 0x1p-9f;
static_assert(kBlockSize % 2 == 0 && kBlockBytes == 8, "a block is 16 codes in 8 bytes");

// ---- E2M1 codes ----

// The E2M1 code of x exactly as ModelOpt's _cast_fp4: the ordinal is the number of the bounds
// {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5} strictly below |x|, plus one when |x| is exactly 0.75,
// 1.75 or 3.5. Ties therefore go 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4
// (round half to even on the E2M1 grid) and |x| > 5 gives 6. The sign bit (bit 3) is set for
// x < 0, so a small negative value that rounds to zero keeps code 8, while -0.0 gives code 0.
// x must not be NaN.
uint8_t e2m1_code(float x);

// Byte b holds elements 2i (low nibble) and 2i+1 (high nibble).
inline uint8_t pack_pair(uint8_t even, uint8_t odd) { return uint8_t((even & 0xf) | (odd << 4)); }
inline uint8_t unpack_even(uint8_t byte) { return byte & 0xf; }
inline uint8_t unpack_odd(uint8_t byte) { return byte >> 4; }

// ---- dequantization (shared by the CPU backend and the tests) ----

// The scale one block's codes multiply: f32(e4m3 block scale) * global_scale, rounded to f32
// once, as ModelOpt's dequantize forms per_block_scale before multiplying the codes.
inline float block_multiplier(uint8_t block_scale_e4m3, float global_scale) {
  return e4m3_to_f32(block_scale_e4m3) * global_scale;
}

// Decodes one block: out[j] = e2m1(code j) * block_multiplier. `packed` is 8 bytes.
void dequantize_block(const uint8_t* packed, uint8_t block_scale_e4m3, float global_scale,
                      float out[kBlockSize]);

// Decodes one row of n_in elements (n_in % 16 == 0): `packed` holds n_in/2 bytes,
// `block_scales` n_in/16 E4M3 bytes.
void dequantize_row(const uint8_t* packed, const uint8_t* block_scales, float global_scale,
                    int64_t n_in, float* out);

// dot(x, W_row) over one row, decoding block by block (no dequantized copy of the row).
// Sums in f32 block by block; the CPU backend's reference matmul.
float dot_row(const float* x, const uint8_t* packed, const uint8_t* block_scales,
              float global_scale, int64_t n_in);

// ---- quantization ----

// max |x| over a BF16, F16 or F32 tensor; throws naming `what` if the tensor holds NaN or Inf
// (ModelOpt's formula would write NaN scales for it). Rows are split over `pool` when given.
float tensor_amax(TensorView t, std::string_view what, ThreadPool* pool = nullptr);

// weight_scale_2 = amax / (6 * 448) in f32.
inline float global_scale_from_amax(float amax) { return amax / (kE2m1Max * kE4m3Max); }

// The E4M3 block scale of a block whose max |w| is block_amax, under global_scale:
// block_amax / f32(6 * global_scale); 0 becomes 1.0; clamped to [2^-9, 448]; cast with
// round-to-nearest-even. A zero global scale (an all-zero tensor, where ModelOpt's formula
// divides 0 by 0) gives 1.0.
uint8_t block_scale_code(float block_amax, float global_scale);

// Quantizes one row of n_in (n_in % 16 == 0) f32 values (exact images of the source BF16) with
// the given global scale; writes n_in/2 packed bytes and n_in/16 block scales.
// Each code is e2m1_code(w / f32(f32(block_scale) * global_scale)); with a zero global scale
// (only an all-zero tensor) every code is 0.
void quantize_row(const float* w, int64_t n_in, float global_scale, uint8_t* packed,
                  uint8_t* block_scales);

// The quantized form of one [n_out, n_in] weight, written into caller-provided buffers:
// packed U8 [n_out, n_in/2] (2 e2m1 codes per byte, low nibble = even index),
// block_scales F8_E4M3 [n_out, n_in/16].
// `weight` is BF16, F16 or F32 [n_out, n_in]; global_scale usually
// global_scale_from_amax(tensor_amax(weight)), or the shared one of a gate/up pair.
// Rows are independent, so splitting them over `pool` gives the same bytes.
void quantize_tensor(TensorView weight, float global_scale, std::span<uint8_t> packed,
                     std::span<uint8_t> block_scales, ThreadPool* pool = nullptr);

// Converts element i of a BF16/F16/F32 row to f32 (exact).
void row_to_f32(TensorView t, int64_t row, float* out);

}  // namespace tetra::nvfp4
