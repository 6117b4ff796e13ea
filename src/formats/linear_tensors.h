// The tensors of one linear module as a checkpoint stores them, found by the module's format
// in the quant config and checked against the shape the model config expects (FORMATS.md
// §3.2). Views point into the checkpoint's mapping. The model loader turns this into an
// ops::LinearWeight field for field (formats does not depend on ops).
#pragma once

#include <cstdint>
#include <string_view>

#include "core/tensor.h"
#include "formats/quant_config.h"

namespace tetra {

class Checkpoint;

struct LinearTensors {
  QuantAlgo algo = QuantAlgo::None;
  int64_t n_out = 0, n_in = 0;
  // None: BF16/F16/F32 [n_out, n_in].
  // NVFP4: U8 [n_out, n_in/2], 2 e2m1 codes per byte, low nibble = even index.
  // FP8:   F8_E4M3 [n_out, n_in].
  TensorView weight;
  TensorView block_scale;     // NVFP4 only: F8_E4M3 [n_out, n_in/16], row-major (not swizzled)
  float global_scale = 1.0f;  // NVFP4: weight_scale_2; FP8: weight_scale
  float input_scale = 0.0f;   // static activation scale (NVFP4 W4A4, FP8); 0 when absent
  TensorView bias;            // [n_out] when the module has one
};

// Reads `<module>.weight` and, by the module's format under `quant` (null: not quantized),
// `.weight_scale`, `.weight_scale_2`, `.input_scale`, and an optional `.bias`. Every dtype and
// shape is checked; a mismatch or a missing tensor is a tetra::Error naming the file and the
// tensor. NVFP4 requires input_scale (W4A4 kernels need it); W4A16_NVFP4 ignores it.
LinearTensors load_linear(const Checkpoint& ckpt, const QuantConfig* quant,
                          std::string_view module, int64_t n_out, int64_t n_in);

// W[r, :] as f32, whatever the format (the slow reference the tests and tools compare with).
void linear_row_to_f32(const LinearTensors& w, int64_t row, float* out);

}  // namespace tetra
